"""`lrc pretrain`: train a fresh model from a config with the language-modelling objective.

This makes the tiny world's teacher. The model is built from ``--model-config`` (a
transformers config JSON with ``model_type``) with weights drawn from ``--seed``, trained on
every token of ``--data`` and saved as a plain HF checkpoint (safetensors) with the
tokenizer, ``metrics.jsonl`` and ``settings.json``. Same seed and data, same weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from lrc.io.hf import load_model_config, load_tokenizer
from lrc.io.tokens import check_vocab, open_token_data
from lrc.method.objectives import LMObjective
from lrc.options import parse_args
from lrc.training.args import TrainArgs, train_args_from
from lrc.training.loop import train
from lrc.training.outputs import save_hf_output


@dataclass(kw_only=True)
class PretrainArgs(TrainArgs):
    """Pretrain a plain causal LM from a config (the tiny-world teacher)."""

    model_config: Path = field(metadata={"help": "transformers config JSON (with model_type)"})
    tokenizer: Path = field(metadata={"help": "tokenizer directory; saved with the model"})
    data: Path = field(metadata={"help": "token directory (or a `lrc tokenize` output with train/)"})
    out: Path = field(metadata={"help": "output directory: HF checkpoint + tokenizer", "output": "dir"})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(PretrainArgs, argv, prog="lrc pretrain")
    from transformers import AutoModelForCausalLM  # after the options: the dry run reads them without it

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
