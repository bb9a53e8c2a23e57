"""The one training loop behind `pretrain`, `warmstart`, `distill`, `sft` and `bench`.

``train(objective, model, dataset, args, out_dir)`` optimises the trainable parameters of
``model`` (those with ``requires_grad``) on ``objective.loss(batch, model=wrapped)`` with
accelerate, so the same code runs on one CPU, under ``accelerate launch`` with several
processes (DDP, gloo on CPU) and with FSDP on GPUs.

Decisions, and why:

- **Tokens are the unit.** ``steps = tokens // (batch_size * seq_len)``; ``batch_size`` is
  sequences per optimiser step *over all processes*, ``micro_batch_size`` sequences per
  forward on one process, and the gradient is accumulated over
  ``batch_size / (micro_batch_size * num_processes)`` micro-batches. ``tokens = 0`` is
  valid: no step is taken, outputs are still written (a zero-token warm start).
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
- **Checkpoints** (see :mod:`lrc.checkpoint`) hold accelerate's state (optimiser,
  scheduler, RNG of every process) plus the trainable parameters only; the frozen parts
  are rebuilt by the command that restarts. They live in ``ckpt_dir`` (default
  ``<out_dir>.ckpt``, a sibling), outside the output Snakemake deletes on failure. A run
  refuses to resume a checkpoint made with different settings.
- **Guards without host syncs.** Every step records, on the device, whether the loss, any
  loss term or the gradient norm is non-finite and the first step where that happened. The
  flag is read at log steps and before every checkpoint, so a poisoned run stops with an
  ``LRCError`` naming the step and the term, and never writes a checkpoint after it.
- **Precision:** ``auto`` is fp32 on CPU and bf16 mixed precision (autocast, fp32 master
  weights) on GPU. The frozen teacher of a distillation objective (``objective.teacher``)
  is moved to the device, kept in eval mode, and cast to bf16 under bf16 mixed precision.
  It is never wrapped by DDP/FSDP: it has no gradients, so each process holds a full
  replica (documented in ``config/accelerate/*.yaml``).
- AdamW over trainable parameters only; weight decay applies to matrices (``ndim >= 2``),
  not to norm weights or biases. Schedules: linear or cosine decay to 0, or constant, each
  after a linear warm-up over ``warmup`` (a fraction of the steps).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import resource
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from torch.utils.data import DataLoader, Dataset

from lrc import checkpoint as ckpt
from lrc.atomic import atomic_file, write_json_atomic, write_text_atomic
from lrc.errors import LRCError
from lrc.hf import trainable_parameters
from lrc.options import check_choice

SCHEDULES = ("linear", "cosine", "constant")
PRECISIONS = ("auto", "fp32", "bf16")
# Settings that change the trajectory: a checkpoint made with other values is not resumed.
_FINGERPRINT_FIELDS = ("tokens", "batch_size", "lr", "schedule", "warmup", "weight_decay", "betas", "eps", "grad_clip", "seed", "precision")


@dataclass(kw_only=True)
class TrainArgs:
    """Options of the training loop (shared by every training command)."""

    tokens: int = field(default=0, metadata={"help": "token budget; steps = tokens // (batch_size * seq_len); 0 trains nothing"})
    batch_size: int = field(default=8, metadata={"help": "sequences per optimiser step, over all processes"})
    micro_batch_size: int = field(default=8, metadata={"help": "sequences per forward pass on one process (gradient accumulation fills the rest)"})
    lr: float = field(default=1e-4, metadata={"help": "peak learning rate"})
    schedule: Literal["linear", "cosine", "constant"] = field(default="linear", metadata={"help": "learning-rate decay after warm-up"})
    warmup: float = field(default=0.005, metadata={"help": "warm-up as a fraction of the steps"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay (matrices only)"})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata={"help": "AdamW betas"})
    eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    grad_clip: float = field(default=1.0, metadata={"help": "clip the global gradient norm to this (0: no clipping)"})
    seed: int = field(default=0, metadata={"help": "seed of the data order and of any randomness in training"})
    precision: Literal["auto", "fp32", "bf16"] = field(default="auto", metadata={"help": "auto: fp32 on CPU, bf16 mixed precision on GPU"})
    checkpoint_every: int = field(default=0, metadata={"help": "save a resumable checkpoint every N steps (0: only at the end)"})
    log_every: int = field(default=10, metadata={"help": "log metrics (and check for non-finite values) every N steps"})
    ckpt_dir: Path | None = field(default=None, metadata={"help": "checkpoint directory (default: <out>.ckpt next to the output)"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads per process (0: leave torch's default)"})
    tensorboard: bool = field(default=False, metadata={"help": "also log to TensorBoard under <ckpt_dir>/tb (needs the tensorboard package)"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        for name in ("tokens", "checkpoint_every", "threads"):
            if getattr(self, name) < 0:
                raise LRCError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        for name in ("batch_size", "micro_batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise LRCError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        check_choice("--schedule", self.schedule, SCHEDULES)
        check_choice("--precision", self.precision, PRECISIONS)
        if not 0.0 <= self.warmup < 1.0:
            raise LRCError(f"--warmup is a fraction of the steps in [0, 1), got {self.warmup}")
        if len(self.betas) != 2:
            raise LRCError(f"--betas takes two values, got {self.betas}")
        self.betas = [float(b) for b in self.betas]
        if self.ckpt_dir is not None:
            self.ckpt_dir = Path(self.ckpt_dir)


def train_args_from(args: Any) -> TrainArgs:
    """The TrainArgs part of a command's argument dataclass (which inherits TrainArgs)."""
    return TrainArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainArgs)})


class Objective(Protocol):
    def loss(self, batch: dict[str, torch.Tensor], model: torch.nn.Module | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


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

    def __init__(self, n_rows: int, *, seed: int, batch_size: int, micro_batch_size: int, num_processes: int, process_index: int, start_step: int, steps: int):
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


def train(objective: Objective, model: torch.nn.Module, dataset: Dataset, args: TrainArgs, out_dir: str | Path) -> dict[str, Any]:
    """Train ``model``'s trainable parameters on ``objective``; resume from ``args.ckpt_dir``.

    Returns a summary (steps, tokens, final loss terms, throughput, peak memory). On return
    ``model`` holds the final weights (on its original device class, possibly the GPU); the
    caller saves its own outputs. ``out_dir`` receives ``metrics.jsonl``.
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, set_seed

    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = Path(out_dir)
    ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir is not None else default_ckpt_dir(out_dir)

    n_rows = len(dataset)
    if n_rows == 0:
        raise LRCError("the training data set is empty")
    seq_len = int(dataset[0]["input_ids"].shape[-1])
    steps = args.tokens // (args.batch_size * seq_len)

    mixed = "no"
    if args.precision == "bf16" or (args.precision == "auto" and torch.cuda.is_available()):
        mixed = "bf16"
    # broadcast_buffers=False: an LRC student's buffers are the frozen teacher weights (and
    # bases), identical on every rank; DDP would otherwise re-send them at every forward.
    ddp = DistributedDataParallelKwargs(broadcast_buffers=False)
    accelerator = Accelerator(mixed_precision=mixed, step_scheduler_with_optimizer=False, kwargs_handlers=[ddp])
    P = accelerator.num_processes
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != P:
        raise LRCError(
            f"launched with WORLD_SIZE={launched} but accelerate sees {P} process(es); "
            "on a machine without GPUs set ACCELERATE_USE_CPU=1 (see config/accelerate/cpu2.yaml)"
        )
    if args.batch_size % (args.micro_batch_size * P):
        raise LRCError(
            f"--batch-size {args.batch_size} must be a multiple of --micro-batch-size {args.micro_batch_size} "
            f"times the number of processes {P}"
        )
    accum = args.batch_size // (args.micro_batch_size * P)
    if 0 < args.tokens < args.batch_size * seq_len:
        accelerator.print(f"warning: --tokens {args.tokens} is less than one step ({args.batch_size} x {seq_len} tokens); no step is taken")
    if accelerator.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(accelerator.device)
    set_seed(args.seed)
    fingerprint = _fingerprint(args, seq_len, n_rows)

    params = trainable_parameters(model)
    if not params:
        raise LRCError("the model has no trainable parameters (none with requires_grad=True)")
    decay = [p for _, p in params if p.ndim >= 2]
    no_decay = [p for _, p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=tuple(args.betas), eps=args.eps,
    )
    warmup_steps = math.ceil(args.warmup * steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps, warmup_steps, args.schedule))

    teacher = getattr(objective, "teacher", None)
    if isinstance(teacher, torch.nn.Module):
        # Replicated, unwrapped, frozen: it has no gradients to shard or synchronise.
        teacher.requires_grad_(False).eval()
        teacher.to(accelerator.device, dtype=torch.bfloat16 if (mixed == "bf16" and accelerator.device.type == "cuda") else None)
    model.train()
    wrapped, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    bare = accelerator.unwrap_model(wrapped)
    fsdp = accelerator.distributed_type.name == "FSDP"
    if not fsdp:
        # accelerate would copy the whole state dict (frozen teacher factors included) into
        # every checkpoint; save the trainable parameters ourselves instead.
        accelerator.register_save_state_pre_hook(lambda models, weights, output_dir: weights.clear())
        accelerator.register_load_state_pre_hook(lambda models, input_dir: models.clear())

    # ---- resume -------------------------------------------------------------------------
    start_step, resumed_from = 0, None
    done = ckpt.read_done(ckpt_dir)
    latest = ckpt.latest_checkpoint(ckpt_dir)
    if accelerator.is_main_process:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        ckpt.remove_partial(ckpt_dir)
    accelerator.wait_for_everyone()
    if latest is not None:
        state = ckpt.read_state(latest)
        if state["fingerprint"] != fingerprint:
            changed = sorted(k for k in fingerprint if state["fingerprint"].get(k) != fingerprint[k])
            raise LRCError(
                f"checkpoint {latest} was made with other settings ({', '.join(changed)} differ); "
                f"delete {ckpt_dir} to start afresh or use another --ckpt-dir"
            )
        accelerator.load_state(str(latest))
        if not fsdp:
            _load_trainable(bare, latest / ckpt.TRAINABLE_FILE)
        start_step, resumed_from = int(state["step"]), str(latest)
    if done is not None and latest is not None and int(done["step"]) == start_step == steps:
        accelerator.print(f"training already finished ({ckpt_dir}); reusing its final state")
        _copy_metrics(accelerator, ckpt_dir, out_dir)
        return done["summary"] | {"resumed_from": resumed_from, "already_done": True}

    # ---- metrics sinks (main process) ---------------------------------------------------
    metrics_path = ckpt_dir / ckpt.METRICS_FILE
    if accelerator.is_main_process:
        _truncate_metrics(metrics_path, start_step)
    tb = _tensorboard(ckpt_dir) if (args.tensorboard and accelerator.is_main_process) else None
    bar = None
    if args.progress and accelerator.is_main_process and steps > start_step:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps * args.batch_size * seq_len, initial=start_step * args.batch_size * seq_len, unit="tok", unit_scale=True, dynamic_ncols=True, file=sys.stderr)

    sampler = StepBatches(n_rows, seed=args.seed, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
                          num_processes=P, process_index=accelerator.process_index, start_step=start_step, steps=steps)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=0, pin_memory=accelerator.device.type == "cuda")
    batches = iter(loader)

    device = accelerator.device
    term_names: list[str] | None = None
    window_sum: torch.Tensor | None = None  # [loss, terms..., grad_norm] summed over the log window
    window_steps = 0
    first_bad_step = torch.full((), -1, dtype=torch.long, device=device)
    first_bad_what: torch.Tensor | None = None
    last: dict[str, float] = {}
    t_window, t_start = time.perf_counter(), time.perf_counter()
    cpu_window = time.process_time()  # CPU seconds of this process: robust to a busy machine
    tokens_per_step = args.batch_size * seq_len
    # After prepare: under FSDP2 the optimised tensors are the sharded ones.
    trainable_params = [p for p in wrapped.parameters() if p.requires_grad]

    for step in range(start_step, steps):
        step_sum = None
        for k in range(accum):
            batch = {key: v.to(device, non_blocking=True) for key, v in next(batches).items()}
            sync = k == accum - 1
            # DDP: only the last micro-batch of a step all-reduces the gradients.
            with (accelerator.no_sync(wrapped) if not sync else contextlib.nullcontext()):
                with accelerator.autocast():
                    total, terms = objective.loss(batch, model=wrapped)
                accelerator.backward(total / accum)
            if term_names is None:
                term_names = list(terms)
                first_bad_what = torch.zeros(len(term_names) + 2, dtype=torch.bool, device=device)
            vec = torch.stack([total.detach().float()] + [terms[n].detach().float().reshape(()) for n in term_names])
            step_sum = vec if step_sum is None else step_sum + vec
        grad_norm = accelerator.clip_grad_norm_(trainable_params, args.grad_clip if args.grad_clip > 0 else float("inf"))
        optimizer.step()
        lr_used = scheduler.get_last_lr()[0]  # a Python float: no sync
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        step_vec = torch.cat([step_sum / accum, grad_norm.detach().float().reshape(1).to(device)])
        # Device-side guard: remember the first step with a non-finite value and which one.
        bad = ~torch.isfinite(step_vec)
        newly = bad.any() & (first_bad_step < 0)
        first_bad_step = torch.where(newly, torch.full_like(first_bad_step, step), first_bad_step)
        first_bad_what = torch.where(newly, bad, first_bad_what)
        window_sum = step_vec if window_sum is None else window_sum + step_vec
        window_steps += 1

        done_step = step + 1
        is_log = done_step % args.log_every == 0 or done_step == steps
        is_ckpt = done_step == steps or (args.checkpoint_every and done_step % args.checkpoint_every == 0)
        if is_log or is_ckpt:
            _raise_if_bad(accelerator, first_bad_step, first_bad_what, term_names)
        if is_log:
            mean = accelerator.reduce(window_sum / window_steps, reduction="mean")
            values = mean.tolist()  # the one host sync per log window
            now = time.perf_counter()
            tok_s = window_steps * tokens_per_step / max(now - t_window, 1e-9)
            cpu_per_step = (time.process_time() - cpu_window) / window_steps
            last = {"loss": values[0]} | dict(zip(term_names, values[1:-1])) | {"grad_norm": values[-1]}
            record = {"step": done_step, "tokens": done_step * tokens_per_step, **last,
                      "lr": lr_used, "tokens_per_s": tok_s, "cpu_s_per_step": cpu_per_step, "elapsed_s": now - t_start}
            if accelerator.is_main_process:
                with open(metrics_path, "a") as fh:
                    fh.write(json.dumps(record) + "\n")
                if tb is not None:
                    for key, value in record.items():
                        if key not in ("step",):
                            tb.add_scalar(f"train/{key}", value, done_step)
                if bar is not None:
                    bar.update(window_steps * tokens_per_step)
                    bar.set_postfix(loss=f"{values[0]:.4f}", tok_s=f"{tok_s:,.0f}", refresh=False)
            window_sum, window_steps, t_window, cpu_window = None, 0, time.perf_counter(), time.process_time()
        if is_ckpt:
            _save_checkpoint(accelerator, bare, ckpt_dir, done_step, fingerprint, fsdp)

    if bar is not None:
        bar.close()
    if tb is not None:
        tb.close()
    wall = time.perf_counter() - t_start
    summary = {
        "steps": steps, "tokens": steps * tokens_per_step, "seq_len": seq_len, "batch_size": args.batch_size,
        "num_processes": P, "grad_accumulation": accum, "final": last,
        "tokens_per_s": (steps - start_step) * tokens_per_step / wall if steps > start_step else None,
        "peak_memory_mib": peak_memory_mib(device), "mixed_precision": mixed, "device": str(device),
    }
    if steps == 0 and latest is None:
        # Nothing trained: still leave a final state, so a rerun finds the job done.
        _save_checkpoint(accelerator, bare, ckpt_dir, 0, fingerprint, fsdp)
    if accelerator.is_main_process:
        write_json_atomic(ckpt_dir / ckpt.DONE_FILE, {"step": steps, "summary": summary})
        ckpt.prune(ckpt_dir, keep=1)
    _copy_metrics(accelerator, ckpt_dir, out_dir)
    accelerator.print(f"trained {summary['tokens']:,} tokens in {steps} steps; peak memory {summary['peak_memory_mib']:.0f} MiB")
    return summary | {"resumed_from": resumed_from, "already_done": False}


def _raise_if_bad(accelerator, first_bad_step: torch.Tensor, first_bad_what: torch.Tensor | None, term_names: list[str] | None) -> None:
    # The earliest bad step over all processes (-1 = none); every process raises alike.
    steps = accelerator.gather(first_bad_step.reshape(1)).tolist()
    bad = [s for s in steps if s >= 0]
    if not bad:
        return
    worst = min(bad)
    names = ["loss"] + list(term_names or []) + ["grad_norm"]
    what = first_bad_what.tolist() if (first_bad_what is not None and int(first_bad_step) == worst) else []
    culprits = [n for n, b in zip(names, what) if b] or ["(on another process)"]
    raise LRCError(
        f"non-finite value at step {worst + 1} (1-based; after {worst} good steps) in: {', '.join(culprits)}; "
        "stopped without saving; the last good checkpoint is kept"
    )


def _save_checkpoint(accelerator, bare: torch.nn.Module, ckpt_dir: Path, step: int, fingerprint: dict, fsdp: bool) -> None:
    from safetensors.torch import save_file

    final = ckpt_dir / ckpt.step_dir_name(step)
    tmp = ckpt_dir / (".tmp-" + final.name)
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()  # every process writes its RNG state into tmp
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()  # ... and has finished before tmp is renamed
    if accelerator.is_main_process:
        if not fsdp:
            tensors = {n: p.detach().to("cpu").contiguous() for n, p in trainable_parameters(bare)}
            save_file(tensors, str(tmp / ckpt.TRAINABLE_FILE))
        state = {"step": step, "data_position": step, "fingerprint": fingerprint}
        write_json_atomic(tmp / ckpt.STATE_FILE, state)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        ckpt.prune(ckpt_dir, keep=1)
    accelerator.wait_for_everyone()


def _load_trainable(bare: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import load_file

    saved = load_file(str(path))
    params = dict(trainable_parameters(bare))
    if set(saved) != set(params):
        missing, extra = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
        raise LRCError(f"checkpoint {path} does not match the model's trainable parameters (missing {missing[:3]}, unexpected {extra[:3]})")
    with torch.no_grad():
        for name, p in params.items():
            if saved[name].shape != p.shape:
                raise LRCError(f"checkpoint {path}: {name} has shape {tuple(saved[name].shape)}, the model {tuple(p.shape)}")
            p.copy_(saved[name])


def _truncate_metrics(path: Path, upto_step: int) -> None:
    """Drop log lines written after the checkpoint we resume from (they will be redone)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= upto_step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):
            pass  # a line torn by the kill
    write_text_atomic(path, "".join(line + "\n" for line in keep))


def _copy_metrics(accelerator, ckpt_dir: Path, out_dir: Path) -> None:
    if accelerator.is_main_process:
        src = ckpt_dir / ckpt.METRICS_FILE
        with atomic_file(out_dir / ckpt.METRICS_FILE) as tmp:
            if src.is_file():
                shutil.copyfile(src, tmp)
            else:
                tmp.write_text("")
    accelerator.wait_for_everyone()


def _tensorboard(ckpt_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("warning: --tensorboard needs the tensorboard package (pip install tensorboard); skipped", file=sys.stderr)
        return None
    return SummaryWriter(str(ckpt_dir / "tb"))


def is_main_process() -> bool:
    """True on the process that writes outputs (the only one without accelerate launch)."""
    from accelerate import PartialState

    return PartialState().is_main_process
