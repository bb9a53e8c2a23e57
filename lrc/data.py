"""Token directories: corpora tokenised once, memory-mapped by the training loop.

A token directory holds ``tokens.bin`` (a ``[rows, seq_len]`` array of ``uint16`` or
``uint32``), ``loss_mask.bin`` for chat data (``uint8``, 1 on assistant tokens) and
``manifest.json`` (tokenizer name and fingerprint, dtype, shape, source, content hash).
`lrc tokenize` writes ``OUT/train`` and ``OUT/valid``; :class:`TokenDataset` reads one.

Plain text follows the LRC recipe: each document becomes ``eos + text + bos``, tokenised
without special tokens, concatenated and cut into rows of ``seq_len`` (the tail that does
not fill a row is dropped). Chat data is rendered with the tokenizer's own chat template.

A corpus may mix several sources (``--mixture FILE``, a YAML list of :class:`SourceSpec`
entries): documents are interleaved so that each source's token count tracks its share, a
row filter (``--filter-field``/``--filter-min``) keeps only records scoring at least a
threshold, and each source's dataset revision, filter and counts go into the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Sequence

import numpy as np
import torch

from lrc.atomic import atomic_dir
from lrc.errors import LRCError
from lrc.hf import load_tokenizer  # noqa: F401  (re-exported until the data split)

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


# ---------------------------------------------------------------------------------------
# Writing


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


class _TokenWriter:
    """Appends rows to a token directory under a temporary name; `commit` renames it.

    Used as a context manager (through :func:`lrc.atomic.atomic_dir`): the directory appears
    under its name when the block ends after `commit`; on any error, or without `commit`,
    the temporary directory is removed, so no partial token file is ever left behind.
    """

    def __init__(self, directory: str | os.PathLike, *, seq_len: int, vocab_size: int,
                 with_mask: bool, tokenizer: Any = None, source: str = "", cap: int | None = None) -> None:
        self.final = Path(directory)
        self._atomic = atomic_dir(self.final)
        self.tmp = self._atomic.__enter__()
        self.committed = False
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

    def commit(self, sources: list[dict] | None = None) -> Path:
        """Write the manifest (``sources``: per-source records, see `tokenize`); the
        directory takes its final name when the ``with`` block ends."""
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
        if sources is not None:
            manifest["sources"] = sources
        (self.tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        self.committed = True
        return self.final

    def _close(self) -> None:
        self._tokens.close()
        if self._mask is not None:
            self._mask.close()

    def __enter__(self) -> "_TokenWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._close()
        if exc_type is None and not self.committed:
            exc = LRCError(f"token directory {self.final} was left without a manifest (not committed)")
            self._atomic.__exit__(LRCError, exc, None)
            raise exc
        return bool(self._atomic.__exit__(exc_type, exc, tb))


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


def _is_dataset_repo(source: str) -> bool:
    """A hub id, or a local directory that `datasets` reads like one (a clone, or a stand-in)."""
    return Path(source).is_dir() or not is_local_source(source)


def iter_records(source: str, *, split: str = "train", dataset_config: str | None = None,
                 revision: str | None = None) -> Iterator[dict]:
    """Records (dicts) from a local .jsonl/.json/.txt/.parquet file or a `datasets` hub id
    (``revision``: a branch, tag or commit of the dataset repository)."""
    if _is_dataset_repo(source):
        yield from _iter_hub(source, split=split, dataset_config=dataset_config, revision=revision)
    else:
        if revision is not None:
            raise LRCError(f"source {source}: --revision applies to dataset repositories, not to local files")
        yield from _iter_local(Path(source).expanduser())


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


def _iter_hub(repo_id: str, *, split: str, dataset_config: str | None, revision: str | None) -> Iterator[dict]:
    import datasets

    try:
        ds = datasets.load_dataset(repo_id, dataset_config, split=split, revision=revision, streaming=True)
        iterator = iter(ds)
        first = next(iterator, None)
    except Exception as err:  # offline, unknown id, bad split or revision: all surface here
        raise LRCError(f"cannot load dataset {repo_id!r} (config {dataset_config!r}, split {split!r}, "
                       f"revision {revision!r}) from the hub: {type(err).__name__}: {err}") from err
    if first is not None:
        yield first
        yield from iterator


def _field(record: dict, name: str, source: str, option: str = "--text-field") -> Any:
    """``record[name]``; a dotted name reaches into nested records (``metadata.int_score``)."""
    value = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            keys = list(value) if isinstance(value, dict) else type(value).__name__
            raise LRCError(f"source {source}: record has no field {name!r} ({part!r} not in {keys}); set {option}")
        value = value[part]
    return value


# ---------------------------------------------------------------------------------------
# Source specifications and mixtures


@dataclass(kw_only=True)
class SourceSpec:
    """One source of a corpus: where to read it, which records to keep, its share of tokens.

    The keys of a mixture file's entries are these field names (the `lrc tokenize` flags)."""

    source: str
    split: str = "train"
    dataset_config: str | None = None
    revision: str | None = None
    text_field: str = "text"
    messages_field: str = "messages"
    # In a mixture: render the conversation with the chat template into one document's text.
    chat: bool = False
    filter_field: str | None = None
    filter_min: float | None = None
    share: float = 1.0

    def check(self, where: str) -> None:
        strings = {"source": False, "split": False, "dataset_config": True, "revision": True,
                   "text_field": False, "messages_field": False, "filter_field": True}
        for name, optional in strings.items():
            value = getattr(self, name)
            if not (isinstance(value, str) and value) and not (optional and value is None):
                raise LRCError(f"{where}: {name} must be a non-empty string, got {value!r}")
        if not isinstance(self.chat, bool):
            raise LRCError(f"{where}: chat must be true or false, got {self.chat!r}")
        for name in ("share", "filter_min"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise LRCError(f"{where}: {name} must be a number, got {value!r}")
        if not self.share > 0:
            raise LRCError(f"{where}: share must be positive, got {self.share}")
        if (self.filter_field is None) != (self.filter_min is None):
            raise LRCError(f"{where}: give filter_field and filter_min together (keep records with field >= min)")
        if self.revision is not None and not _is_dataset_repo(self.source):
            raise LRCError(f"{where}: revision applies to dataset repositories, not to the local file {self.source}")

    def keeps(self, record: dict) -> bool:
        """The row filter: a record passes if its ``filter_field`` is at least ``filter_min``."""
        if self.filter_field is None:
            return True
        value = _field(record, self.filter_field, self.source, option="--filter-field")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LRCError(f"source {self.source}: filter field {self.filter_field!r} must be a number, "
                           f"got {type(value).__name__} {value!r}")
        return value >= self.filter_min


def load_mixture(path: str | os.PathLike) -> list[SourceSpec]:
    """The sources of a mixture file: YAML ``sources:`` list of :class:`SourceSpec` entries."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise LRCError(f"cannot read mixture file {path}: {err}") from err
    entries = data.get("sources") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise LRCError(f"mixture file {path}: expected a mapping with a non-empty list 'sources'")
    known = {f.name for f in fields(SourceSpec)}
    specs = []
    for i, entry in enumerate(entries):
        name = entry.get("source") if isinstance(entry, dict) else None
        where = f"mixture file {path}: sources[{i}] ({name or 'no source'})"
        if not isinstance(entry, dict) or not name:
            raise LRCError(f"{where}: each entry must be a mapping with a 'source'")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise LRCError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
        spec = SourceSpec(**entry)
        spec.check(where)
        specs.append(spec)
    return specs


def _mix(streams: Sequence[Iterator[Any]], shares: Sequence[float],
         size: Any = len) -> Iterator[tuple[int, Any]]:
    """Interleave document streams so each one's token count tracks its share.

    The next document always comes from the source furthest below its share (the first
    listed on a tie), so no source is ever more than one document off its target. A source
    that runs out drops out; the others fill the rest (its count shows in the manifest).
    """
    taken = [0] * len(streams)
    live = list(range(len(streams)))
    while live:
        k = min(live, key=lambda j: taken[j] / shares[j])
        item = next(streams[k], None)
        if item is None:
            live.remove(k)
            continue
        taken[k] += size(item)
        yield k, item


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
    source: str | None = field(default=None, metadata={"help": "local .jsonl/.json/.txt/.parquet file, a `datasets` hub id, or a local dataset repository directory (or give --mixture)"})
    mixture: Path | None = field(default=None, metadata={"help": "instead of --source: YAML file whose 'sources' list mixes several sources (keys: source, split, dataset_config, revision, text_field, messages_field, chat, filter_field, filter_min, share)"})
    out: Path = field(metadata={"help": "output directory; gets train/ and valid/"})
    seq_len: int = field(metadata={"help": "tokens per row"})
    valid_source: str | None = field(default=None, metadata={"help": "a separate source for valid/ (else split off --source)"})
    split: str = field(default="train", metadata={"help": "dataset split (hub sources)"})
    dataset_config: str | None = field(default=None, metadata={"help": "dataset configuration name (hub sources)"})
    revision: str | None = field(default=None, metadata={"help": "dataset revision: branch, tag or commit (hub sources)"})
    filter_field: str | None = field(default=None, metadata={"help": "keep only records whose numeric field (dotted for nested, e.g. metadata.int_score) is >= --filter-min"})
    filter_min: float | None = field(default=None, metadata={"help": "threshold of --filter-field"})
    text_field: str = field(default="text", metadata={"help": "record field holding the document text"})
    messages_field: str = field(default="messages", metadata={"help": "record field holding the conversation (--chat)"})
    chat: bool = field(default=False, metadata={"help": "chat data: render with the chat template, mask = assistant tokens"})
    chat_layout: Literal["pack", "pad"] = field(default="pack", metadata={"help": "chat rows: pack conversations, or one padded (truncated) conversation per row"})
    max_tokens: int | None = field(default=None, metadata={"help": "stop when train/ holds this many tokens"})
    valid_fraction: float = field(default=0.01, metadata={"help": "fraction of documents split off into valid/ (no --valid-source)"})
    valid_rows: int | None = field(default=None, metadata={"help": "instead: the first documents fill this many valid rows"})
    model_vocab: int | None = field(default=None, metadata={"help": "refuse a tokenizer larger than this embedding size"})

    def __post_init__(self) -> None:
        if (self.source is None) == (self.mixture is None):
            raise LRCError("give exactly one of --source and --mixture")
        if self.mixture is not None and (self.chat or self.valid_source is not None):
            raise LRCError("--mixture builds a plain-text corpus: it takes neither --chat nor --valid-source "
                           "(mark chat sources with 'chat: true' in the mixture file)")
        if self.source is not None:
            self.spec(self.source).check("lrc tokenize")
        if self.seq_len < 2:
            raise LRCError(f"--seq-len must be at least 2, got {self.seq_len}")
        if not 0.0 < self.valid_fraction < 1.0:
            raise LRCError(f"--valid-fraction must lie in (0, 1), got {self.valid_fraction}")
        if self.valid_rows is not None and self.valid_rows < 1:
            raise LRCError(f"--valid-rows must be positive, got {self.valid_rows}")
        if self.max_tokens is not None and self.max_tokens < self.seq_len:
            raise LRCError(f"--max-tokens ({self.max_tokens}) is less than one row of --seq-len {self.seq_len}")


    def spec(self, source: str) -> SourceSpec:
        """A source read with the per-source flags given on the command line."""
        return SourceSpec(source=source, split=self.split, dataset_config=self.dataset_config,
                          revision=self.revision, text_field=self.text_field, messages_field=self.messages_field,
                          chat=self.chat, filter_field=self.filter_field, filter_min=self.filter_min)

    def specs(self) -> list[SourceSpec]:
        return load_mixture(self.mixture) if self.mixture is not None else [self.spec(self.source)]


def _documents(spec: SourceSpec, tokenizer: Any, *, masked_chat: bool) -> Iterator[tuple[list[int], list[int] | None]]:
    """Token ids of each kept record: with ``masked_chat`` (SFT data) a rendered conversation
    and its assistant mask; otherwise ``eos + text + bos``, where a chat source's text is its
    conversation rendered with the chat template."""
    if spec.chat and not getattr(tokenizer, "chat_template", None):
        raise LRCError(f"source {spec.source}: a chat source needs a tokenizer with a chat template; "
                       f"{getattr(tokenizer, 'name_or_path', '')!r} has none")
    records = (r for r in iter_records(spec.source, split=spec.split, dataset_config=spec.dataset_config,
                                       revision=spec.revision) if spec.keeps(r))
    if masked_chat:
        for record in records:
            yield chat_ids(tokenizer, _messages(record, spec))
        return
    for texts in _batched(_texts(records, spec, tokenizer), 256):
        # Batched calls let the fast tokenizer use its own threads.
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            yield _wrap_document(tokenizer, ids), None


def _texts(records: Iterable[dict], spec: SourceSpec, tokenizer: Any) -> Iterator[str]:
    for record in records:
        if spec.chat:
            text = _render(tokenizer, _messages(record, spec), add_generation_prompt=False)
        else:
            text = _field(record, spec.text_field, spec.source)
            if not isinstance(text, str):
                raise LRCError(f"source {spec.source}: field {spec.text_field!r} must be a string, got {type(text).__name__}")
        if text:
            yield text


# ShareGPT-style turns ({"from": "human", "value": ...}, as in OpenHermes-2.5) -> chat-template roles.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def _messages(record: dict, spec: SourceSpec) -> list[dict]:
    messages = _field(record, spec.messages_field, spec.source, option="--messages-field")
    if not isinstance(messages, list) or not messages:
        raise LRCError(f"source {spec.source}: field {spec.messages_field!r} must be a non-empty list of messages")
    out = []
    for msg in messages:
        if isinstance(msg, dict) and "role" in msg and "content" in msg:
            out.append(msg)
        elif isinstance(msg, dict) and msg.get("from") in SHAREGPT_ROLES and "value" in msg:
            out.append({"role": SHAREGPT_ROLES[msg["from"]], "content": msg["value"]})
        else:
            raise LRCError(f"source {spec.source}: a message in {spec.messages_field!r} is neither "
                           f"{{role, content}} nor {{from: {'/'.join(SHAREGPT_ROLES)}, value}}: {str(msg)[:200]}")
    return out


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
    specs = args.specs()
    valid_specs = [args.spec(args.valid_source)] if args.valid_source is not None else specs
    name = args.source or str(args.mixture)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = Path(args.out)
    common = dict(seq_len=args.seq_len, vocab_size=len(tokenizer), with_mask=args.chat, tokenizer=tokenizer)
    train_cap = args.max_tokens // args.seq_len if args.max_tokens else None
    # Per split and source: documents and their tokens (before cutting into rows).
    counts = {"train": [[0, 0] for _ in specs], "valid": [[0, 0] for _ in valid_specs]}

    def stream(which_specs: list[SourceSpec]) -> Iterator[tuple[int, tuple[list[int], list[int] | None]]]:
        docs = [_documents(s, tokenizer, masked_chat=args.chat) for s in which_specs]
        return _mix(docs, [s.share for s in which_specs], size=lambda doc: len(doc[0]))

    with (_TokenWriter(out / "train", source=name, cap=train_cap, **common) as train,
          _TokenWriter(out / "valid", source=args.valid_source or name, cap=args.valid_rows, **common) as valid):
        writers = {"train": train, "valid": valid}
        packers = {"train": _Packer(args.seq_len), "valid": _Packer(args.seq_len)}

        def feed(which: str, k: int, ids: list[int], mask: list[int] | None) -> None:
            counts[which][k][0] += 1
            counts[which][k][1] += len(ids)
            if args.chat and args.chat_layout == "pad":
                writers[which].append(*_pad_row(ids, mask, args.seq_len, pad_id))
                return
            got = packers[which].add(ids, mask)
            if got is not None:
                writers[which].append(*got)

        for i, (k, (ids, mask)) in enumerate(stream(specs)):
            if args.valid_source is not None:
                which = "train"
            elif args.valid_rows is not None:
                which = "train" if valid.full else "valid"
            else:
                which = "valid" if _in_valid(i, args.valid_fraction) else "train"
            feed(which, k, ids, mask)
            if train.full:
                break
        if args.valid_source is not None:
            for k, (ids, mask) in stream(valid_specs):
                feed("valid", k, ids, mask)
                if valid.full:
                    break
        if train.rows == 0 and valid.rows == 0:
            raise LRCError(f"source {name!r} gave no complete row of {args.seq_len} tokens (empty corpus?)")
        if valid.rows == 0:
            raise LRCError(f"no validation rows from {args.valid_source or name!r}: "
                           "raise --valid-fraction or --valid-rows, or give --valid-source")
        if train.rows == 0:
            raise LRCError(f"source {name!r}: no training rows left after the validation split")

        def records(which: str, which_specs: list[SourceSpec]) -> list[dict]:
            return [{**asdict(s), "documents": d, "document_tokens": t}
                    for s, (d, t) in zip(which_specs, counts[which])]

        # Both are renamed into place only when this block ends without error.
        return {"train": train.commit(records("train", specs)),
                "valid": valid.commit(records("valid", valid_specs))}


def main(argv: Sequence[str] | None = None) -> int:
    from lrc.options import parse_args
    from lrc.provenance import write_settings

    args = parse_args(TokenizeArgs, argv, prog="lrc tokenize")
    written = tokenize(args)
    manifests = {k: read_manifest(v) for k, v in written.items()}
    write_settings(args.out, "tokenize", args, rows={k: m["rows"] for k, m in manifests.items()},
                   tokens={k: m["tokens"] for k, m in manifests.items()})
    for k, m in manifests.items():
        print(f"{written[k]}: {m['rows']} rows x {m['seq_len']} tokens ({m['dtype']})")
    return 0
