"""The training loop's guards against runs that end with exit status 0 but did not train properly.

Split from :mod:`lrc.training.loop` (the loop's size limit). Two guards, both ending the run with an
:class:`lrc.errors.LRCError`; the non-finite guard lives in :class:`lrc.training.steplog.StepLog`:

- **A budget that buys no step** (:func:`steps_of_budget`): ``0 < tokens < batch_size * seq_len``
  used to train nothing, write an untrained model under the budget's name and exit 0 with a
  warning in the job's log. It is refused before any training work, naming ``--tokens``, the
  step's size and what to change. ``tokens = 0`` stays valid: a deliberate zero-token run (a
  warm start left at its initialisation).
- **Divergence** (:class:`DivergenceGuard`): a run whose loss climbs by orders of magnitude
  (lr 3: 6.7e9) stays finite, so the non-finite guard never fires. The guard keeps, on the
  device (no host sync per step), a moving average of the step loss (decay :data:`DECAY`,
  bias-corrected: the mean of the steps seen while they are few) and the lowest value that
  average reached, the run's *best level*. A step whose loss is above ``factor`` times the
  best level before it is *high*; ``steps`` consecutive high steps are a divergence, dated at
  the last of them. The best level never rises, so neither a plateau at the diverged value nor
  a slow climb (a few per cent a step, which a plain moving average follows) hides it. The
  first ``warmup`` steps after a (re)start are not counted (the level is learnt from them):
  the first Adam steps of a warm-started model may jump above its starting loss and fall
  back. A level of 0 (a loss that was exactly 0 at every step so far) is not a scale: nothing
  is high against it. Non-finite losses are left to the non-finite guard. Under DDP/FSDP each
  process watches the loss of its own micro-batches; the earliest divergence over processes
  is reported by all.

  The defaults (:class:`lrc.training.args.TrainArgs`: factor 10, 10 steps, 5 steps of warm-up)
  were checked on the test world's runs, logged every step: pretrain (562 steps), a warm start
  from a fresh init (400), distill slice/dense/core and the kl recipe at batch 2 (800 each) and
  SFT (200 and 400). No step's loss was above 1.1x the best level before it, from the first
  step on. At lr 3 the loss was 1e8x above it at the second step (distill) or passed 10x by
  the fifth and stayed there for 49 steps (pretrain; it stopped at step 15).
  Warm-up and steps together stay under 20, so a run of config/test.yaml's length (19 steps) is
  checked too.

  The loop reads the guard where it reads the non-finite one: at log steps and before every
  checkpoint (one gather over processes for both, :meth:`lrc.training.steplog.StepLog.raise_if_bad`).
  A checkpoint due after a high step (counted or not) is put off until the loss is back under
  the threshold (the final one is not), so the checkpoint a divergence leaves behind predates
  its first high step: the run stops without saving, as on a non-finite value.
  The guard reads the loss only: it changes neither the model nor the RNG, so a run that
  never trips it ends with the same weights as with the guard off. Its state is not in the
  checkpoint: a resumed run learns its level again.
"""

from __future__ import annotations

import torch

from lrc.errors import LRCError

DECAY = 0.99  # of the moving average: a time constant of 100 steps


def steps_of_budget(tokens: int, batch_size: int, seq_len: int) -> int:
    """``tokens // (batch_size * seq_len)``; an LRCError if a budget above 0 buys no optimiser step."""
    per_step = batch_size * seq_len
    steps = tokens // per_step
    if tokens > 0 and steps == 0:
        raise LRCError(
            f"--tokens {tokens} buys no optimiser step: one step takes --batch-size {batch_size} sequences x "
            f"seq_len {seq_len} tokens (the training data's) = {per_step} tokens, and a run would end with an "
            f"untrained model; give --tokens of at least {per_step}, a smaller --batch-size, or --tokens 0 for a "
            "deliberate zero-token run")
    return steps


class DivergenceGuard:
    """The loss against its best level, per process, on the device (see the module doc).

    :meth:`update` once per optimiser step (no host sync); :meth:`state` is what
    :class:`lrc.training.steplog.StepLog` gathers over processes and :meth:`message` words it.
    """

    STATE = ("step", "loss", "level", "high")  # the names of :meth:`state`'s entries

    def __init__(self, *, factor: float, steps: int, warmup: int, device: torch.device | str):
        self.factor, self.steps, self.warmup = float(factor), int(steps), int(warmup)
        self.seen = 0  # steps recorded since the (re)start: a host counter, no sync
        full = dict(dtype=torch.float64, device=device)
        self.average = torch.zeros((), **full)  # DECAY-weighted sum of the finite losses
        self.weight = torch.zeros((), **full)  # the sum of their weights (bias correction)
        self.best = torch.full((), float("inf"), **full)  # the lowest average so far
        self.streak = torch.zeros((), **full)  # consecutive high steps, counted after the warm-up
        self.high = torch.zeros((), **full)  # 1 if the latest step was high (in the warm-up too)
        self.found = torch.tensor([-1.0, float("nan"), float("nan")], **full)  # step (0-based), loss, level

    @property
    def enabled(self) -> bool:
        return self.factor > 0 and self.steps > 0

    def update(self, step: int, loss: torch.Tensor) -> None:
        """Account for the loss of optimiser step ``step`` (0-based), a 0-d tensor on the device."""
        loss = loss.detach().to(self.average.dtype).reshape(())
        finite = torch.isfinite(loss)
        high = finite & (self.best > 0) & (loss > self.factor * self.best)
        self.high = high.to(self.high.dtype)
        counted = self.seen >= self.warmup
        self.seen += 1
        if counted:
            self.streak = torch.where(high, self.streak + 1, torch.zeros_like(self.streak))
            newly = (self.streak == self.steps) & (self.found[0] < 0)
            found = torch.stack([torch.full_like(loss, step), loss, self.best])
            self.found = torch.where(newly, found, self.found)
        clean = torch.where(finite, loss, torch.zeros_like(loss))
        self.average = torch.where(finite, DECAY * self.average + (1 - DECAY) * clean, self.average)
        self.weight = torch.where(finite, DECAY * self.weight + (1 - DECAY), self.weight)
        level = self.average / self.weight.clamp_min(torch.finfo(self.weight.dtype).tiny)
        self.best = torch.where(finite, torch.minimum(self.best, level), self.best)

    def state(self) -> torch.Tensor:
        """``[step, loss, level, high]`` (float64, on the device): the divergence found (step -1: none), and
        whether the latest step was high."""
        return torch.cat([self.found, self.high.reshape(1)])

    def message(self, step: int, loss: float, level: float) -> str:
        """The error for a divergence found at 0-based ``step`` (the last of ``steps`` high steps)."""
        first = step - self.steps + 1
        return (f"the loss diverged: at step {step + 1} (1-based) it was {loss:.4g}, and it had stayed above "
                f"{self.factor:g}x the run's best level {level:.4g} (the lowest its moving average reached) for "
                f"{self.steps} consecutive steps, since step {first + 1}; lower --lr, or loosen the check "
                f"(--divergence-factor, --divergence-steps; --divergence-factor 0 turns it off)")
