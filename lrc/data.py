"""Token directories: corpora tokenised once, memory-mapped by the training loop.

A token directory holds ``tokens.bin`` (a ``[rows, seq_len]`` array of ``uint16`` or
``uint32``), ``loss_mask.bin`` for chat data (``uint8``, 1 on assistant tokens) and
``manifest.json`` (tokenizer name and fingerprint, dtype, shape, source, content hash).
`lrc tokenize` writes ``OUT/train`` and ``OUT/valid``; :class:`TokenDataset` reads one.

Plain text follows the LRC recipe: each document becomes ``eos + text + bos``, tokenised
without special tokens, concatenated and cut into rows of ``seq_len`` (the tail that does
not fill a row is dropped). Chat data is rendered with the tokenizer's own chat template.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Sequence

import numpy as np
import torch

from lrc.errors import LRCError

TOKENS_FILE = "tokens.bin"
MASK_FILE = "loss_mask.bin"
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
LOCAL_SUFFIXES = (".jsonl", ".json", ".txt", ".parquet")


# ---------------------------------------------------------------------------------------
# Tokenizer identity


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of the token -> id map (added tokens included): equal iff ids mean the same."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def _tokenizer_record(tokenizer: Any) -> dict[str, Any] | None:
    if tokenizer is None:
        return None
    return {
        "name": str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
        "fingerprint": tokenizer_fingerprint(tokenizer),
        "vocab_size": len(tokenizer),
    }


def load_tokenizer(path_or_id: str | os.PathLike) -> Any:
    """AutoTokenizer from a local directory (or a hub id when online); never remote code."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path_or_id), trust_remote_code=False)
    except Exception as err:  # transformers raises OSError/ValueError/HF errors alike
        raise LRCError(f"cannot load tokenizer {str(path_or_id)!r}: {err}") from err


# ---------------------------------------------------------------------------------------
# Writing


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


class _TokenWriter:
    """Appends rows to a token directory under a temporary name; `commit` renames it.

    Used as a context manager: on any error the temporary directory is removed, so no
    partial token file is ever left where a reader would find it.
    """

    def __init__(self, directory: str | os.PathLike, *, seq_len: int, vocab_size: int,
                 with_mask: bool, tokenizer: Any = None, source: str = "", cap: int | None = None) -> None:
        self.final = Path(directory)
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.", suffix=".tmp", dir=self.final.parent))
        self.seq_len, self.vocab_size, self.with_mask = seq_len, vocab_size, with_mask
        self.dtype = _token_dtype(vocab_size)
        self.tokenizer, self.source = tokenizer, source
        self.rows, self.max_id, self.cap = 0, -1, cap
        self.hash = hashlib.sha256()
        self._tokens = open(self.tmp / TOKENS_FILE, "wb")
        self._mask = open(self.tmp / MASK_FILE, "wb") if with_mask else None

    @property
    def full(self) -> bool:
        return self.cap is not None and self.rows >= self.cap

    def append(self, rows: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Append rows; rows beyond ``cap`` are dropped."""
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != self.seq_len:
            raise LRCError(f"token rows must have shape [n, {self.seq_len}], got {list(rows.shape)}")
        if self.cap is not None:
            keep = max(0, self.cap - self.rows)
            rows = rows[:keep]
            mask = None if mask is None else np.asarray(mask)[:keep]
        if rows.size and (rows.min() < 0 or rows.max() >= self.vocab_size):
            raise LRCError(f"token ids must lie in [0, {self.vocab_size}), got [{rows.min()}, {rows.max()}]")
        data = rows.astype(self.dtype).tobytes()
        self._tokens.write(data)
        self.hash.update(data)
        if self.with_mask:
            if mask is None or np.shape(mask) != rows.shape:
                raise LRCError(f"loss_mask must have the shape of the token rows {list(rows.shape)}")
            mbytes = np.asarray(mask).astype(np.uint8).tobytes()
            self._mask.write(mbytes)
            self.hash.update(mbytes)
        self.rows += rows.shape[0]
        if rows.size:
            self.max_id = max(self.max_id, int(rows.max()))

    def commit(self) -> Path:
        self._close()
        if self.rows == 0:
            raise LRCError(f"no complete row of {self.seq_len} tokens for {self.final} (source {self.source!r} is empty or too short)")
        manifest = {
            "format": FORMAT_VERSION,
            "tokenizer": _tokenizer_record(self.tokenizer),
            "dtype": self.dtype.name,
            "rows": self.rows,
            "seq_len": self.seq_len,
            "tokens": self.rows * self.seq_len,
            "vocab_size": self.vocab_size,
            "max_token_id": self.max_id,
            "loss_mask": self.with_mask,
            "source": self.source,
            "content_hash": self.hash.hexdigest(),
        }
        (self.tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        _replace_dir(self.tmp, self.final)
        return self.final

    def _close(self) -> None:
        self._tokens.close()
        if self._mask is not None:
            self._mask.close()

    def __enter__(self) -> "_TokenWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._close()
            shutil.rmtree(self.tmp, ignore_errors=True)


def _replace_dir(tmp: Path, final: Path) -> None:
    """Move ``tmp`` to ``final``; an existing ``final`` is swapped out, then deleted."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(old)
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_tokens(directory: str | os.PathLike, rows: np.ndarray, *, loss_mask: np.ndarray | None = None,
                 tokenizer: Any = None, source: str = "") -> Path:
    """Write a ``[rows, seq_len]`` id array (and optional mask) as a token directory, atomically."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] == 0:
        raise LRCError(f"write_tokens needs a non-empty [rows, seq_len] array, got shape {list(rows.shape)}")
    vocab = len(tokenizer) if tokenizer is not None else int(rows.max()) + 1
    with _TokenWriter(directory, seq_len=rows.shape[1], vocab_size=vocab, with_mask=loss_mask is not None,
                      tokenizer=tokenizer, source=source) as writer:
        writer.append(rows, loss_mask)
        return writer.commit()


# ---------------------------------------------------------------------------------------
# Reading


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / MANIFEST_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LRCError(f"{directory} is not a token directory: {MANIFEST_FILE} is missing") from None
    except (OSError, json.JSONDecodeError) as err:
        raise LRCError(f"cannot read {path}: {err}") from err


class TokenDataset(torch.utils.data.Dataset):
    """The rows of a token directory, memory-mapped (opened lazily in each worker).

    ``expect_tokenizer`` (a tokenizer, a tokenizer directory or a fingerprint string)
    makes the constructor refuse a directory built with a different tokenizer.
    """

    def __init__(self, directory: str | os.PathLike, expect_tokenizer: Any = None) -> None:
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        m = self.manifest
        self.seq_len, self.rows = int(m["seq_len"]), int(m["rows"])
        self.dtype = np.dtype(m["dtype"])
        self.has_mask = bool(m.get("loss_mask"))
        self._check_sizes()
        if expect_tokenizer is not None:
            self._check_tokenizer(expect_tokenizer)
        self._tokens: np.ndarray | None = None
        self._mask: np.ndarray | None = None

    @property
    def vocab_size(self) -> int:
        """Vocabulary the ids were drawn from (the tokenizer's length when one was recorded)."""
        return int(self.manifest["vocab_size"])

    @property
    def max_token_id(self) -> int:
        return int(self.manifest["max_token_id"])

    @property
    def tokenizer_fingerprint(self) -> str | None:
        tok = self.manifest.get("tokenizer")
        return tok["fingerprint"] if tok else None

    def _check_sizes(self) -> None:
        files = [(TOKENS_FILE, self.dtype.itemsize)] + ([(MASK_FILE, 1)] if self.has_mask else [])
        for name, itemsize in files:
            path = self.directory / name
            expected = self.rows * self.seq_len * itemsize
            actual = path.stat().st_size if path.exists() else None
            if actual != expected:
                raise LRCError(f"{path}: expected {expected} bytes for {self.rows} x {self.seq_len} rows, found {actual}")

    def _check_tokenizer(self, expected: Any) -> None:
        if isinstance(expected, (str, os.PathLike)) and Path(expected).is_dir():
            expected = load_tokenizer(expected)
        want = expected if isinstance(expected, str) else tokenizer_fingerprint(expected)
        want_name = expected if isinstance(expected, str) else getattr(expected, "name_or_path", "?")
        have = self.manifest.get("tokenizer") or {}
        if have.get("fingerprint") != want:
            raise LRCError(
                f"token directory {self.directory} was built with tokenizer {have.get('name', 'unknown')!r} "
                f"(fingerprint {have.get('fingerprint')}), not with the expected tokenizer {want_name!r} "
                f"(fingerprint {want}); re-run `lrc tokenize` with the right tokenizer")

    def _open(self) -> None:
        shape = (self.rows, self.seq_len)
        self._tokens = np.memmap(self.directory / TOKENS_FILE, dtype=self.dtype, mode="r", shape=shape)
        if self.has_mask:
            self._mask = np.memmap(self.directory / MASK_FILE, dtype=np.uint8, mode="r", shape=shape)

    def __getstate__(self) -> dict[str, Any]:
        # Workers reopen the map themselves; pickling a memmap would copy the whole file.
        state = dict(self.__dict__)
        state["_tokens"] = state["_mask"] = None
        return state

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self._tokens is None:
            self._open()
        if not -self.rows <= index < self.rows:
            raise IndexError(f"row {index} out of range for {self.rows} rows")
        ids = torch.from_numpy(np.array(self._tokens[index], dtype=np.int64))
        if self._mask is not None:
            mask = torch.from_numpy(np.array(self._mask[index], dtype=np.bool_))
        else:
            mask = torch.ones(self.seq_len, dtype=torch.bool)
        return {"input_ids": ids, "loss_mask": mask}


def check_vocab(dataset: TokenDataset | int, model: Any) -> None:
    """Refuse data whose vocabulary does not fit ``model``'s input embedding (or a row count).

    ``dataset`` is a :class:`TokenDataset` or a vocabulary size; ``model`` a model or an int.
    """
    vocab = dataset.vocab_size if isinstance(dataset, TokenDataset) else int(dataset)
    where = f"token directory {dataset.directory}" if isinstance(dataset, TokenDataset) else "the tokenizer"
    if isinstance(model, int):
        rows, what = model, f"an embedding of {model} rows"
    else:
        rows = model.get_input_embeddings().weight.shape[0]
        what = f"the model's embedding ({rows} rows, {type(model).__name__})"
    if vocab > rows:
        raise LRCError(f"vocabulary of {where} has {vocab} tokens, which does not fit {what}")


# ---------------------------------------------------------------------------------------
# Sources


def is_local_source(source: str) -> bool:
    return Path(source).exists() or source.endswith(LOCAL_SUFFIXES) or source.startswith((".", "/", "~"))


def iter_records(source: str, *, split: str = "train", dataset_config: str | None = None) -> Iterator[dict]:
    """Records (dicts) from a local .jsonl/.json/.txt/.parquet file or a `datasets` hub id.

    A local directory is read by `datasets` like a hub repository (a clone, or a stand-in)."""
    if Path(source).is_dir():
        yield from _iter_hub(source, split=split, dataset_config=dataset_config)
    elif is_local_source(source):
        yield from _iter_local(Path(source).expanduser())
    else:
        yield from _iter_hub(source, split=split, dataset_config=dataset_config)


def _iter_local(path: Path) -> Iterator[dict]:
    if not path.is_file():
        raise LRCError(f"source file not found: {path}")
    if path.suffix not in LOCAL_SUFFIXES:
        raise LRCError(f"source {path}: unsupported file type {path.suffix!r}; use one of {', '.join(LOCAL_SUFFIXES)}")
    try:
        if path.suffix == ".jsonl":
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            yield json.loads(line)
                        except json.JSONDecodeError as err:
                            raise LRCError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
        elif path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, list):
                raise LRCError(f"{path}: a .json source must hold a list of records")
            yield from data
        elif path.suffix == ".txt":
            # Documents are separated by blank lines.
            for doc in path.read_text(encoding="utf-8").split("\n\n"):
                if doc.strip():
                    yield {"text": doc.strip("\n")}
        else:
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                yield from batch.to_pylist()
    except (OSError, UnicodeDecodeError, ValueError) as err:
        if isinstance(err, LRCError):
            raise
        raise LRCError(f"cannot read source file {path}: {err}") from err


def _iter_hub(repo_id: str, *, split: str, dataset_config: str | None) -> Iterator[dict]:
    import datasets

    try:
        ds = datasets.load_dataset(repo_id, dataset_config, split=split, streaming=True)
        iterator = iter(ds)
        first = next(iterator, None)
    except Exception as err:  # offline, unknown id, bad split: all surface here
        raise LRCError(f"cannot load dataset {repo_id!r} (config {dataset_config!r}, split {split!r}) "
                       f"from the hub: {type(err).__name__}: {err}") from err
    if first is not None:
        yield first
        yield from iterator


def _field(record: dict, name: str, source: str) -> Any:
    if not isinstance(record, dict) or name not in record:
        keys = list(record) if isinstance(record, dict) else type(record).__name__
        raise LRCError(f"source {source}: record has no field {name!r} (has {keys}); set --text-field")
    return record[name]


# ---------------------------------------------------------------------------------------
# Documents -> token ids (+ mask)


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """METHOD.md's recipe for one document: eos + text + bos, no special tokens added."""
    return _wrap_document(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"])


def _wrap_document(tokenizer: Any, ids: Sequence[int]) -> list[int]:
    tail = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []  # Qwen has no bos
    return [tokenizer.eos_token_id] + list(ids) + tail


def chat_ids(tokenizer: Any, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
    """Render a conversation with the chat template; mask 1 on the assistant turns' tokens.

    Each assistant turn's span is the text that rendering up to and including it adds to
    the rendering of the conversation before it with the generation prompt; so the header
    the template writes before an answer is not trained on, its end-of-turn token is.
    """
    full = _render(tokenizer, messages, add_generation_prompt=False)
    spans = []
    for k, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        start = len(_render(tokenizer, messages[:k], add_generation_prompt=True)) if k else 0
        upto = _render(tokenizer, messages[: k + 1], add_generation_prompt=False)
        if not full.startswith(upto):
            raise LRCError("the chat template does not render conversations prefix-consistently; cannot locate assistant turns")
        spans.append((start, len(upto)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def _render(tokenizer: Any, messages: Sequence[dict], *, add_generation_prompt: bool) -> str:
    if not messages:
        return ""
    if not getattr(tokenizer, "chat_template", None):
        raise LRCError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; cannot use --chat")
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)


class _Packer:
    """Concatenates token streams and emits full rows of ``seq_len`` (drops the tail)."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len
        self.ids: list[int] = []
        self.mask: list[int] = []

    def add(self, ids: Sequence[int], mask: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray | None] | None:
        self.ids.extend(ids)
        if mask is not None:
            self.mask.extend(mask)
        n = len(self.ids) // self.seq_len
        if n == 0:
            return None
        cut = n * self.seq_len
        rows = np.asarray(self.ids[:cut], dtype=np.int64).reshape(n, self.seq_len)
        masks = None
        if mask is not None:
            masks = np.asarray(self.mask[:cut], dtype=np.uint8).reshape(n, self.seq_len)
            del self.mask[:cut]
        del self.ids[:cut]
        return rows, masks


def _pad_row(ids: list[int], mask: list[int], seq_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    ids, mask = ids[:seq_len], mask[:seq_len]
    fill = seq_len - len(ids)
    return (np.asarray(ids + [pad_id] * fill, dtype=np.int64)[None],
            np.asarray(mask + [0] * fill, dtype=np.uint8)[None])


def _in_valid(index: int, fraction: float) -> bool:
    # A fixed hash of the document index: a deterministic, streaming-friendly split.
    return zlib.crc32(index.to_bytes(8, "little")) / 2**32 < fraction


# ---------------------------------------------------------------------------------------
# The command


@dataclass(kw_only=True)
class TokenizeArgs:
    """Tokenise a corpus (or a chat set with --chat) into OUT/train and OUT/valid token directories."""

    tokenizer: str = field(metadata={"help": "tokenizer directory (or hub id) whose ids to write"})
    source: str = field(metadata={"help": "local .jsonl/.json/.txt/.parquet file, a `datasets` hub id, or a local dataset repository directory"})
    out: Path = field(metadata={"help": "output directory; gets train/ and valid/"})
    seq_len: int = field(metadata={"help": "tokens per row"})
    valid_source: str | None = field(default=None, metadata={"help": "a separate source for valid/ (else split off --source)"})
    split: str = field(default="train", metadata={"help": "dataset split (hub sources)"})
    dataset_config: str | None = field(default=None, metadata={"help": "dataset configuration name (hub sources)"})
    text_field: str = field(default="text", metadata={"help": "record field holding the document text"})
    messages_field: str = field(default="messages", metadata={"help": "record field holding the conversation (--chat)"})
    chat: bool = field(default=False, metadata={"help": "chat data: render with the chat template, mask = assistant tokens"})
    chat_layout: Literal["pack", "pad"] = field(default="pack", metadata={"help": "chat rows: pack conversations, or one padded (truncated) conversation per row"})
    max_tokens: int | None = field(default=None, metadata={"help": "stop when train/ holds this many tokens"})
    valid_fraction: float = field(default=0.01, metadata={"help": "fraction of documents split off into valid/ (no --valid-source)"})
    valid_rows: int | None = field(default=None, metadata={"help": "instead: the first documents fill this many valid rows"})
    model_vocab: int | None = field(default=None, metadata={"help": "refuse a tokenizer larger than this embedding size"})

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise LRCError(f"--seq-len must be at least 2, got {self.seq_len}")
        if not 0.0 < self.valid_fraction < 1.0:
            raise LRCError(f"--valid-fraction must lie in (0, 1), got {self.valid_fraction}")
        if self.valid_rows is not None and self.valid_rows < 1:
            raise LRCError(f"--valid-rows must be positive, got {self.valid_rows}")
        if self.max_tokens is not None and self.max_tokens < self.seq_len:
            raise LRCError(f"--max-tokens ({self.max_tokens}) is less than one row of --seq-len {self.seq_len}")


def _documents(args: TokenizeArgs, tokenizer: Any, source: str) -> Iterator[tuple[list[int], list[int] | None]]:
    records = iter_records(source, split=args.split, dataset_config=args.dataset_config)
    if args.chat:
        for record in records:
            messages = _field(record, args.messages_field, source)
            if not isinstance(messages, list) or not messages:
                raise LRCError(f"source {source}: field {args.messages_field!r} must be a non-empty list of messages")
            yield chat_ids(tokenizer, messages)
        return
    for texts in _batched(_texts(records, args.text_field, source), 256):
        # Batched calls let the fast tokenizer use its own threads.
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            yield _wrap_document(tokenizer, ids), None


def _texts(records: Iterable[dict], name: str, source: str) -> Iterator[str]:
    for record in records:
        text = _field(record, name, source)
        if not isinstance(text, str):
            raise LRCError(f"source {source}: field {name!r} must be a string, got {type(text).__name__}")
        if text:
            yield text


def _batched(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def tokenize(args: TokenizeArgs) -> dict[str, Path]:
    """Run `lrc tokenize`; returns the written ``train`` and ``valid`` directories."""
    tokenizer = load_tokenizer(args.tokenizer)
    if tokenizer.eos_token_id is None:
        raise LRCError(f"tokenizer {args.tokenizer!r} has no eos token; the corpus recipe needs one")
    if args.model_vocab is not None:
        check_vocab(len(tokenizer), args.model_vocab)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = Path(args.out)
    common = dict(seq_len=args.seq_len, vocab_size=len(tokenizer), with_mask=args.chat, tokenizer=tokenizer)
    train_cap = args.max_tokens // args.seq_len if args.max_tokens else None
    with (_TokenWriter(out / "train", source=args.source, cap=train_cap, **common) as train,
          _TokenWriter(out / "valid", source=args.valid_source or args.source, cap=args.valid_rows, **common) as valid):
        writers = {"train": train, "valid": valid}
        packers = {"train": _Packer(args.seq_len), "valid": _Packer(args.seq_len)}

        def feed(which: str, ids: list[int], mask: list[int] | None) -> None:
            if args.chat and args.chat_layout == "pad":
                writers[which].append(*_pad_row(ids, mask, args.seq_len, pad_id))
                return
            got = packers[which].add(ids, mask)
            if got is not None:
                writers[which].append(*got)

        for i, (ids, mask) in enumerate(_documents(args, tokenizer, args.source)):
            if args.valid_source is not None:
                which = "train"
            elif args.valid_rows is not None:
                which = "train" if valid.full else "valid"
            else:
                which = "valid" if _in_valid(i, args.valid_fraction) else "train"
            feed(which, ids, mask)
            if train.full:
                break
        if args.valid_source is not None:
            for ids, mask in _documents(args, tokenizer, args.valid_source):
                feed("valid", ids, mask)
                if valid.full:
                    break
        if train.rows == 0 and valid.rows == 0:
            raise LRCError(f"source {args.source!r} gave no complete row of {args.seq_len} tokens (empty corpus?)")
        if valid.rows == 0:
            raise LRCError(f"no validation rows from {args.valid_source or args.source!r}: "
                           "raise --valid-fraction or --valid-rows, or give --valid-source")
        if train.rows == 0:
            raise LRCError(f"source {args.source!r}: no training rows left after the validation split")
        # Commit only once both are complete, so a failure leaves neither behind.
        return {"train": train.commit(), "valid": valid.commit()}


def main(argv: Sequence[str] | None = None) -> int:
    from lrc.cli import parse_args
    from lrc.provenance import write_settings

    args = parse_args(TokenizeArgs, argv, prog="lrc tokenize")
    written = tokenize(args)
    manifests = {k: read_manifest(v) for k, v in written.items()}
    write_settings(args.out, "tokenize", args, rows={k: m["rows"] for k, m in manifests.items()},
                   tokens={k: m["tokens"] for k, m in manifests.items()})
    for k, m in manifests.items():
        print(f"{written[k]}: {m['rows']} rows x {m['seq_len']} tokens ({m['dtype']})")
    return 0
