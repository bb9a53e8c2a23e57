"""`lrc world`: generate the built-in tiny world (see :mod:`lrc.world` for what it writes)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Sequence

from lrc.errors import LRCError
from lrc.io.atomic import atomic_dir
from lrc.io.provenance import write_settings
from lrc.options import parse_args
from lrc.world import SIZES, TEACHERS, generate
from lrc.world.generator import WorldSize


@dataclass(kw_only=True)
class WorldArgs:
    """Generate the built-in tiny world (corpus, SFT chats, tasks, tokenizer, teacher config)."""

    out: Path = field(metadata={"help": "output directory (replaced atomically)", "output": "dir"})
    seed: int = field(default=0, metadata={"help": "the world's seed: same seed, same bytes"})
    size: Literal["default", "test"] = field(default="default", metadata={
        "help": "preset sizes; the options below override them"})
    people: int | None = field(default=None, metadata={"help": "number of people"})
    cities: int | None = field(default=None, metadata={"help": "number of cities"})
    docs_per_person: int | None = field(default=None, metadata={"help": "training documents per person (exposures)"})
    valid_docs_per_person: int | None = field(default=None, metadata={"help": "validation documents per person"})
    eval_docs: int | None = field(default=None, metadata={
        "help": "documents per evaluation task, a seeded sample; 0: every question the world has"})
    vocab_size: int | None = field(default=None, metadata={"help": "tokenizer vocabulary size"})
    hidden_size: int | None = field(default=None, metadata={"help": "teacher hidden size H"})
    intermediate_size: int | None = field(default=None, metadata={
        "help": "teacher MLP width d_ff (rho = d_ff/H >= 2.67)"})
    num_hidden_layers: int | None = field(default=None, metadata={"help": "teacher layers"})
    num_attention_heads: int | None = field(default=None, metadata={"help": "teacher attention heads"})
    num_key_value_heads: int | None = field(default=None, metadata={"help": "teacher KV heads (GQA)"})

    def resolved_size(self) -> WorldSize:
        overrides = {k: getattr(self, k) for k in WorldSize.__dataclass_fields__ if getattr(self, k) is not None}
        size = replace(SIZES[self.size], **overrides)
        for key, value in vars(size).items():
            if value < (0 if key == "eval_docs" else 1):
                raise LRCError(f"--{key.replace('_', '-')} must be positive, got {value}")
        if size.people < 5:
            raise LRCError(f"--people must be at least 5 (four-way questions about friends), got {size.people}")
        if size.cities < 4:
            raise LRCError(f"--cities must be at least 4 (four-way questions about a person's city), got {size.cities}")
        return size

    def teacher_sizes(self) -> dict[str, int]:
        sizes = dict(TEACHERS[self.size])
        sizes.update({k: getattr(self, k) for k in sizes if getattr(self, k) is not None})
        if sizes["intermediate_size"] / sizes["hidden_size"] < 2.67:
            raise LRCError(f"--intermediate-size {sizes['intermediate_size']} / --hidden-size {sizes['hidden_size']} "
                           "= rho below 2.67, outside the paper's range")
        if (sizes["hidden_size"] % sizes["num_attention_heads"]
                or sizes["num_attention_heads"] % sizes["num_key_value_heads"]):
            raise LRCError("--hidden-size must divide into --num-attention-heads, which must divide into "
                           "--num-key-value-heads")
        return sizes


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(WorldArgs, argv, prog="lrc world")
    size, teacher_sizes = args.resolved_size(), args.teacher_sizes()
    out = Path(args.out)
    with atomic_dir(out) as tmp:
        # Task YAMLs record absolute data paths: generate under the final name's parent,
        # then point them at the final location before the rename.
        record = generate(tmp, size, teacher_sizes, args.seed, args.size)
        for yaml_file in (tmp / "tasks").glob("*.yaml"):
            yaml_file.write_text(yaml_file.read_text().replace(str(tmp.resolve()), str(out.resolve())))
        write_settings(tmp, "world", args, world_size=vars(size), teacher=teacher_sizes)
    print(f"{out}: {size.people} people, {record['corpus_tokens']['train']} training tokens, "
          f"{record['single_token_names']:.0%} single-token names")
    return 0
