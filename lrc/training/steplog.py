"""The training loop's logging and its guards (non-finite values, divergence): one :class:`StepLog` per run.

Split from :mod:`lrc.training.loop` (which keeps the decisions in its docstring) so that the loop
reads as setup, resume, step, log, finish. Why it looks as it does:

- **No host sync per step.** A step's ``[loss, terms..., grad_norm]`` is added to a window
  sum on the device, and the first step with a non-finite value (and which value) is
  remembered with ``torch.where``. The host reads them only at log steps (one ``reduce``
  over processes, one ``tolist``) and before a checkpoint (one ``gather``).
- **The earliest bad step wins, on every process alike**, so all processes raise the same
  ``LRCError`` and none is left waiting in a collective. The divergence guard
  (:class:`lrc.training.guards.DivergenceGuard`, its own state on the device too) is read in the same
  gather; a non-finite value and a divergence: the earlier one is reported (a tie: the non-finite).
  Either error names the checkpoint the run leaves behind.
- **Sinks on the main process only**: ``metrics.jsonl`` in the checkpoint directory
  (appended line by line, truncated to the resumed step first), the experiment trackers
  (:mod:`lrc.training.trackers`: TensorBoard when installed, W&B, ...) and the progress bar.
- **A command's own sink** (``hook``, e.g. :class:`lrc.method.update_energy.UpdateEnergyLog`), on
  every process: ``hook.begin(ckpt_dir, start_step=, steps=, tokens_per_step=)`` once,
  ``hook.after_step(done_step)`` after every optimiser step, before that step's checkpoint
  (so what it records of a step exists whenever the step's checkpoint does). It must not
  change the model, the RNG or anything else the run reads.
- **The optimiser step's own time** (``optimizer_s_per_step``, ``optimizer_cpu_s_per_step``):
  where `core`'s basis change lives (:mod:`lrc.training.optim`), a cost per step whatever the tokens
  per step. On a GPU it is the device's time, from CUDA events read at the log write (no
  sync per step); under DDP it is process 0's, waits for the other processes included, and
  the ``*_max`` keys give the slowest process's (one ``gather`` per log write), so an uneven
  division of the basis changes between processes shows.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from lrc.errors import LRCError
from lrc.training.checkpoint import METRICS_FILE, latest_checkpoint, truncate_metrics
from lrc.training.guards import DivergenceGuard
from lrc.training.trackers import open_trackers


class StepLog:
    """The metric window, the guards (non-finite; ``divergence``, if given) and the sinks (metrics.jsonl,
    TensorBoard, bar).

    Per step everything stays on the device; :meth:`raise_if_bad` and :meth:`write` (log and
    checkpoint steps only) are the host syncs. After :meth:`raise_if_bad`, :attr:`rising` says
    whether the latest step's loss was high on some process (a checkpoint then waits: see the loop's ``fit``).
    """

    def __init__(self, accelerator: Any, ckpt_dir: Path, *, steps: int, start_step: int, tokens_per_step: int,
                 trackers: Sequence[str] = (), progress: bool = True, hook: Any = None,
                 divergence: DivergenceGuard | None = None, settings: dict[str, Any] | None = None):
        self.acc, self.tokens_per_step = accelerator, tokens_per_step
        self.main = accelerator.is_main_process
        self.ckpt_dir = Path(ckpt_dir)
        self.divergence = divergence if (divergence is not None and divergence.enabled) else None
        self.rising = False
        self.path = Path(ckpt_dir) / METRICS_FILE
        if self.main:
            truncate_metrics(self.path, start_step)
        self.trackers = (open_trackers(trackers, self.ckpt_dir, self.ckpt_dir.name, _scalars(settings or {}))
                         if self.main else [])
        self.bar = None
        if progress and self.main and steps > start_step:
            self.bar = tqdm(total=steps * tokens_per_step, initial=start_step * tokens_per_step, unit="tok",
                            unit_scale=True, dynamic_ncols=True, file=sys.stderr)
        self.names: list[str] | None = None
        self.window_sum: torch.Tensor | None = None  # [loss, terms..., grad_norm] summed over the log window
        self.window_steps = 0
        self.first_bad_step = torch.full((), -1, dtype=torch.long, device=accelerator.device)
        self.first_bad_what: torch.Tensor | None = None
        self.last: dict[str, float] = {}
        self.t_window = self.t_start = time.perf_counter()
        self.cpu_window = time.process_time()  # CPU seconds of this process: robust to a busy machine
        self._reset_optimizer_time()
        self.hook = hook
        if hook is not None:
            hook.begin(ckpt_dir, start_step=start_step, steps=steps, tokens_per_step=tokens_per_step)

    def record(self, step: int, step_vec: torch.Tensor, names: list[str]) -> None:
        """Add a step to the window; remember (on the device) the first non-finite step and value."""
        if self.names is None:
            self.names = names
            self.first_bad_what = torch.zeros(len(names) + 2, dtype=torch.bool, device=step_vec.device)
        bad = ~torch.isfinite(step_vec)
        newly = bad.any() & (self.first_bad_step < 0)
        self.first_bad_step = torch.where(newly, torch.full_like(self.first_bad_step, step), self.first_bad_step)
        self.first_bad_what = torch.where(newly, bad, self.first_bad_what)
        if self.divergence is not None:
            self.divergence.update(step, step_vec[0])
        self.window_sum = step_vec if self.window_sum is None else self.window_sum + step_vec
        self.window_steps += 1
        if self.hook is not None:
            self.hook.after_step(step + 1)

    def _reset_optimizer_time(self) -> None:
        self.optimizer_wall, self.optimizer_cpu, self.optimizer_events = 0.0, 0.0, []

    @contextlib.contextmanager
    def timing_optimizer(self):
        """Around the optimiser step: add its wall (GPU: device) and CPU seconds to the window."""
        events = None
        if self.acc.device.type == "cuda":
            events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            events[0].record()
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.optimizer_cpu += time.process_time() - cpu
        if events is None:
            self.optimizer_wall += time.perf_counter() - wall
        else:
            events[1].record()
            self.optimizer_events.append(events)

    def _optimizer_seconds(self) -> float:
        for _, end in self.optimizer_events:
            end.synchronize()
        return self.optimizer_wall + sum(start.elapsed_time(end) for start, end in self.optimizer_events) / 1000

    def raise_if_bad(self) -> None:
        """Raise the earliest non-finite value or divergence over all processes (every process alike);
        set :attr:`rising`. One gather: ``[first bad step, divergence step, loss, level, latest step high]``."""
        own = [self.first_bad_step.to(torch.float64).reshape(1)]
        if self.divergence is not None:
            own.append(self.divergence.state())
        rows = self.acc.gather(torch.cat(own).reshape(1, -1)).tolist()
        bad = [int(r[0]) for r in rows if r[0] >= 0]
        found = sorted(r[1:4] for r in rows if len(r) > 1 and r[1] >= 0)
        self.rising = any(r[4] > 0 for r in rows if len(r) > 1)
        if bad and (not found or min(bad) <= found[0][0]):
            worst = min(bad)
            names = ["loss"] + list(self.names or []) + ["grad_norm"]
            what = (self.first_bad_what.tolist()
                    if (self.first_bad_what is not None and int(self.first_bad_step) == worst) else [])
            culprits = [n for n, b in zip(names, what) if b] or ["(on another process)"]
            raise LRCError(f"non-finite value at step {worst + 1} (1-based; after {worst} good steps) in: "
                           f"{', '.join(culprits)}; {self._kept()}")
        if found:
            step, loss, level = found[0]
            raise LRCError(f"{self.divergence.message(int(step), loss, level)}; {self._kept()}")

    def _kept(self) -> str:
        kept = latest_checkpoint(self.ckpt_dir)
        if kept is None:
            return "stopped without saving; no checkpoint had been written"
        return f"stopped without saving; the last good checkpoint is kept: {kept}"

    def write(self, done_step: int, lr_used: float) -> None:
        """Reduce the window over processes and write one metrics line (the one sync per window)."""
        values = self.acc.reduce(self.window_sum / self.window_steps, reduction="mean").tolist()
        now = time.perf_counter()
        tok_s = self.window_steps * self.tokens_per_step / max(now - self.t_window, 1e-9)
        cpu_per_step = (time.process_time() - self.cpu_window) / self.window_steps
        own = [cpu_per_step, self._optimizer_seconds() / self.window_steps, self.optimizer_cpu / self.window_steps]
        slowest = self.acc.gather(torch.tensor([own], dtype=torch.float64, device=self.acc.device)).amax(0).tolist()
        self.last = {"loss": values[0]} | dict(zip(self.names, values[1:-1])) | {"grad_norm": values[-1]}
        record = {"step": done_step, "tokens": done_step * self.tokens_per_step, **self.last,
                  "lr": lr_used, "tokens_per_s": tok_s, "cpu_s_per_step": own[0],
                  "optimizer_s_per_step": own[1], "optimizer_cpu_s_per_step": own[2],
                  "cpu_s_per_step_max": slowest[0], "optimizer_s_per_step_max": slowest[1],
                  "optimizer_cpu_s_per_step_max": slowest[2], "elapsed_s": now - self.t_start}
        if self.main:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
            for tracker in self.trackers:
                tracker.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=done_step)
            if self.bar is not None:
                self.bar.update(self.window_steps * self.tokens_per_step)
                self.bar.set_postfix(loss=f"{values[0]:.4f}", tok_s=f"{tok_s:,.0f}", refresh=False)
        self.window_sum, self.window_steps = None, 0
        self.t_window, self.cpu_window = time.perf_counter(), time.process_time()
        self._reset_optimizer_time()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        for tracker in self.trackers:
            tracker.finish()
        self.bar, self.trackers = None, []


def _scalars(settings: dict[str, Any]) -> dict[str, Any]:
    """The run's settings as trackers take them (TensorBoard's hparams: numbers, strings, booleans)."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in settings.items()}
