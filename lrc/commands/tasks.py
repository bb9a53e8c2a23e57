"""`lrc tasks`: multiple-choice lm-eval tasks built from held-out real text, offline.

Two task kinds, each one question per held-out document (seeded, so the same data, tokenizer
and seed give the same directory):

* ``heldout_continuation``: the document's first ``--prefix-tokens`` tokens as context; the
  choices are its next ``--continuation-tokens`` tokens and, as distractors, the span at the
  same place in ``--choices - 1`` other held-out documents. Chance 1/choices.
* ``heldout_shuffled``: the same context; the true continuation against the same words in a
  shuffled order (whitespace kept in place). Chance 1/2.

The cuts fall on a token that starts with whitespace where one is near, so no choice begins
mid-word. Documents come from a held-out token directory (``valid/`` of `lrc tokenize`,
decoded with ``--tokenizer`` and split at its special tokens, the document separators) or a
text file (``.jsonl``: one document per line, field ``--text-field``; ``.txt``: paragraphs
separated by blank lines). A ``train/`` split is refused: the tasks must be held out.

Writes ``OUT/{task}.yaml`` (lm-eval, from :func:`lrc.io.suites.task_template`), ``OUT/{task}.jsonl``
(``context``, ``choices``, ``gold``), ``OUT/suite.yaml`` (read by ``lrc evaluate --suite
local --tasks-dir OUT``) and ``settings.json``.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from lrc.errors import LRCError
from lrc.io.atomic import atomic_dir
from lrc.io.hf import load_tokenizer
from lrc.io.provenance import write_settings
from lrc.io.suites import SUITE_FILE, task_template
from lrc.io.tokens import TokenDataset, read_manifest
from lrc.options import parse_args

KINDS = ("continuation", "shuffled")
CUT_SEARCH = 8  # tokens after the nominal cut searched for one that starts with whitespace


@dataclass(kw_only=True)
class TasksArgs:
    """Write a local lm-eval task directory from held-out documents (true continuation vs. other
    documents', vs. shuffled words)."""

    data: Path = field(metadata={
        "help": "held-out token directory (valid/ of `lrc tokenize`, or its output directory) or a "
                ".jsonl/.txt text file"})
    tokenizer: str = field(metadata={
        "help": "tokenizer directory (the teacher's): decodes token rows, measures spans in tokens"})
    out: Path = field(metadata={"help": "task directory to write", "output": "dir"})
    kinds: list[str] = field(default_factory=lambda: list(KINDS), metadata={
        "help": "task kinds: continuation, shuffled"})
    items: int = field(default=200, metadata={"help": "questions per task at most (one per document)"})
    choices: int = field(default=4, metadata={"help": "choices of the continuation task (1 true + distractors)"})
    prefix_tokens: int = field(default=48, metadata={"help": "context length in tokens"})
    continuation_tokens: int = field(default=16, metadata={"help": "length of each choice in tokens"})
    text_field: str = field(default="text", metadata={"help": ".jsonl input: the field holding the text"})
    seed: int = field(default=0, metadata={
        "help": "seed of the document order, distractors, gold positions and shuffles"})

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise LRCError(f"--kinds {self.kinds}: choose among {', '.join(KINDS)}")
        if self.choices < 2:
            raise LRCError(f"--choices must be >= 2, got {self.choices}")
        for name in ("items", "prefix_tokens", "continuation_tokens"):
            if getattr(self, name) < 1:
                raise LRCError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


# ---------------------------------------------------------------------------------------
# Documents


def heldout_token_dir(path: Path) -> Path:
    """The held-out token directory named by ``path`` (a `lrc tokenize` output: its valid/)."""
    if (path / "valid").is_dir():
        path = path / "valid"
    if path.name == "train":
        raise LRCError(f"--data {path} is a training split; the tasks must come from held-out documents (valid/)")
    read_manifest(path)  # names the problem if this is no token directory
    return path


def token_documents(path: Path, tokenizer: Any) -> list[list[int]]:
    """The documents of a token directory: its rows in order, split at the special tokens."""
    ds = TokenDataset(path, expect_tokenizer=tokenizer)
    separators = set(tokenizer.all_special_ids)
    docs, current = [], []
    for i in range(len(ds)):
        for t in ds[i]["input_ids"].tolist():
            if t in separators:
                if current:
                    docs.append(current)
                current = []
            else:
                current.append(t)
    if current:
        docs.append(current)
    return docs


def text_documents(path: Path, text_field: str) -> list[str]:
    if not path.is_file():
        raise LRCError(f"--data {path}: no such file or token directory")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        docs = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                record = json.loads(line)
                if not isinstance(record.get(text_field), str):
                    raise LRCError(f"--data {path}, line {n}: no text field {text_field!r} (--text-field)")
                docs.append(record[text_field])
        return docs
    if path.suffix == ".txt":
        return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    raise LRCError(f"--data {path}: expected a token directory, a .jsonl or a .txt file")


def load_documents(args: TasksArgs, tokenizer: Any) -> list[list[int]]:
    """Every held-out document as token ids (no special tokens)."""
    if args.data.is_dir():
        return token_documents(heldout_token_dir(args.data), tokenizer)
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in text_documents(args.data, args.text_field)]


# ---------------------------------------------------------------------------------------
# Questions


def cut_point(ids: Sequence[int], at: int, tokenizer: Any) -> int:
    """The first position in ``[at, at + CUT_SEARCH)`` whose token starts with whitespace, else ``at``."""
    for k in range(at, min(at + CUT_SEARCH, len(ids))):
        piece = tokenizer.decode([ids[k]], clean_up_tokenization_spaces=False)
        if piece[:1].isspace():
            return k
    return at


def spans(docs: list[list[int]], args: TasksArgs, tokenizer: Any) -> list[tuple[str, str]]:
    """(context, continuation) text of each document long enough for both."""
    out = []
    need = args.prefix_tokens + CUT_SEARCH + args.continuation_tokens
    for ids in docs:
        if len(ids) < need:
            continue
        cut = cut_point(ids, args.prefix_tokens, tokenizer)
        context = tokenizer.decode(ids[:cut], clean_up_tokenization_spaces=False)
        continuation = tokenizer.decode(ids[cut:cut + args.continuation_tokens], clean_up_tokenization_spaces=False)
        if context.strip() and continuation.strip():
            out.append((context, continuation))
    return out


def shuffle_words(text: str, rng: random.Random) -> str | None:
    """``text`` with its words permuted and its whitespace kept in place (None: cannot differ)."""
    parts = re.split(r"(\s+)", text)
    slots = [i for i in range(0, len(parts), 2) if parts[i]]  # the words; odd indices are whitespace
    words = [parts[i] for i in slots]
    if len(set(words)) < 3:
        return None
    for _ in range(10):
        rng.shuffle(words)
        shuffled = parts[:]
        for i, word in zip(slots, words):
            shuffled[i] = word
        if "".join(shuffled) != text:
            return "".join(shuffled)
    return None


def continuation_docs(pairs: list[tuple[str, str]], args: TasksArgs, rng: random.Random) -> list[dict[str, Any]]:
    docs = []
    for i, (context, true) in enumerate(pairs[: args.items]):
        others = [c for j, (_, c) in enumerate(pairs) if j != i and c != true]
        if len(others) < args.choices - 1:
            break
        choices = rng.sample(others, args.choices - 1)
        gold = rng.randrange(args.choices)
        choices.insert(gold, true)
        docs.append({"context": context, "choices": choices, "gold": gold})
    return docs


def shuffled_docs(pairs: list[tuple[str, str]], args: TasksArgs, rng: random.Random) -> list[dict[str, Any]]:
    docs = []
    for context, true in pairs:
        if len(docs) == args.items:
            break
        shuffled = shuffle_words(true, rng)
        if shuffled is None:
            continue
        gold = rng.randrange(2)
        docs.append({"context": context, "choices": [shuffled, true] if gold else [true, shuffled], "gold": gold})
    return docs


def build_tasks(docs: list[list[int]], args: TasksArgs, tokenizer: Any) -> dict[str, list[dict[str, Any]]]:
    """task name -> its lm-eval documents; each kind has its own seeded generator."""
    pairs = spans(docs, args, tokenizer)
    random.Random(args.seed).shuffle(pairs)
    makers = {"continuation": continuation_docs, "shuffled": shuffled_docs}
    out = {}
    for kind in args.kinds:
        made = makers[kind](pairs, args, random.Random(f"{args.seed}-{kind}"))
        if not made:
            raise LRCError(f"--data {args.data}: too few documents of "
                           f"{args.prefix_tokens + CUT_SEARCH + args.continuation_tokens}+ tokens for the {kind} task "
                           f"({len(pairs)} long enough, of {len(docs)})")
        out[f"heldout_{kind}"] = made
    return out


# ---------------------------------------------------------------------------------------
# The command


def write_tasks(tasks: dict[str, list[dict[str, Any]]], args: TasksArgs, documents: int) -> None:
    suite = {"name": "heldout", "aggregate": "Avg", "tasks": {}}
    with atomic_dir(args.out) as tmp:
        for name, docs in tasks.items():
            (tmp / f"{name}.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs),
                                               encoding="utf-8")
            config = task_template()
            config["task"] = name
            # The final absolute path, so lm-eval run by hand finds it (`lrc evaluate` re-points it).
            config["dataset_kwargs"]["data_files"]["test"] = str((args.out / f"{name}.jsonl").resolve())
            (tmp / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            choices = len(docs[0]["choices"])
            suite["tasks"][name] = {"metric": "acc", "choices": choices, "chance": 1.0 / choices, "docs": len(docs)}
        (tmp / SUITE_FILE).write_text(yaml.safe_dump(suite, sort_keys=False))
        write_settings(tmp, "tasks", args, documents=documents, tasks=suite["tasks"])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(TasksArgs, argv, prog="lrc tasks")
    tokenizer = load_tokenizer(args.tokenizer)
    docs = load_documents(args, tokenizer)
    tasks = build_tasks(docs, args, tokenizer)
    write_tasks(tasks, args, len(docs))
    print(f"tasks: wrote {args.out} ({', '.join(f'{k} {len(v)}' for k, v in tasks.items())}; from "
          f"{len(docs)} documents)")
    return 0
