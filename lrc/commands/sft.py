"""`lrc sft`: supervised fine-tuning of a merged (plain HF) checkpoint on chat data.

A full fine-tune: every parameter trains, on next-token cross-entropy counted on the
assistant tokens only (the token directory's loss mask; see :mod:`lrc.method.objectives`). The
defaults follow the LRC recipe: lr 1e-5, 10 % warm-up, linear decay, one epoch of the chat
set (``--epochs``; ``--tokens`` overrides it). Writes an HF checkpoint + tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from lrc.errors import LRCError
from lrc.io.hf import load_causal_lm, load_tokenizer
from lrc.io.tokens import check_vocab, open_token_data
from lrc.method.objectives import LMObjective
from lrc.options import parse_args
from lrc.training.args import TrainArgs, train_args_from
from lrc.training.loop import train
from lrc.training.outputs import save_hf_output


@dataclass(kw_only=True)
class SftArgs(TrainArgs):
    """Full fine-tune of a merged checkpoint on chat data (loss on answer tokens only)."""

    model: Path = field(metadata={"help": "HF checkpoint directory (with its tokenizer)"})
    data: Path = field(metadata={"help": "chat token directory with a loss mask (or a `lrc tokenize --chat` output)"})
    out: Path = field(metadata={"help": "output directory: the fine-tuned HF checkpoint + tokenizer",
                                "output": "dir"})
    tokens: int | None = field(default=None, metadata={"help": "token budget (default: --epochs passes over the data)"})
    epochs: float = field(default=1.0, metadata={"help": "passes over the chat set when --tokens is not given"})
    lr: float = field(default=1e-5, metadata={"help": "peak learning rate"})
    warmup: float = field(default=0.1, metadata={"help": "warm-up as a fraction of the steps"})

    def __post_init__(self) -> None:
        if self.epochs <= 0:
            raise LRCError(f"--epochs must be > 0, got {self.epochs}")
        tokens, self.tokens = self.tokens, 0  # validate the rest with a placeholder
        super().__post_init__()
        self.tokens = tokens
        if tokens is not None and tokens < 0:
            raise LRCError(f"--tokens must be >= 0, got {tokens}")


def load_hf_model(path: Path, option: str = "--model"):
    return load_causal_lm(path, dtype=torch.float32, role=option)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(SftArgs, argv, prog="lrc sft")
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    dataset = open_token_data(args.data, tokenizer=tokenizer)
    if not dataset.has_mask:
        raise LRCError(f"--data {dataset.directory}: no loss mask; SFT needs chat data (`lrc tokenize --chat`)")
    if args.tokens is None:
        args.tokens = int(round(args.epochs * len(dataset))) * dataset.seq_len
    targs = train_args_from(args)
    model = load_hf_model(args.model)
    check_vocab(dataset, model)
    model.requires_grad_(True)
    summary = train(LMObjective(model), model, dataset, targs, args.out)
    save_hf_output(model, tokenizer, args.out, command="sft", settings=args, summary=summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
