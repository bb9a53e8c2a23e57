"""The options of the training loop: :class:`TrainArgs`, shared by every training command.

Split from :mod:`lrc.training.loop` (whose docstring gives the decisions behind these options) so
that the loop module stays within the module size limit; ``lrc.training.loop`` imports
``TrainArgs`` back, so ``from lrc.training.loop import TrainArgs`` keeps working.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lrc.errors import LRCError
from lrc.options import check_choice
from lrc.training import checkpoint as ckpt
from lrc.training.trackers import resolve as resolve_trackers

SCHEDULES = ("linear", "cosine", "constant")
PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(kw_only=True)
class TrainArgs:
    """Options of the training loop (shared by every training command)."""

    tokens: int = field(default=0, metadata={
        "help": "token budget; steps = tokens // (batch_size * seq_len); 0 trains nothing (a budget above 0 that buys "
                "no step is an error)"})
    batch_size: int = field(default=8, metadata={"help": "sequences per optimiser step, over all processes"})
    micro_batch_size: int = field(default=8, metadata={
        "help": "sequences per forward pass on one process (gradient accumulation fills the rest)"})
    lr: float = field(default=1e-4, metadata={"help": "peak learning rate"})
    schedule: Literal["linear", "cosine", "constant"] = field(default="linear", metadata={
        "help": "learning-rate decay after warm-up"})
    warmup: float = field(default=0.005, metadata={"help": "warm-up as a fraction of the steps"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay (matrices only)"})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata={"help": "AdamW betas"})
    eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    grad_clip: float = field(default=1.0, metadata={"help": "clip the global gradient norm to this (0: no clipping)"})
    seed: int = field(default=0, metadata={"help": "seed of the data order and of any randomness in training"})
    precision: Literal["auto", "fp32", "bf16"] = field(default="auto", metadata={
        "help": "auto: fp32 on CPU, bf16 mixed precision on GPU"})
    checkpoint_every: int = field(default=0, metadata={
        "help": "save a resumable checkpoint every N steps (0: only at the end)"})
    log_every: int = field(default=10, metadata={
        "help": "log metrics (and check for non-finite values and divergence) every N steps"})
    ckpt_dir: Path | None = field(default=None, metadata={
        "help": "checkpoint directory (default: <out>.ckpt next to the output)"})
    keep_checkpoints: Literal["final", "all", "none"] = field(default="final", metadata={
        "help": "once finished, keep: final (the final weights a rerun rewrites its output from, no optimiser state), "
                "all (two full checkpoints), none"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads per process (0: leave torch's default)"})
    trackers: list[str] = field(default_factory=lambda: ["auto"], metadata={
        "help": "experiment trackers fed with metrics.jsonl's records (accelerate's): auto (TensorBoard under "
                "<ckpt_dir>/tb when installed), none, tensorboard, wandb, mlflow, ..."})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})
    activation_checkpointing: bool = field(default=False, metadata={
        "help": "checkpoint each decoder layer of the trained model: its activations are recomputed in backward (less "
                "memory, one more forward of the layers, the same trajectory; lrc.training.recompute)"})
    recompute_teacher: bool = field(default=False, metadata={
        "help": "with --activation-checkpointing, lrc recipe: keep only each teacher layer's input and rerun the "
                "teacher's layer inside the student's checkpointed one, so the clone terms' activations live one layer "
                "at a time (two more forwards of the teacher's layers, the same trajectory; lrc.method.clone)"})
    divergence_factor: float = field(default=10.0, metadata={
        "help": "stop the run with an error naming the step, without saving (checkpoints wait while the loss is "
                "above), when the loss stays above this many times the run's best level, the lowest value of its "
                "moving average (decay 0.99, from the first step), for --divergence-steps consecutive steps. 10: far "
                "above batch-to-batch noise (the tiny world's loss curves stay within 1.1x of their best level), "
                "while a diverging run is 100x to 1e9x above it; 0: off (lrc.training.guards)"})
    divergence_steps: int = field(default=10, metadata={
        "help": "consecutive steps the loss must stay above --divergence-factor x its best level to stop the run: a "
                "short spike comes back, a divergence does not; 10 with --divergence-warmup 5 still catches a "
                "20-step run (0: off)"})
    divergence_warmup: int = field(default=5, metadata={
        "help": "the first steps after the start (or a resume) that the divergence check does not count (their loss "
                "still sets the level): the first optimiser steps may jump above a warm-started model's loss and "
                "fall back"})
    shard_optimizer: bool = field(default=False, metadata={
        "help": "DDP: each process keeps AdamW's states for its share of the parameters only, and broadcasts their new "
                "values (ZeRO stage 1; the same trajectory and checkpoints; lrc.training.optim)"})
    weight_build: Literal["auto", "step", "micro_batch"] = field(default="auto", metadata={
        "help": "build the student's parametrised weights once per optimiser step (step) or in every micro-batch's "
                "forward (micro_batch); auto: step with gradient accumulation, micro_batch with one micro-batch "
                "per step and under FSDP2 (step holds every weight and its gradient's fp32 sum through the step: "
                "lrc plan --weight-build step shows the memory; lrc.training.weight_build)"})
    divide_weight_build: bool = field(default=False, metadata={
        "help": "DDP, weights built once per step: each process builds 1/N of every weight's rows and the blocks "
                "are gathered (less compute, an all-gather and a reduce-scatter of the weights per step; on 2 CPU "
                "processes it measured no faster, docs/performance.md)"})

    def __post_init__(self) -> None:
        resolve_trackers(self.trackers)  # an explicitly named tracker must be installed: refused before any work
        for name in ("tokens", "checkpoint_every", "threads", "divergence_steps", "divergence_warmup"):
            if getattr(self, name) < 0:
                raise LRCError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        for name in ("batch_size", "micro_batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise LRCError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.batch_size % self.micro_batch_size:
            raise LRCError(f"--batch-size {self.batch_size} must be a multiple of --micro-batch-size "
                           f"{self.micro_batch_size} (times the number of processes: gradient accumulation)")
        if not 0 < self.lr < math.inf:
            raise LRCError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.grad_clip < math.inf:
            raise LRCError(f"--grad-clip must be >= 0 (0: no clipping), got {self.grad_clip}")
        if not 0 <= self.weight_decay < math.inf:
            raise LRCError(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if not 0 < self.eps < math.inf:
            raise LRCError(f"--eps must be a positive number, got {self.eps}")
        check_choice("--schedule", self.schedule, SCHEDULES)
        check_choice("--precision", self.precision, PRECISIONS)
        check_choice("--keep-checkpoints", self.keep_checkpoints, ckpt.RETENTIONS)
        if self.recompute_teacher and not self.activation_checkpointing:
            raise LRCError("--recompute-teacher (train.recompute_teacher) reruns the teacher inside the student's "
                           "checkpointed layers: it needs --activation-checkpointing")
        if not 0.0 <= self.warmup < 1.0:
            raise LRCError(f"--warmup is a fraction of the steps in [0, 1), got {self.warmup}")
        if self.divergence_factor != 0 and not self.divergence_factor > 1:
            raise LRCError(f"--divergence-factor must be > 1 (0: off), got {self.divergence_factor}")
        if len(self.betas) != 2:
            raise LRCError(f"--betas takes two values, got {self.betas}")
        self.betas = [float(b) for b in self.betas]
        if not all(0 <= b < 1 for b in self.betas):
            raise LRCError(f"--betas must lie in [0, 1), got {self.betas}")
        if self.ckpt_dir is not None:
            self.ckpt_dir = Path(self.ckpt_dir)


def train_args_from(args: Any) -> TrainArgs:
    """The TrainArgs part of a command's argument dataclass (which inherits TrainArgs)."""
    return TrainArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainArgs)})
