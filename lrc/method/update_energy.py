"""Update energy inside the teacher's subspace during `lrc distill` (``--update-energy-every N``).

Why: in the tiny world dense beats core by far, unlike the paper (METHOD.md §4, the AdamW
coordinates). Where each arm puts its update says why: an update inside the teacher's
column space (gate/up) or row space (down) is one plain LRC could have made too.

Every N optimiser steps and at the final step, :class:`UpdateEnergyLog` writes one row
per layer and MLP weight to ``update_energy.csv``, columns :data:`COLUMNS`:

* ``energy`` = ``‖W(t) − W(0)‖²_F`` of the *deployed* weight (the module's ``weight``,
  through any parametrisation: what `lrc merge` materialises, so every arm and every
  ``--core-impl`` is covered), W(0) the deployed weight when this distillation starts
  (after the warm start and the arm's re-parameterisation);
* ``inside`` = ``‖U Uᵀ (W(t) − W(0))‖²_F`` with U the teacher bases `lrc audit`'s occupancy
  uses (:func:`lrc.method.reachability.mlp_bases`), column-oriented (down is transposed);
* ``share_inside`` = inside / energy (0 where energy is 0, as the audit's occupancy).

slice and confined move only inside (share 1 up to float rounding); dense, core and
randcomp may leave it. Cost per row set: two float64 products ``[H, d_ff]·[d_ff, r]`` per
matrix on the weights' device, and a float32 copy of every W(0) on the CPU (the deployed
MLP weights once more).

The file lives in the checkpoint directory, like ``metrics.jsonl``: the loop calls the log
(:class:`lrc.training.steplog.StepLog`'s ``hook``) before each step's checkpoint, a resumed run
first drops the rows after the step it resumes from, and the command copies the file into
its output once. The rows a resumed run keeps are checked against the schedule, so a
checkpoint made with another N (or without the option) is an error, not a silently
different file. The main process reads and writes it.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import torch

from lrc.method.reachability import deployed_column_oriented, mlp_bases
from lrc.errors import LRCError
from lrc.io.atomic import write_text_atomic
from lrc.io.provenance import is_main_process
from lrc.method.spectral import compute_bases
from lrc.names import MLP_KINDS

UPDATE_ENERGY_FILE = "update_energy.csv"
COLUMNS = ("step", "tokens", "layer", "weight", "energy", "inside", "share_inside")


def logged_steps(every: int, upto: int, steps: int) -> list[int]:
    """The steps a run of ``steps`` steps logs, up to ``upto``: multiples of ``every`` and the last."""
    out = list(range(every, upto + 1, every))
    if 0 < steps <= upto and steps not in out:
        out.append(steps)
    return out


@torch.no_grad()
def energy_rows(model, start: dict, basis) -> list[dict]:
    """One row per layer and MLP weight: energy of ``W − W(0)`` and of its part inside U."""
    rows = []
    for (i, kind), w0 in start.items():
        w = deployed_column_oriented(model, i, kind)
        d = w.double() - w0.to(w.device, torch.float64)
        u = basis(i, kind).to(w.device, torch.float64)
        energy = d.pow(2).sum().item()
        inside = (u.T @ d).pow(2).sum().item()  # = ‖U Uᵀ d‖² for orthonormal U
        rows.append({"layer": i, "weight": f"{kind}_proj", "energy": energy, "inside": inside,
                     "share_inside": inside / energy if energy else 0.0})
    return rows


def _read_steps(path: Path, upto: int) -> tuple[str, list[int]]:
    """The file's rows up to step ``upto`` (a row torn by a kill is dropped) and their steps."""
    keep, steps = [], []
    if path.is_file():
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                try:
                    step = int(row["step"])
                    if step <= upto and all(row.get(c) not in (None, "") for c in COLUMNS):
                        keep.append(row)
                        steps.append(step)
                except (TypeError, ValueError):
                    pass
    text = ",".join(COLUMNS) + "\n" + "".join(",".join(str(r[c]) for c in COLUMNS) + "\n" for r in keep)
    return text, steps


class UpdateEnergyLog:
    """The loop's hook (:class:`lrc.training.steplog.StepLog`) writing ``update_energy.csv``.

    Built before training, when the student's weights are W(0); ``teacher``/``bases`` give
    the subspaces (the bases are computed from the teacher when None).
    """

    def __init__(self, student, teacher, bases, every: int):
        if every < 1:
            raise LRCError(f"--update-energy-every must be >= 1 to log (0 turns it off), got {every}")
        self.student, self.every = student, every
        self.basis, self.start = None, {}
        if is_main_process():  # only the writer (rank 0) holds the bases and W(0)
            self.basis = mlp_bases(teacher, bases if bases is not None else compute_bases(teacher))
            # float32 W(0) on the CPU: exact (the deployed dtype), and off the accelerator.
            self.start = {(i, kind): deployed_column_oriented(student, i, kind).float().cpu().clone()
                          for i in range(teacher.config.num_hidden_layers) for kind in MLP_KINDS}
        self.path: Path | None = None
        self.steps = self.tokens_per_step = 0

    def begin(self, ckpt_dir, *, start_step: int, steps: int, tokens_per_step: int) -> None:
        if any(type(p).__name__ == "DTensor" for p in self.student.parameters()):
            raise LRCError("--update-energy-every needs the full weights on each process: not supported under FSDP "
                           "(use DDP or one process)")
        self.path, self.steps, self.tokens_per_step = Path(ckpt_dir) / UPDATE_ENERGY_FILE, steps, tokens_per_step
        if is_main_process():  # the one process that reads and writes the file
            text, found = _read_steps(self.path, start_step)
            self._check(found, start_step)
            write_text_atomic(self.path, text)

    def _check(self, found: list[int], upto: int) -> None:
        expected = logged_steps(self.every, upto, self.steps)
        if sorted(set(found)) != expected or len(found) != len(expected) * len(self.start):
            raise LRCError(f"{self.path} holds the rows of steps {sorted(set(found))[:8]}..., not those of "
                           f"--update-energy-every {self.every} up to step {upto}: the checkpoint was made with other "
                           f"settings; remove {self.path.parent} to retrain")

    def after_step(self, done_step: int) -> None:
        if done_step % self.every and done_step != self.steps:
            return
        if not is_main_process():
            return
        rows = energy_rows(self.student, self.start, self.basis)
        with self.path.open("a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            for row in rows:
                writer.writerow({"step": done_step, "tokens": done_step * self.tokens_per_step, **row})

    def copy_into(self, ckpt_dir, out_dir, *, steps: int) -> None:
        """Copy the finished run's file into ``out_dir`` (checked complete: also after a rerun of a done run)."""
        self.path, self.steps = Path(ckpt_dir) / UPDATE_ENERGY_FILE, steps
        if not self.path.is_file():
            raise LRCError(f"{self.path} is missing: the run was trained without --update-energy-every; remove "
                           f"{self.path.parent} to retrain")
        self._check(_read_steps(self.path, steps)[1], steps)
        shutil.copyfile(self.path, Path(out_dir) / UPDATE_ENERGY_FILE)
