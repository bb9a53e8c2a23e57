"""The one training loop behind `pretrain`, `warmstart`, `distill`, `sft` and `bench`.

``train(objective, model, dataset, args, out_dir)`` optimises the trainable parameters of
``model`` (those with ``requires_grad``) on ``objective.loss(batch, model=wrapped)`` with
accelerate, so the same code runs on one CPU, under ``accelerate launch`` with several
processes (DDP, gloo on CPU) and with FSDP2 on GPUs or CPUs (:mod:`lrc.training.sharding`: what is
sharded, the tied factor, unsharded again before ``train`` returns).

The code reads in the order of a run: :func:`setup` (accelerator, precision, batch split,
optimizer, schedule, teacher placement), the checkpoint lock and :func:`resume`, :func:`fit`
calling :func:`train_step` once per optimiser step and :class:`lrc.training.steplog.StepLog` for the
metrics window and the guards (:mod:`lrc.training.guards`), then :func:`finish` (summary, DONE marker).

Decisions, and why:

- **Tokens are the unit.** ``steps = tokens // (batch_size * seq_len)``; ``batch_size`` is
  sequences per optimiser step *over all processes*, ``micro_batch_size`` sequences per
  forward on one process, and the gradient is accumulated over
  ``batch_size / (micro_batch_size * num_processes)`` micro-batches. ``tokens = 0`` is
  valid: no step is taken, outputs are still written (a zero-token warm start). A budget
  above 0 that buys no step is refused before any work (:func:`lrc.training.guards.steps_of_budget`).
- **Data order is a pure function of (seed, step).** Global sequence ``n`` is row
  ``perm_e[n % N]`` of the dataset, ``perm_e`` a seeded permutation per epoch ``e``. Step
  ``s`` takes global sequences ``[s*B, (s+1)*B)``, cut into micro-batches of
  ``micro_batch_size``; micro-batch ``j`` runs on process ``j % P``. So a resumed run reads
  exactly the batches an uninterrupted one would (no iterator state to save), and 1 and 2
  processes see the same micro-batches. The data loader is therefore *not* passed through
  ``accelerator.prepare`` (that would re-shard it); everything else is.
- **The loss of a step** is the mean over its micro-batches of the objective's loss (each
  micro-batch loss is the objective's own normalisation, e.g. a mean over counted tokens).
  It does not depend on the number of processes, since the micro-batches do not.
- **An LRC student's weights are built once per step** when it accumulates gradients on the CPU, or
  anywhere with ``--weight-build step`` (:mod:`lrc.training.weight_build`): the micro-batches share
  them and their gradients go through the factor products once, after the last one (under DDP the
  gradients are then averaged by hand).
- **Checkpoints** (see :mod:`lrc.training.checkpoint`) hold accelerate's state (optimiser,
  scheduler, RNG of every process) plus the trainable parameters only; the frozen parts
  are rebuilt by the command that restarts. They live in ``ckpt_dir`` (default
  ``<out_dir>.ckpt``, a sibling), outside the output Snakemake deletes on failure. The two
  newest are kept and verified before use (a damaged one is set aside with a warning and
  the previous one used); once finished, ``keep_checkpoints`` says what stays (default: the
  final weights, no optimiser state: :func:`lrc.training.checkpoint.retain_finished`). The main
  process locks the directory for the run; a checkpoint of other settings is not resumed.
- **The checkpoint directory is the only one written.** ``metrics.jsonl`` lives there;
  ``train`` returns its path in the summary, and each command copies it once into its own
  atomic output directory, with the model it writes.
- **Guards without host syncs.** Every step records, on the device, whether the loss, any
  loss term or the gradient norm is non-finite and the first step where that happened. The
  flag is read at log steps and before every checkpoint, so a poisoned run stops with an
  ``LRCError`` naming the step and the term, and never writes a checkpoint after it. A
  diverging loss (``divergence_*``: far above the run's best level for many steps, still
  finite) stops the same way (:class:`lrc.training.guards.DivergenceGuard`); a checkpoint due
  while the loss is above that threshold waits until it is back under it.
- **Precision:** ``auto`` is fp32 on CPU and bf16 mixed precision (autocast, fp32 master
  weights) on GPU. The frozen teacher of a distillation objective (``objective.teacher``)
  is moved to the device and cast to bf16 under bf16 mixed precision; freezing it (eval,
  no gradients) is the objective's job, done once (:func:`lrc.io.hf.freeze_teacher`). It is
  never wrapped by DDP/FSDP: it has no gradients, so each process holds a full replica
  (documented in ``config/accelerate/*.yaml``).
- **CPU threads** (``--threads``) are set once, by the command, before it loads anything.
- AdamW over trainable parameters only, decay on matrices (``ndim >= 2``). Weights with a
  coordinate map (`core`/`randcomp` MLP weights) and, with ``shard_optimizer``, every state
  are handled by :class:`lrc.training.optim.CoordinateAdamW`. Schedules: linear or cosine decay to 0,
  or constant, after a linear warm-up over ``warmup`` (a fraction of the steps).
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, set_seed
from torch.utils.data import DataLoader, Dataset

from lrc.errors import LRCError
from lrc.io.hf import cast_weights, trainable_parameters
from lrc.training import checkpoint as ckpt
from lrc.training import recompute, sharding, trackers, weight_build
from lrc.training.args import TrainArgs  # also the name's old import path (tests, scripts)
from lrc.training.guards import DivergenceGuard, steps_of_budget
from lrc.training.optim import CoordinateAdamW, coordinate_maps
from lrc.training.steplog import StepLog

# Settings that change the trajectory (activation_checkpointing does not): a checkpoint made with other values is not
# resumed.
_FINGERPRINT_FIELDS = ("tokens", "batch_size", "lr", "schedule", "warmup", "weight_decay", "betas", "eps", "grad_clip",
                       "seed", "precision")


class Objective(Protocol):
    def loss(self, batch: dict[str, torch.Tensor],
             model: torch.nn.Module | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


def default_ckpt_dir(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    return out.with_name(out.name + ".ckpt")


def lr_factor(step: int, steps: int, warmup_steps: int, schedule: str) -> float:
    """Multiplier of the peak lr for the update of step ``step`` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


class StepBatches(torch.utils.data.Sampler):
    """Index lists of this process's micro-batches, from ``start_step`` to ``steps`` (see module doc)."""

    def __init__(self, n_rows: int, *, seed: int, batch_size: int, micro_batch_size: int, num_processes: int,
                 process_index: int, start_step: int, steps: int):
        self.n_rows, self.seed = n_rows, seed
        self.batch_size, self.micro = batch_size, micro_batch_size
        self.P, self.p = num_processes, process_index
        self.start_step, self.steps = start_step, steps
        self.accum = batch_size // (micro_batch_size * num_processes)
        self._epoch, self._perm = -1, None

    def _row(self, n: int) -> int:
        epoch = n // self.n_rows
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm, self._epoch = torch.randperm(self.n_rows, generator=g).tolist(), epoch
        return self._perm[n % self.n_rows]

    def __len__(self) -> int:
        return (self.steps - self.start_step) * self.accum

    def __iter__(self):
        for step in range(self.start_step, self.steps):
            for k in range(self.accum):
                j = k * self.P + self.p
                first = step * self.batch_size + j * self.micro
                yield [self._row(n) for n in range(first, first + self.micro)]


def peak_memory_mib(device: torch.device) -> float:
    """CUDA max allocated on GPU; on CPU the process's max resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _fingerprint(args: TrainArgs, seq_len: int, n_rows: int) -> dict[str, Any]:
    return {name: getattr(args, name) for name in _FINGERPRINT_FIELDS} | {"seq_len": seq_len, "rows": n_rows}


# ---- setup --------------------------------------------------------------------------------


@dataclass
class Run:
    """What :func:`setup` builds and the other parts of a run share."""

    args: TrainArgs
    accelerator: Any
    wrapped: torch.nn.Module  # what the objective calls (DDP/FSDP-wrapped)
    bare: torch.nn.Module  # the same model unwrapped (what checkpoints read and write)
    optimizer: Any
    scheduler: Any
    fsdp: bool
    mixed: str
    steps: int
    accum: int
    seq_len: int
    n_rows: int
    ckpt_dir: Path
    fingerprint: dict[str, Any]
    build_once: bool = False  # the parametrised weights built once per step (lrc.training.weight_build)
    rows_share: float | None = None  # ... and the share of their rows this process built (DDP divides them)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def tokens_per_step(self) -> int:
        return self.args.batch_size * self.seq_len


def _accelerator(args: TrainArgs) -> tuple[Accelerator, str]:
    mixed = "bf16" if args.precision == "bf16" or (args.precision == "auto" and torch.cuda.is_available()) else "no"
    # broadcast_buffers=False: an LRC student's buffers (core's bases) are identical on every
    # rank; DDP would otherwise re-send them at every forward.
    # gradient_as_bucket_view: gradients are views into DDP's all-reduce buckets (no copy).
    ddp = DistributedDataParallelKwargs(broadcast_buffers=False, gradient_as_bucket_view=True)
    accelerator = Accelerator(mixed_precision=mixed, step_scheduler_with_optimizer=False, kwargs_handlers=[ddp])
    sharding.enable_cpu_fsdp(accelerator)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        raise LRCError(f"launched with WORLD_SIZE={launched} but accelerate sees {accelerator.num_processes} "
                       "process(es); on a machine without GPUs set ACCELERATE_USE_CPU=1 "
                       "(see config/accelerate/cpu2.yaml)")
    return accelerator, mixed


def optimizer_and_schedule(model: torch.nn.Module, args: TrainArgs, steps: int):
    """AdamW over the trainable parameters (decay on matrices only) and its lr schedule."""
    params = trainable_parameters(model)
    if not params:
        raise LRCError("the model has no trainable parameters (none with requires_grad=True)")
    decay = [p for _, p in params if p.ndim >= 2]
    no_decay = [p for _, p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    maps = coordinate_maps(model)  # weights the model asks to have optimised in other coordinates
    if maps or args.shard_optimizer:
        optimizer = CoordinateAdamW(groups, coordinates=maps, shard_states=args.shard_optimizer, lr=args.lr,
                                    betas=tuple(args.betas), eps=args.eps)
    else:
        optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=tuple(args.betas), eps=args.eps)
    warmup_steps = math.ceil(args.warmup * steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps, warmup_steps, args.schedule))
    return optimizer, scheduler


def place_teacher(objective: Objective, accelerator: Accelerator, mixed: str) -> None:
    """Move the objective's frozen teacher (replicated, never wrapped: no gradients) to the device; under GPU
    mixed precision its weights go bf16, its buffers (RoPE's inv_freq) stay fp32 (:func:`lrc.io.hf.cast_weights`)."""
    teacher = getattr(objective, "teacher", None)
    if isinstance(teacher, torch.nn.Module):
        if mixed == "bf16" and accelerator.device.type == "cuda":
            cast_weights(teacher, torch.bfloat16)  # first: the fp32 teacher never reaches the GPU
        teacher.to(accelerator.device)


def setup(objective: Objective, model: torch.nn.Module, dataset: Dataset, args: TrainArgs, ckpt_dir: Path) -> Run:
    """Accelerator, precision, batch split, optimizer, schedule, teacher placement, prepare."""
    n_rows = len(dataset)
    if n_rows == 0:
        raise LRCError("the training data set is empty")
    seq_len = int(dataset[0]["input_ids"].shape[-1])
    steps = steps_of_budget(args.tokens, args.batch_size, seq_len)  # first: a budget that buys no step is refused
    accelerator, mixed = _accelerator(args)
    P = accelerator.num_processes
    if args.batch_size % (args.micro_batch_size * P):
        raise LRCError(f"--batch-size {args.batch_size} must be a multiple of --micro-batch-size "
                       f"{args.micro_batch_size} times the number of processes {P}")
    if accelerator.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(accelerator.device)
    set_seed(args.seed)
    fsdp = accelerator.distributed_type.name == "FSDP"
    accum = args.batch_size // (args.micro_batch_size * P)
    # A refused choice is named before any work; a plain model has nothing to build.
    parametrised = weight_build.parametrised(model)
    build_once = weight_build.builds_once(args.weight_build, accum, fsdp) and parametrised
    if args.divide_weight_build and parametrised and not build_once:
        raise LRCError(weight_build.not_divided(args.weight_build, accum, fsdp))
    if fsdp and args.shard_optimizer:
        raise LRCError("--shard-optimizer (train.shard_optimizer) is for DDP; FSDP2 shards the optimiser states itself")
    # FSDP2 and a tied student: one group for the shared factor, before the optimiser holds it.
    tied = accelerator.is_fsdp2 and sharding.before_prepare(model, accelerator)
    if args.activation_checkpointing:
        recompute.enable(model)  # before prepare: FSDP2's layer hooks then run outside the recompute too
    optimizer, scheduler = optimizer_and_schedule(model, args, steps)
    place_teacher(objective, accelerator, mixed)
    model.train()
    with sharding.embeddings_hidden(model, tied):
        wrapped, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if not fsdp:
        # accelerate would copy the whole state dict (frozen teacher factors included) into
        # every checkpoint; save the trainable parameters ourselves instead.
        accelerator.register_save_state_pre_hook(lambda models, weights, output_dir: weights.clear())
        accelerator.register_load_state_pre_hook(lambda models, input_dir: models.clear())
    return Run(args=args, accelerator=accelerator, wrapped=wrapped, bare=accelerator.unwrap_model(wrapped),
               optimizer=optimizer, scheduler=scheduler, fsdp=fsdp, mixed=mixed, steps=steps,
               accum=accum, seq_len=seq_len, n_rows=n_rows, ckpt_dir=ckpt_dir,
               fingerprint=_fingerprint(args, seq_len, n_rows), build_once=build_once)


# ---- resume ----------------------------------------------------------------------


def resume(run: Run) -> tuple[int, str | None, dict[str, Any] | None]:
    """Load the newest good checkpoint: (start step, its path, the DONE marker if finished there)."""
    latest = ckpt.load_latest(run.accelerator, run.bare, run.optimizer, run.ckpt_dir, run.fingerprint, run.fsdp)
    if latest is None:
        return 0, None, None
    start_step = int(ckpt.read_state(latest)["step"])
    done = ckpt.read_done(run.ckpt_dir)
    finished = done if (done is not None and int(done["step"]) == start_step == run.steps) else None
    if finished is not None and run.accelerator.is_main_process:  # a rerun may ask to keep less
        ckpt.retain_finished(run.ckpt_dir, run.args.keep_checkpoints, sharded=run.fsdp)
    return start_step, str(latest), finished


# ---- the training step --------------------------------------------------------------------


def train_step(run: Run, objective: Objective, batches, trainable: list[torch.nn.Parameter],
               time_optimizer=contextlib.nullcontext) -> tuple[torch.Tensor, list[str], float]:
    """One optimiser step: forward/backward over the micro-batches, clip, step, schedule.

    Returns ``[loss, terms..., grad_norm]`` on the device (no host sync), the term names
    and the learning rate the update used; ``time_optimizer`` wraps the optimiser's step.
    """
    acc, accum = run.accelerator, run.accum
    step_sum, names = None, None
    divided_over = acc.num_processes if run.args.divide_weight_build else 1
    with (weight_build.built_once(run.bare, acc.autocast, acc.process_index, divided_over) if run.build_once
          else contextlib.nullcontext()) as weights:
        for k in range(accum):
            batch = {key: v.to(run.device, non_blocking=True) for key, v in next(batches).items()}
            # DDP: only the last micro-batch of a step all-reduces the gradients (none does when the weights
            # are built once: their factors have gradients only after the loop).
            sync = k == accum - 1 and not run.build_once
            with (contextlib.nullcontext() if sync else acc.no_sync(run.wrapped)), recompute.micro_batch(run.bare):
                with acc.autocast():
                    total, terms = objective.loss(batch, model=run.wrapped)
                acc.backward(total / accum)
            names = names or list(terms)
            vec = torch.stack([total.detach().float()] + [terms[n].detach().float().reshape(()) for n in names])
            step_sum = vec if step_sum is None else step_sum + vec
        if weights is not None:
            run.rows_share = weights.rows_share
            weights.backward()
            weight_build.average_gradients(trainable, acc.num_processes)
    clip = run.args.grad_clip if run.args.grad_clip > 0 else float("inf")
    inner = getattr(run.optimizer, "optimizer", run.optimizer)  # (accelerate wraps it)
    if getattr(inner, "clips_in_coordinates", False):  # a map that is not orthogonal (core)
        acc.unscale_gradients()
        grad_norm = inner.clip_grad_norm_(trainable, clip)
    else:
        grad_norm = sharding.full(acc.clip_grad_norm_(trainable, clip))
    with time_optimizer():
        run.optimizer.step()
    lr_used = run.scheduler.get_last_lr()[0]  # a Python float: no sync
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return torch.cat([step_sum / accum, grad_norm.detach().float().reshape(1).to(run.device)]), names, lr_used


# ---- the run ------------------------------------------------------------------------------


def fit(run: Run, objective: Objective, dataset: Dataset, log: StepLog, start_step: int) -> None:
    """Steps ``start_step`` to the end, with log steps, guards and checkpoints."""
    acc, args = run.accelerator, run.args
    sampler = StepBatches(run.n_rows, seed=args.seed, batch_size=args.batch_size,
                          micro_batch_size=args.micro_batch_size, num_processes=acc.num_processes,
                          process_index=acc.process_index, start_step=start_step, steps=run.steps)
    batches = iter(DataLoader(dataset, batch_sampler=sampler, num_workers=0, pin_memory=run.device.type == "cuda"))
    # After prepare: under FSDP2 the optimised tensors are the sharded ones.
    trainable = [p for p in run.wrapped.parameters() if p.requires_grad]
    waiting = False  # a checkpoint put off while the loss is far above its best level (the divergence guard)
    for step in range(start_step, run.steps):
        step_vec, names, lr_used = train_step(run, objective, batches, trainable, log.timing_optimizer)
        log.record(step, step_vec, names)
        done_step = step + 1
        is_log = done_step % args.log_every == 0 or done_step == run.steps
        is_ckpt = waiting or done_step == run.steps or bool(args.checkpoint_every
                                                            and done_step % args.checkpoint_every == 0)
        if is_log or is_ckpt:
            log.raise_if_bad()  # before any checkpoint: a poisoned or diverged state is never saved
        if is_log:
            log.write(done_step, lr_used)
        waiting = is_ckpt and log.rising and done_step < run.steps
        if is_ckpt and not waiting:
            ckpt.save_checkpoint(acc, run.bare, run.ckpt_dir, done_step, run.fingerprint, run.fsdp)


def finish(run: Run, log: StepLog, start_step: int, resumed_from: str | None) -> dict[str, Any]:
    """The summary, the final state of a zero-step run, the DONE marker."""
    acc = run.accelerator
    log.close()
    wall = time.perf_counter() - log.t_start
    trained = run.steps - start_step
    summary = {
        "steps": run.steps, "tokens": run.steps * run.tokens_per_step, "seq_len": run.seq_len,
        "batch_size": run.args.batch_size, "num_processes": acc.num_processes, "grad_accumulation": run.accum,
        "final": log.last, "tokens_per_s": trained * run.tokens_per_step / wall if trained > 0 else None,
        "peak_memory_mib": peak_memory_mib(run.device), "mixed_precision": run.mixed, "device": str(run.device),
        "weight_build": "step" if run.build_once else "micro_batch", "weight_rows_share": run.rows_share,
    }
    if (share := getattr(getattr(run.optimizer, "optimizer", run.optimizer), "coordinate_share", None)) is not None:
        summary["optimizer_coordinates"] = share  # basis changes in the optimiser step, per process
    if run.steps == 0 and resumed_from is None:
        # Nothing trained: still leave a final state, so a rerun finds the job done.
        ckpt.save_checkpoint(acc, run.bare, run.ckpt_dir, 0, run.fingerprint, run.fsdp)
    if acc.is_main_process:
        ckpt.write_done(run.ckpt_dir, run.steps, summary)
        ckpt.retain_finished(run.ckpt_dir, run.args.keep_checkpoints, sharded=run.fsdp)
    acc.wait_for_everyone()
    done_here = "" if start_step == 0 else f" ({trained} of them here, resumed at step {start_step})"
    acc.print(f"trained {summary['tokens']:,} tokens in {run.steps} steps{done_here}; peak memory "
              f"{summary['peak_memory_mib']:.0f} MiB")
    return summary


def train(objective: Objective, model: torch.nn.Module, dataset: Dataset, args: TrainArgs, out_dir: str | Path,
          hook: Any = None) -> dict[str, Any]:
    """Train ``model``'s trainable parameters on ``objective``; resume from the checkpoint directory.

    ``args.ckpt_dir`` (default ``<out_dir>.ckpt``) is the only directory written; nothing is
    written into ``out_dir``. Returns a summary (steps, tokens, final loss terms, throughput,
    peak memory, ``resumed_from``, ``already_done`` and ``metrics``, the path of the run's
    metrics.jsonl for the command to copy into its output). On return ``model`` holds the
    final weights (on its original device class, possibly the GPU). ``hook``: see :class:`lrc.training.steplog.StepLog`.
    """
    ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir is not None else default_ckpt_dir(out_dir)
    run = setup(objective, model, dataset, args, ckpt_dir)
    held, log = ckpt.lock_run(run.accelerator, ckpt_dir), None
    try:
        start_step, resumed_from, done = resume(run)
        extra = {"resumed_from": resumed_from, "metrics": str(ckpt_dir / ckpt.METRICS_FILE)}
        if done is not None:
            run.accelerator.print(f"training already finished ({ckpt_dir}); reusing its final state")
            summary = done["summary"] | extra | {"already_done": True}
        else:
            if resumed_from is not None:
                run.accelerator.print(f"resuming from {resumed_from}: step {start_step} of {run.steps}")
            divergence = DivergenceGuard(factor=args.divergence_factor, steps=args.divergence_steps,
                                         warmup=args.divergence_warmup, device=run.device)
            log = StepLog(run.accelerator, ckpt_dir, steps=run.steps, start_step=start_step,
                          tokens_per_step=run.tokens_per_step, trackers=trackers.resolve(args.trackers),
                          progress=args.progress, hook=hook, divergence=divergence, settings=vars(args))
            fit(run, objective, dataset, log, start_step)
            summary = finish(run, log, start_step, resumed_from) | extra | {"already_done": False}
        if run.accelerator.is_fsdp2:
            sharding.unshard(run.wrapped)  # every rank: the command gets a plain model with the full weights
        return summary
    finally:
        if log is not None:
            log.close()
        if held is not None:
            held.release()
        recompute.disable(model)  # the model leaves as it came


