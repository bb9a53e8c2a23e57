"""What a finished run writes: the trained model's directory with its metrics and settings."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from lrc.io.atomic import atomic_dir
from lrc.io.hf import save_causal_lm
from lrc.io.provenance import is_main_process, write_settings
from lrc.training.checkpoint import METRICS_FILE


def save_hf_output(model: torch.nn.Module, tokenizer: Any, out: Path, *, command: str, settings: Any,
                   summary: dict) -> None:
    """Write the trained model, tokenizer, metrics and settings to ``out`` atomically.

    ``metrics.jsonl`` is copied from the run's checkpoint directory (``summary["metrics"]``).
    """
    if not is_main_process():
        return
    with atomic_dir(Path(out)) as tmp:
        save_causal_lm(model, tmp, tokenizer)
        copy_metrics(summary["metrics"], tmp)
        write_settings(tmp, command, settings, training=summary)


def copy_metrics(metrics: str | Path, out_dir: str | Path) -> None:
    """Copy a run's ``metrics.jsonl`` into ``out_dir`` (a command's temporary output directory)."""
    src, dest = Path(metrics), Path(out_dir) / METRICS_FILE
    if src.is_file():
        shutil.copyfile(src, dest)
    else:
        dest.write_text("")
