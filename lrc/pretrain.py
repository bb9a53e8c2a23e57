"""`lrc pretrain`: train a fresh model from a config with the language-modelling objective.

This makes the tiny world's teacher. The model is built from ``--model-config`` (a
transformers config JSON with ``model_type``) with weights drawn from ``--seed``, trained on
every token of ``--data`` and saved as a plain HF checkpoint (safetensors) with the
tokenizer, ``metrics.jsonl`` and ``settings.json``. Same seed and data, same weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from lrc.atomic import atomic_dir
from lrc.checkpoint import copy_metrics
from lrc.errors import LRCError
from lrc.hf import load_tokenizer, read_json_object
from lrc.objectives import LMObjective
from lrc.options import parse_args
from lrc.provenance import write_settings
from lrc.tokens import check_vocab, open_token_data
from lrc.train import (
    TrainArgs,
    is_main_process,
    train,
    train_args_from,
)


@dataclass(kw_only=True)
class PretrainArgs(TrainArgs):
    """Pretrain a plain causal LM from a config (the tiny-world teacher)."""

    model_config: Path = field(metadata={"help": "transformers config JSON (with model_type)"})
    tokenizer: Path = field(metadata={"help": "tokenizer directory; saved with the model"})
    data: Path = field(metadata={"help": "token directory (or a `lrc tokenize` output with train/)"})
    out: Path = field(metadata={"help": "output directory: HF checkpoint + tokenizer"})


def load_model_config(path: Path):
    from transformers import AutoConfig

    data = read_json_object(Path(path), "--model-config")
    model_type = data.pop("model_type", None)
    if not model_type:
        raise LRCError(f"--model-config {path}: no model_type (e.g. \"llama\")")
    try:
        return AutoConfig.for_model(model_type, **data)
    except ValueError as err:
        raise LRCError(f"--model-config {path}: {err}") from err


def save_hf_output(model: torch.nn.Module, tokenizer: Any, out: Path, *, command: str, settings: Any, summary: dict) -> None:
    """Write the trained model, tokenizer, metrics and settings to ``out`` atomically.

    ``metrics.jsonl`` is copied from the run's checkpoint directory (``summary["metrics"]``).
    """
    if not is_main_process():
        return
    with atomic_dir(Path(out)) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        copy_metrics(summary["metrics"], tmp)
        write_settings(tmp, command, settings, training=summary)


def main(argv: Sequence[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM

    args = parse_args(PretrainArgs, argv, prog="lrc pretrain")
    targs = train_args_from(args)
    if targs.threads:
        torch.set_num_threads(targs.threads)
    config = load_model_config(args.model_config)
    tokenizer = load_tokenizer(args.tokenizer)
    dataset = open_token_data(args.data, tokenizer=tokenizer)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config)
    check_vocab(dataset, model)
    summary = train(LMObjective(model), model, dataset, targs, args.out)
    save_hf_output(model, tokenizer, args.out, command="pretrain", settings=args, summary=summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
