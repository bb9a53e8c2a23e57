"""Training checkpoints on disk: atomic step directories, the latest one, the done marker.

Layout of a checkpoint directory (``TrainArgs.ckpt_dir``)::

    step-000040/           one accelerate state (optimiser, scheduler, RNG per process)
        trainable.safetensors   the trainable parameters only (frozen teacher weights are
                                rebuilt by the command, so they are not copied into every checkpoint)
        trainer_state.json      step, tokens, data position, run fingerprint; written last
    metrics.jsonl          the live metrics log (copied into the output directory at the end)
    DONE                   JSON marker: the run finished; its final state is the newest step-*

A step directory is first written as ``.tmp-step-000040`` and renamed when complete, so a
directory named ``step-*`` is always whole; a kill leaves at most a ``.tmp-*`` that the
next run removes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from lrc.atomic import write_json_atomic  # noqa: F401  (re-exported: tests write state files through it)

STATE_FILE = "trainer_state.json"
TRAINABLE_FILE = "trainable.safetensors"
DONE_FILE = "DONE"
METRICS_FILE = "metrics.jsonl"


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Complete step directories, oldest first."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if p.is_dir() and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def read_state(step_dir: Path) -> dict[str, Any]:
    return json.loads((step_dir / STATE_FILE).read_text())


def remove_partial(ckpt_dir: str | Path) -> None:
    """Delete the remains of checkpoints that were being written when a job died."""
    for p in Path(ckpt_dir).glob(".tmp-*"):
        shutil.rmtree(p, ignore_errors=True)


def prune(ckpt_dir: str | Path, keep: int) -> None:
    """Keep only the newest ``keep`` complete checkpoints."""
    for p in list_checkpoints(ckpt_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)


def read_done(ckpt_dir: str | Path) -> dict[str, Any] | None:
    path = Path(ckpt_dir) / DONE_FILE
    return json.loads(path.read_text()) if path.is_file() else None
