"""Hugging Face I/O in one place: tokenizers, teachers, and which parameters train.

Every command that reads a model or a tokenizer from disk comes through here, so the
safety defaults (no remote code) and the error messages are the same everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lrc.errors import LRCError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def has_tokenizer(directory: str | os.PathLike) -> bool:
    """True when ``directory`` holds a saved tokenizer."""
    return any((Path(directory) / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(path_or_id: str | os.PathLike) -> Any:
    """AutoTokenizer from a local directory (or a hub id when online); never remote code."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path_or_id), trust_remote_code=False)
    except Exception as err:  # transformers raises OSError/ValueError/HF errors alike
        raise LRCError(f"cannot load tokenizer {str(path_or_id)!r}: {err}") from err


def freeze_teacher(teacher: nn.Module) -> nn.Module:
    """Eval mode, no gradients: the one place a teacher is frozen."""
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def load_teacher(path: str | Path, dtype=torch.float32) -> nn.Module:
    """Load a local HF checkpoint as a frozen teacher (no remote code)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise LRCError(f"teacher directory {path} has no config.json")
    config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise LRCError(f"unsupported teacher model_type {config.model_type!r} in {path}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    teacher = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False)
    return freeze_teacher(teacher)


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The named parameters the optimiser sees (``requires_grad``)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]
