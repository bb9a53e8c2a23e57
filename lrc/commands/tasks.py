"""`lrc tasks`: multiple-choice lm-eval tasks built offline, from held-out real text and from
knowledge tables of Python's standard library.

Held-out kinds (seeded, so the same data, tokenizer and seed give the same directory):

* ``heldout_continuation``: ``--prefix-tokens`` tokens of a held-out document as context; the
  choices are its next ``--continuation-tokens`` tokens and, as distractors, spans of
  ``--choices - 1`` other held-out documents. Chance 1/choices. With ``--stride 0`` one window
  per document (at its start); with ``--stride S`` a window every S tokens through each
  document (sliding contexts: thousands of items from a modest held-out split).
* ``heldout_shuffled``: the same contexts; the true continuation against the same words in a
  shuffled order (whitespace kept in place). Chance 1/2.

Knowledge kinds (no ``--data``): ``http_status``, ``html_entity``, ``time_zone``, every fact of
the table, the true answer among other answers of it; ``docstring_name``, a docstring's first line
-> the object's name among names of its module, from ``--modules`` (default: the modules the
stdlib-docstring corpus holds out at ``--valid-fraction``); ``code_next_line``, the next line of
those modules' source after 8 lines, against other lines of the file, one item every ``--stride``
lines (8 where it is 0) (:mod:`lrc.io.knowledge_tasks`).
The gold position of every task is balanced: each position equally often, up to one.

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
from lrc.io.knowledge_tasks import (
    TABLES,
    balanced_golds,
    code_next_line_task,
    docstring_name_task,
    heldout_stdlib_modules,
    knowledge_task,
)
from lrc.io.provenance import write_settings
from lrc.io.sources import BUILTIN_SOURCES
from lrc.io.suites import SUITE_FILE, task_template
from lrc.io.tokens import TokenDataset, read_manifest
from lrc.options import parse_args

HELDOUT_KINDS = ("continuation", "shuffled")
MODULE_KINDS = ("docstring_name", "code_next_line")
KINDS = HELDOUT_KINDS + tuple(TABLES) + MODULE_KINDS
CUT_SEARCH = 8  # tokens after the nominal cut searched for one that starts with whitespace


@dataclass(kw_only=True)
class TasksArgs:
    """Write a local lm-eval task directory from held-out documents (true continuation vs. other
    documents', vs. shuffled words)."""

    data: Path | None = field(default=None, metadata={
        "help": "held-out token directory (valid/ of `lrc tokenize`, or its output directory), a .jsonl/.txt "
                "text file, or python-package-docs (needed by the continuation and shuffled kinds)"})
    tokenizer: str = field(metadata={
        "help": "tokenizer directory (the teacher's): decodes token rows, measures spans in tokens"})
    out: Path = field(metadata={"help": "task directory to write", "output": "dir"})
    kinds: list[str] = field(default_factory=lambda: list(HELDOUT_KINDS), metadata={
        "help": f"task kinds: {', '.join(KINDS)}"})
    items: int = field(default=200, metadata={"help": "questions per held-out or code_next_line task at most"})
    stride: int = field(default=0, metadata={
        "help": "held-out kinds: 0 for one window per document (at its start), else a window every STRIDE tokens"})
    choices: int = field(default=4, metadata={"help": "choices of the continuation task (1 true + distractors)"})
    prefix_tokens: int = field(default=48, metadata={"help": "context length in tokens"})
    continuation_tokens: int = field(default=16, metadata={"help": "length of each choice in tokens"})
    modules: list[str] | None = field(default=None, metadata={
        "help": "docstring_name, code_next_line: the modules to ask about (default: those the stdlib-docstring "
                "corpus holds out)"})
    valid_fraction: float = field(default=0.1, metadata={
        "help": "without --modules: the corpus's held-out share (`lrc tokenize --valid-fraction`)"})
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
        if not 0.0 < self.valid_fraction < 1.0:
            raise LRCError(f"--valid-fraction must lie in (0, 1), got {self.valid_fraction}")
        if self.stride < 0:
            raise LRCError(f"--stride must be >= 0 (0: one window per document), got {self.stride}")
        if self.data is None and any(k in HELDOUT_KINDS for k in self.kinds):
            raise LRCError(f"--kinds {' '.join(self.kinds)}: the held-out kinds need --data")


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
    if str(args.data) in BUILTIN_SOURCES:
        if str(args.data) == "python-stdlib-docs":
            raise LRCError("--data python-stdlib-docs is a training corpus; give its held-out split (valid/ of "
                           "`lrc tokenize`), or python-package-docs, which the stdlib corpus never sees")
        texts = [r["text"] for r in BUILTIN_SOURCES[str(args.data)]()]
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
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


def spans(docs: list[list[int]], args: TasksArgs, tokenizer: Any) -> list[tuple[int, str, str]]:
    """(document, context, continuation) of every window: one per document long enough (``--stride
    0``), or one every ``--stride`` tokens; a context is the ``--prefix-tokens`` tokens before a cut."""
    out = []
    for doc, ids in enumerate(docs):
        at = args.prefix_tokens
        while at + CUT_SEARCH + args.continuation_tokens <= len(ids):
            cut = cut_point(ids, at, tokenizer)
            start = 0 if args.stride == 0 else cut - args.prefix_tokens
            context = tokenizer.decode(ids[start:cut], clean_up_tokenization_spaces=False)
            continuation = tokenizer.decode(ids[cut:cut + args.continuation_tokens], clean_up_tokenization_spaces=False)
            if context.strip() and continuation.strip():
                out.append((doc, context, continuation))
            if args.stride == 0:
                break
            at += args.stride
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


def distractors(pairs: list[tuple[int, str, str]], i: int, count: int, rng: random.Random) -> list[str] | None:
    """``count`` distinct continuations of documents other than window ``i``'s, none equal to its own."""
    doc, _, true = pairs[i]
    chosen: dict[str, None] = {}
    # Random draws first (cheap where most windows are of other documents), then a full scan.
    draws = [rng.randrange(len(pairs)) for _ in range(8 * count)]
    for j in draws + rng.sample(range(len(pairs)), len(pairs)):
        if pairs[j][0] != doc and pairs[j][2] != true:
            chosen.setdefault(pairs[j][2])
            if len(chosen) == count:
                return list(chosen)
    return None


def continuation_docs(pairs: list[tuple[int, str, str]], args: TasksArgs, rng: random.Random) -> list[dict[str, Any]]:
    docs = []
    golds = balanced_golds(min(args.items, len(pairs)), args.choices, rng)
    for i, gold in enumerate(golds):
        choices = distractors(pairs, i, args.choices - 1, rng)
        if choices is None:
            break
        choices.insert(gold, pairs[i][2])
        docs.append({"context": pairs[i][1], "choices": choices, "gold": gold})
    return docs


def shuffled_docs(pairs: list[tuple[int, str, str]], args: TasksArgs, rng: random.Random) -> list[dict[str, Any]]:
    kept = []
    for _, context, true in pairs:
        if len(kept) == args.items:
            break
        shuffled = shuffle_words(true, rng)
        if shuffled is not None:
            kept.append((context, true, shuffled))
    return [{"context": context, "choices": [shuffled, true] if gold else [true, shuffled], "gold": gold}
            for (context, true, shuffled), gold in zip(kept, balanced_golds(len(kept), 2, rng))]


def build_tasks(docs: list[list[int]], args: TasksArgs, tokenizer: Any) -> dict[str, list[dict[str, Any]]]:
    """task name -> its lm-eval documents; each kind has its own seeded generator."""
    out = {kind: knowledge_task(kind, args.choices, args.seed) for kind in args.kinds if kind in TABLES}
    modules = args.modules if args.modules is not None else heldout_stdlib_modules(args.valid_fraction)
    if "docstring_name" in args.kinds:
        out["docstring_name"] = docstring_name_task(modules, args.choices, args.seed)
    if "code_next_line" in args.kinds:
        out["code_next_line"] = code_next_line_task(modules, args.choices, args.seed, args.stride or 8, args.items)
    pairs = spans(docs, args, tokenizer)
    random.Random(args.seed).shuffle(pairs)
    makers = {"continuation": continuation_docs, "shuffled": shuffled_docs}
    for kind in [k for k in args.kinds if k in HELDOUT_KINDS]:
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
    docs = load_documents(args, tokenizer) if args.data is not None else []
    tasks = build_tasks(docs, args, tokenizer)
    write_tasks(tasks, args, len(docs))
    print(f"tasks: wrote {args.out} ({', '.join(f'{k} {len(v)}' for k, v in tasks.items())}; from "
          f"{len(docs)} documents)")
    return 0
