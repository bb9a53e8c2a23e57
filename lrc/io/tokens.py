"""Token directories: the format every stage reads (`lrc tokenize` writes it, see lrc.commands.tokenize).

A token directory holds ``tokens.bin`` (a ``[rows, seq_len]`` array of ``uint16`` or
``uint32``), ``loss_mask.bin`` for chat data (``uint8``, 1 on assistant tokens) and
``manifest.json`` (tokenizer name and fingerprint, dtype, shape, source, the largest id, and
the content hashes). :class:`TokenDataset` reads one, memory-mapped.

Integrity is checked where a directory is opened, cheaply: the sizes always; the SHA-256 of
each data file once, after which ``verified.json`` (each file's hash, size and mtime_ns,
and the largest id seen) stands in for it. A later open re-hashes only when that stamp no
longer matches the files or the manifest, or was written within ``RACY_NS`` of a file's
mtime (a file rewritten within one clock tick keeps its mtime: git's "racy clean" rule).
A directory that cannot be written to is simply re-hashed at every open.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lrc.errors import LRCError
from lrc.io.atomic import atomic_dir, write_json_atomic
from lrc.io.hf import load_tokenizer

TOKENS_FILE = "tokens.bin"
MASK_FILE = "loss_mask.bin"
MANIFEST_FILE = "manifest.json"
STAMP_FILE = "verified.json"
# Format 2 adds ``file_hashes`` (the SHA-256 of each data file); format 1 directories
# without a mask are verified through ``content_hash``, which is then tokens.bin's hash.
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
MANIFEST_KEYS = {"format": int, "dtype": str, "rows": int, "seq_len": int, "vocab_size": int,
                 "max_token_id": int, "loss_mask": bool, "content_hash": str}
TOKEN_DTYPES = ("uint16", "uint32")
RACY_NS = 2 * 10**9
HASH_CHUNK = 1 << 24


# ---------------------------------------------------------------------------------------
# Tokenizer identity


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of the token -> id map (added tokens included): equal iff ids mean the same."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def tokenizer_record(tokenizer: Any) -> dict[str, Any] | None:
    if tokenizer is None:
        return None
    return {
        "name": str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
        "fingerprint": tokenizer_fingerprint(tokenizer),
        "vocab_size": len(tokenizer),
    }


# ---------------------------------------------------------------------------------------
# Writing


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


class TokenWriter:
    """Appends rows to a token directory under a temporary name; `commit` renames it.

    Used as a context manager (through :func:`lrc.io.atomic.atomic_dir`): the directory appears
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
        self.dtype = token_dtype(vocab_size)
        self.tokenizer, self.source = tokenizer, source
        self.rows, self.max_id, self.cap = 0, -1, cap
        # ``hash`` is format 1's content_hash (the appended bytes, tokens then mask, batch by
        # batch); ``file_hashes`` are what a reader can recompute from the files alone.
        self.hash = hashlib.sha256()
        self.file_hashes = {TOKENS_FILE: hashlib.sha256()} | ({MASK_FILE: hashlib.sha256()} if with_mask else {})
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
        self._write(self._tokens, TOKENS_FILE, data)
        if self.with_mask:
            if mask is None or np.shape(mask) != rows.shape:
                raise LRCError(f"loss_mask must have the shape of the token rows {list(rows.shape)}")
            self._write(self._mask, MASK_FILE, np.asarray(mask).astype(np.uint8).tobytes())
        self.rows += rows.shape[0]
        if rows.size:
            self.max_id = max(self.max_id, int(rows.max()))

    def _write(self, file: Any, name: str, data: bytes) -> None:
        file.write(data)
        self.hash.update(data)
        self.file_hashes[name].update(data)

    def commit(self, sources: list[dict] | None = None) -> Path:
        """Write the manifest (``sources``: per-source records, see `lrc.commands.tokenize`); the
        directory takes its final name when the ``with`` block ends."""
        self._close()
        if self.rows == 0:
            raise LRCError(f"no complete row of {self.seq_len} tokens for {self.final} (source {self.source!r} "
                           "is empty or too short)")
        manifest = {
            "format": FORMAT_VERSION,
            "tokenizer": tokenizer_record(self.tokenizer),
            "dtype": self.dtype.name,
            "rows": self.rows,
            "seq_len": self.seq_len,
            "tokens": self.rows * self.seq_len,
            "vocab_size": self.vocab_size,
            "max_token_id": self.max_id,
            "loss_mask": self.with_mask,
            "source": self.source,
            "content_hash": self.hash.hexdigest(),
            "file_hashes": {name: h.hexdigest() for name, h in self.file_hashes.items()},
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

    def __enter__(self) -> "TokenWriter":
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
    with TokenWriter(directory, seq_len=rows.shape[1], vocab_size=vocab, with_mask=loss_mask is not None,
                     tokenizer=tokenizer, source=source) as writer:
        writer.append(rows, loss_mask)
        return writer.commit()


# ---------------------------------------------------------------------------------------
# Reading and verifying


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a token directory, refused (naming the file) unless well formed."""
    path = Path(directory) / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise LRCError(f"{directory} is not a token directory: {MANIFEST_FILE} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LRCError(f"cannot read {path}: {err}") from err
    if not isinstance(manifest, dict):
        raise LRCError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    if missing:
        raise LRCError(f"{path}: missing key(s) {missing}; re-run `lrc tokenize`")
    for key, kind in MANIFEST_KEYS.items():
        value = manifest[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise LRCError(f"{path}: {key} must be {kind.__name__}, got {value!r}")
    if manifest["format"] not in READABLE_FORMATS:
        raise LRCError(f"{path}: format {manifest['format']} is not one this lrc reads ({READABLE_FORMATS})")
    if manifest["dtype"] not in TOKEN_DTYPES:
        raise LRCError(f"{path}: dtype must be one of {TOKEN_DTYPES}, got {manifest['dtype']!r}")
    if manifest["rows"] < 0 or manifest["seq_len"] < 1:
        raise LRCError(f"{path}: rows {manifest['rows']} and seq_len {manifest['seq_len']} must be >= 0 and >= 1")
    return manifest


def data_files(manifest: dict[str, Any]) -> list[str]:
    return [TOKENS_FILE] + ([MASK_FILE] if manifest["loss_mask"] else [])


def expected_hashes(directory: Path, manifest: dict[str, Any]) -> dict[str, str]:
    """The SHA-256 of each data file, as the manifest records it."""
    path = directory / MANIFEST_FILE
    if manifest["format"] == 1:
        if manifest["loss_mask"]:
            raise LRCError(f"{path}: a format-1 manifest with a loss mask records no per-file hash, so "
                           f"{directory} cannot be verified; re-run `lrc tokenize`")
        return {TOKENS_FILE: manifest["content_hash"]}
    hashes = manifest.get("file_hashes")
    names = data_files(manifest)
    if not isinstance(hashes, dict) or not all(isinstance(hashes.get(n), str) for n in names):
        raise LRCError(f"{path}: file_hashes must map {names} to SHA-256 hex digests, got {hashes!r}")
    return {n: hashes[n] for n in names}


def hash_files(directory: Path, manifest: dict[str, Any]) -> tuple[dict[str, str], int]:
    """The SHA-256 of each data file and the largest token id, read in chunks."""
    dtype = np.dtype(manifest["dtype"])
    hashes, max_id = {}, -1
    for name in data_files(manifest):
        digest = hashlib.sha256()
        with open(directory / name, "rb") as f:
            while chunk := f.read(HASH_CHUNK - HASH_CHUNK % dtype.itemsize):
                digest.update(chunk)
                if name == TOKENS_FILE:
                    max_id = max(max_id, int(np.frombuffer(chunk, dtype=dtype).max()))
        hashes[name] = digest.hexdigest()
    return hashes, max_id


def _file_stats(directory: Path, names: list[str]) -> dict[str, list[int]]:
    stats = {}
    for name in names:
        st = (directory / name).stat()
        stats[name] = [st.st_size, st.st_mtime_ns]
    return stats


def _stamp_holds(stamp: Any, hashes: dict[str, str], stats: dict[str, list[int]], max_id: int) -> bool:
    if not isinstance(stamp, dict) or not isinstance(stamp.get("stamped_ns"), int):
        return False
    racy = any(stamp["stamped_ns"] - mtime < RACY_NS for _, mtime in stats.values())
    return (not racy and stamp.get("hashes") == hashes and stamp.get("files") == stats
            and stamp.get("max_token_id") == max_id)


def verify_contents(directory: str | os.PathLike, manifest: dict[str, Any]) -> int:
    """Check the data files against the manifest's hashes (once, see the module docstring);
    returns the largest token id. Refuses, naming the file, whatever differs."""
    directory = Path(directory)
    names = data_files(manifest)
    expected = expected_hashes(directory, manifest)
    stats = _file_stats(directory, names)
    try:
        stamp = json.loads((directory / STAMP_FILE).read_text())
    except (OSError, ValueError):
        stamp = None
    if _stamp_holds(stamp, expected, stats, manifest["max_token_id"]):
        return manifest["max_token_id"]
    stamped_ns = time.time_ns()
    actual, max_id = hash_files(directory, manifest)
    for name in names:
        if actual[name] != expected[name]:
            raise LRCError(f"{directory / name}: its SHA-256 {actual[name][:16]}... differs from the "
                           f"{expected[name][:16]}... recorded in {MANIFEST_FILE}: the file changed after "
                           "`lrc tokenize` wrote it; re-run `lrc tokenize`")
    if max_id != manifest["max_token_id"]:
        raise LRCError(f"{directory / TOKENS_FILE}: holds token ids up to {max_id}, but {MANIFEST_FILE} "
                       f"records max_token_id {manifest['max_token_id']}")
    if _file_stats(directory, names) == stats:  # unchanged while it was read
        try:
            write_json_atomic(directory / STAMP_FILE, {"hashes": expected, "files": stats,
                                                       "max_token_id": max_id, "stamped_ns": stamped_ns})
        except OSError:
            pass  # a read-only directory: verified again at the next open
    return max_id


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
        verify_contents(self.directory, m)
        if m["max_token_id"] >= m["vocab_size"]:
            raise LRCError(f"{self.directory / TOKENS_FILE}: holds token id {m['max_token_id']}, outside the "
                           f"vocabulary of {m['vocab_size']} that {MANIFEST_FILE} records")
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
        """The largest id in tokens.bin (recorded in the manifest, checked against the file)."""
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
                raise LRCError(f"{path}: expected {expected} bytes for {self.rows} x {self.seq_len} "
                               f"rows, found {actual}")

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
    Its ids fit too: a TokenDataset has checked, when opened, that tokens.bin's largest id
    (hashed with the file) lies below the vocabulary its manifest records.
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


def open_token_data(path: str | Path, *, tokenizer: Any = None, option: str = "--data") -> TokenDataset:
    """The TokenDataset at ``path``, or at ``path/train`` when given a `lrc tokenize` output."""
    path = Path(path)
    if not (path / MANIFEST_FILE).is_file() and (path / "train" / MANIFEST_FILE).is_file():
        path = path / "train"
    if not path.is_dir():
        raise LRCError(f"{option} {path}: no such token directory")
    return TokenDataset(path, expect_tokenizer=tokenizer)
