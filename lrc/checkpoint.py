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
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

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


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def read_done(ckpt_dir: str | Path) -> dict[str, Any] | None:
    path = Path(ckpt_dir) / DONE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


@contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary sibling of ``final``; on success it replaces ``final``.

    On an exception the temporary directory is removed and ``final`` is left as it was,
    so a reader never sees a half-written output directory.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".tmp-{final.name}-*"):  # left by a killed job
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.with_name(f".tmp-{final.name}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        old = final.with_name(f".old-{final.name}-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
