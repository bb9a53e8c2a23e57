"""`lrc warmstart` and `lrc distill`: LRC distillation of a student from a frozen teacher.

* ``lrc warmstart``: build the plain-LRC (`slice`) student of width ``--student-hidden``
  (``--init normal|spectral|activations``) and train it with the recipe (default ``lrc``) for
  ``--tokens`` tokens, which may be 0. Writes an LRC state directory.
* ``lrc distill``: load the warm start, re-parameterise its MLP as ``--arm`` (at step 0 the
  function is unchanged), train, write an LRC state directory. The ``kl`` recipe of
  METHOD.md starts from a random init instead: omit ``--warmstart`` and give
  ``--student-hidden`` (and ``--init``).

Both run on the loop of :mod:`lrc.training.loop` with :class:`lrc.method.clone.CloneObjective`, so they
resume after a kill and run under ``accelerate launch``. ``--seed`` seeds the data order,
the random complement of ``randcomp`` and (without a warm start) the factor init.
``--core-impl`` (core/randcomp) chooses where the basis change runs (:func:`lrc.method.reach.apply_arm`):
``optimizer`` (default; dense forward, AdamW in the arm's coordinates, :mod:`lrc.training.optim`) or
``parametrized`` (the reference). A restart with the other one does not resume the
checkpoints (their trainable tensors differ).
``--update-energy-every N`` writes ``update_energy.csv`` (:mod:`lrc.method.update_energy`): how much
of each MLP weight's change lies inside the teacher's subspace; it does not change training.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

import torch

from lrc.errors import LRCError
from lrc.io.atomic import atomic_dir
from lrc.io.hf import load_teacher, tokenizer_if_any
from lrc.io.provenance import is_main_process, write_settings
from lrc.io.tokens import check_vocab, open_token_data
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.method.reach import apply_arm, arm_of
from lrc.method.spectral import compute_bases, load_bases
from lrc.method.student import build_student, load_lrc_state, save_lrc_state
from lrc.method.update_energy import UpdateEnergyLog
from lrc.names import ARMS
from lrc.options import check_choice, parse_args
from lrc.training.args import TrainArgs, train_args_from
from lrc.training.loop import train
from lrc.training.outputs import copy_metrics


@dataclass(kw_only=True)
class _DistillCommon(RecipeArgs, TrainArgs):
    teacher: Path = field(metadata={"help": "teacher HF checkpoint directory"})
    data: Path = field(metadata={"help": "token directory (or a `lrc tokenize` output with train/)"})
    out: Path = field(metadata={"help": "output LRC state directory", "output": "dir"})
    bases: Path | None = field(default=None, metadata={
        "help": "teacher bases from `lrc svd` (spectral init, core/confined/randcomp; computed if omitted)"})
    init: Literal["normal", "spectral", "activations"] = field(default="normal", metadata={
        "help": "factor init of a new student: normal (the reference's N(0, init-std)); spectral (the teacher with "
                "its residual stream projected onto the top-r right singular vectors of its embedding); activations "
                "(projected onto the top-r principal directions of the teacher's RMS-normalised residual stream on the "
                "first --init-tokens tokens of --data, in file order)"})
    init_tokens: int = field(default=8192, metadata={
        "help": "calibration tokens of the activations init (whole rows from the start of --data)"})
    init_std: float = field(default=0.02, metadata={"help": "std of the normal factor init"})
    norm_eps: float | None = field(default=None, metadata={
        "help": "RMSNorm eps trained and deployed (default: the teacher's)"})
    allow_pickle: bool = field(default=False, metadata={
        "help": "accept a teacher stored as pickled weights (pytorch_model.bin; can run code when loaded)"})

    def __post_init__(self) -> None:
        TrainArgs.__post_init__(self)
        RecipeArgs.__post_init__(self)
        check_choice("--init", self.init, ("normal", "spectral", "activations"))
        if self.init_tokens < 1:
            raise LRCError(f"--init-tokens must be positive, got {self.init_tokens}")


@dataclass(kw_only=True)
class WarmstartArgs(_DistillCommon):
    """Plain LRC warm start: the slice student trained with the recipe (tokens may be 0)."""

    student_hidden: int = field(metadata={"help": "student hidden size r"})


@dataclass(kw_only=True)
class DistillArgs(_DistillCommon):
    """Distill one arm from the warm start (or, with --student-hidden and no --warmstart, from a random init)."""

    arm: str = field(metadata={"help": ", ".join(ARMS)})
    warmstart: Path | None = field(default=None, metadata={"help": "LRC state directory of the warm start"})
    student_hidden: int | None = field(default=None, metadata={
        "help": "student hidden size r, to start from a fresh init (no --warmstart)"})
    core_impl: Literal["optimizer", "parametrized"] = field(default="optimizer", metadata={
        "help": "core/coreortho/randcomp: the basis change in the optimiser step, once per step (optimizer), or a "
                "parametrisation rebuilt in every forward (parametrized, the reference); same trajectory"})
    update_energy_every: int = field(default=0, metadata={
        "help": "every N optimiser steps and at the last, write update_energy.csv: per layer and MLP weight the "
                "energy of the deployed weight's change since the start and its share inside the teacher's subspace "
                "(lrc.method.update_energy; 0: off)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        # Checked here, not in main, so the workflow's config check sees it before any job runs.
        check_choice("--arm", self.arm, ARMS)
        if (self.warmstart is None) == (self.student_hidden is None):
            raise LRCError("give exactly one of --warmstart (continue a warm start) and --student-hidden "
                           "(start from a fresh init)")
        if self.update_energy_every < 0:
            raise LRCError(f"--update-energy-every must be >= 0 (0: off), got {self.update_energy_every}")


def _recipe(args: RecipeArgs) -> RecipeArgs:
    return RecipeArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RecipeArgs)})


def _load(args: _DistillCommon):
    if args.threads:
        torch.set_num_threads(args.threads)
    teacher = load_teacher(args.teacher, allow_pickle=args.allow_pickle)
    bases = load_bases(args.bases, teacher) if args.bases is not None else None
    if args.init == "spectral" and bases is None:
        bases = compute_bases(teacher)
    dataset = open_token_data(args.data, tokenizer=tokenizer_if_any(args.teacher))
    check_vocab(dataset, teacher)
    return teacher, bases, dataset


def calibration_rows(dataset, tokens: int) -> torch.Tensor:
    """The first rows of ``dataset`` (file order) holding at least ``tokens`` tokens, ``[N, L]``."""
    rows = min(len(dataset), -(-tokens // dataset.seq_len))
    return torch.stack([torch.as_tensor(dataset[i]["input_ids"]) for i in range(rows)]).long()


def _new_student(args, teacher, bases, dataset):
    calibration = calibration_rows(dataset, args.init_tokens) if args.init == "activations" else None
    return build_student(teacher, args.student_hidden, init=args.init, init_std=args.init_std, bases=bases,
                         seed=args.seed, norm_eps=args.norm_eps, calibration=calibration)


def _train_and_save(command: str, args: _DistillCommon, teacher, student, dataset, hook=None, **meta) -> None:
    targs = train_args_from(args)
    objective = CloneObjective(teacher, student, _recipe(args), recompute_teacher=args.recompute_teacher)
    summary = train(objective, student, dataset, targs, args.out, hook=hook)
    objective.close()
    if not is_main_process():
        return
    with atomic_dir(args.out) as tmp:
        save_lrc_state(student, tmp, command=command, recipe=args.recipe, tokens=summary["tokens"],
                       teacher=str(args.teacher), **meta)
        copy_metrics(summary["metrics"], tmp)
        if hook is not None:
            hook.copy_into(Path(summary["metrics"]).parent, tmp, steps=summary["steps"])
        write_settings(tmp, command, args, training=summary)
    print(f"{command}: wrote {args.out}")


def main_warmstart(argv: Sequence[str] | None = None) -> int:
    args = parse_args(WarmstartArgs, argv, prog="lrc warmstart")
    teacher, bases, dataset = _load(args)
    student = _new_student(args, teacher, bases, dataset)
    _train_and_save("warmstart", args, teacher, student, dataset)
    return 0


def main_distill(argv: Sequence[str] | None = None) -> int:
    args = parse_args(DistillArgs, argv, prog="lrc distill")
    teacher, bases, dataset = _load(args)
    if args.warmstart is not None:
        student = load_lrc_state(args.warmstart, teacher, bases)
        if arm_of(student) != "slice":
            raise LRCError(f"--warmstart {args.warmstart} holds a {arm_of(student)!r} student; "
                           "a warm start is a slice student")
    else:
        student = _new_student(args, teacher, bases, dataset)
    apply_arm(student, teacher, args.arm, bases=bases, seed=args.seed, core_impl=args.core_impl)
    # W(0): now
    hook = UpdateEnergyLog(student, teacher, bases, args.update_energy_every) if args.update_energy_every else None
    # Not read again here (the arm's maps hold what they use, the update-energy log its U):
    # dropped, so that a process keeps only the bases of the matrices its optimiser rotates.
    if bases is not None:
        bases.drop_reflector_cache()
    del bases
    _train_and_save("distill", args, teacher, student, dataset, hook=hook, arm=args.arm,
                    warmstart=str(args.warmstart) if args.warmstart else None)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return main_distill(argv)


if __name__ == "__main__":
    raise SystemExit(main())
