"""Token directories: exact round trip, sizes, integrity (hashes, stamp, ids), manifest refusals, atomicity."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import torch

from lrc.errors import LRCError
from lrc.io import tokens
from lrc.io.tokens import (
    TokenDataset,
    read_manifest,
    tokenizer_fingerprint,
    write_tokens,
)
from tests.helpers import make_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def test_write_tokens_round_trips_rows_and_mask(tmp_path, tok):
    rows = np.arange(5 * 8).reshape(5, 8) % len(tok)
    mask = (rows % 3 == 0).astype(np.uint8)
    out = write_tokens(tmp_path / "d", rows, loss_mask=mask, tokenizer=tok, source="unit")
    ds = TokenDataset(out, expect_tokenizer=tok)
    assert len(ds) == 5 and ds.seq_len == 8
    for i in range(5):
        item = ds[i]
        assert item["input_ids"].dtype == torch.long and item["loss_mask"].dtype == torch.bool
        assert item["input_ids"].tolist() == rows[i].tolist()
        assert item["loss_mask"].tolist() == mask[i].astype(bool).tolist()
    m = read_manifest(out)
    assert m["dtype"] == "uint16" and m["rows"] == 5 and m["tokens"] == 40 and m["source"] == "unit"
    assert m["tokenizer"]["fingerprint"] == tokenizer_fingerprint(tok)
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temporary left behind


def test_without_mask_every_position_counts_and_large_vocab_is_uint32(tmp_path):
    rows = np.array([[0, 70000, 5]])
    ds = TokenDataset(write_tokens(tmp_path / "d", rows))
    assert ds.manifest["dtype"] == "uint32"
    assert ds[0]["input_ids"].tolist() == [0, 70000, 5]
    assert ds[0]["loss_mask"].all()


def test_dataset_survives_pickling_for_workers(tmp_path):
    import pickle

    ds = TokenDataset(write_tokens(tmp_path / "d", np.ones((3, 4), dtype=np.int64)))
    ds[0]  # opens the memory map
    clone = pickle.loads(pickle.dumps(ds))
    assert clone[2]["input_ids"].tolist() == [1, 1, 1, 1]


def test_truncated_file_is_refused(tmp_path):
    out = write_tokens(tmp_path / "d", np.ones((3, 4), dtype=np.int64))
    with open(out / "tokens.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(LRCError, match="expected 24 bytes"):
        TokenDataset(out)


# ---------------------------------------------------------------------------------------
# Integrity: the content hash, once per directory, and the manifest itself


def _age(directory, seconds=60):
    """Set the data files' mtimes into the past, so a stamp written now is not racy."""
    for name in ("tokens.bin", "loss_mask.bin"):
        path = directory / name
        if path.exists():
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - seconds * 10**9))


def _snapshot(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != tokens.STAMP_FILE}


def _count_hashing(monkeypatch):
    calls = []
    real = tokens.hash_files

    def counting(directory, manifest):
        calls.append(directory)
        return real(directory, manifest)

    monkeypatch.setattr(tokens, "hash_files", counting)
    return calls


def test_contents_are_hashed_once_per_directory_then_stamped(tmp_path, tok, monkeypatch):
    out = write_tokens(tmp_path / "d", np.arange(24).reshape(4, 6) % len(tok), tokenizer=tok)
    _age(out)
    calls = _count_hashing(monkeypatch)
    TokenDataset(out)
    stamp = json.loads((out / tokens.STAMP_FILE).read_text())
    st = (out / "tokens.bin").stat()
    assert stamp["files"] == {"tokens.bin": [st.st_size, st.st_mtime_ns]}
    manifest = read_manifest(out)
    assert stamp["hashes"] == manifest["file_hashes"] and stamp["max_token_id"] == 23
    digest = hashlib.sha256((out / "tokens.bin").read_bytes()).hexdigest()
    assert manifest["file_hashes"] == {"tokens.bin": digest} == {"tokens.bin": manifest["content_hash"]}
    TokenDataset(out)
    TokenDataset(out)
    assert len(calls) == 1  # the stamp stands in for the hash


def test_a_same_size_file_of_other_ids_is_refused_naming_it(tmp_path, tok):
    out = write_tokens(tmp_path / "d", np.arange(24).reshape(4, 6) % len(tok), tokenizer=tok)
    _age(out)
    TokenDataset(out)  # verified and stamped
    (out / "tokens.bin").write_bytes(np.full((4, 6), 7, dtype=np.uint16).tobytes())
    before = _snapshot(out)
    with pytest.raises(LRCError, match=r"d/tokens.bin: its SHA-256 \w+\.\.\. differs from the \w+\.\.\. "
                                       r"recorded in manifest.json.*re-run `lrc tokenize`"):
        TokenDataset(out)
    assert _snapshot(out) == before  # nothing removed or rewritten
    with pytest.raises(LRCError, match="tokens.bin: its SHA-256"):
        TokenDataset(out)  # and refused again: a failed check records nothing


def test_a_rewrite_within_the_clock_tick_is_still_caught(tmp_path, tok):
    # Same size and the same mtime as when the stamp was written: only the racy rule sees it.
    out = write_tokens(tmp_path / "d", np.arange(24).reshape(4, 6) % len(tok), tokenizer=tok)
    TokenDataset(out)
    st = (out / "tokens.bin").stat()
    (out / "tokens.bin").write_bytes(np.full((4, 6), 7, dtype=np.uint16).tobytes())
    os.utime(out / "tokens.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(LRCError, match="tokens.bin: its SHA-256"):
        TokenDataset(out)


def test_a_changed_loss_mask_is_refused_naming_it(tmp_path, tok):
    rows = np.arange(24).reshape(4, 6) % len(tok)
    out = write_tokens(tmp_path / "d", rows, loss_mask=np.ones_like(rows, dtype=np.uint8), tokenizer=tok)
    (out / "loss_mask.bin").write_bytes(bytes(24))
    with pytest.raises(LRCError, match="d/loss_mask.bin: its SHA-256"):
        TokenDataset(out)
    assert (out / "loss_mask.bin").read_bytes() == bytes(24)


def _edit_manifest(directory, **changes):
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            manifest.pop(key)
        else:
            manifest[key] = value
    path.write_text(json.dumps(manifest))


def test_a_manifest_that_is_not_json_or_misses_keys_is_named(tmp_path):
    out = write_tokens(tmp_path / "d", np.ones((3, 4), dtype=np.int64))
    data = (out / "tokens.bin").read_bytes()
    (out / "manifest.json").write_text('{"format": 2, "rows": ')
    with pytest.raises(LRCError, match=r"cannot read .*d/manifest.json"):
        TokenDataset(out)
    (out / "manifest.json").write_text("[1, 2]")
    with pytest.raises(LRCError, match=r"d/manifest.json: expected a JSON object, got list"):
        TokenDataset(out)
    out = write_tokens(tmp_path / "e", np.ones((3, 4), dtype=np.int64))
    _edit_manifest(out, seq_len=None, dtype=None)
    with pytest.raises(LRCError, match=r"e/manifest.json: missing key\(s\) \['dtype', 'seq_len'\]"):
        TokenDataset(out)
    out = write_tokens(tmp_path / "f", np.ones((3, 4), dtype=np.int64))
    _edit_manifest(out, rows="3")
    with pytest.raises(LRCError, match=r"f/manifest.json: rows must be int, got '3'"):
        TokenDataset(out)
    out = write_tokens(tmp_path / "g", np.ones((3, 4), dtype=np.int64))
    _edit_manifest(out, file_hashes=None)
    with pytest.raises(LRCError, match=r"g/manifest.json: file_hashes must map \['tokens.bin'\]"):
        TokenDataset(out)
    assert (tmp_path / "d/tokens.bin").read_bytes() == data  # the data files are left alone


def test_token_ids_outside_the_recorded_vocabulary_are_refused(tmp_path):
    rows = np.array([[0, 5, 70], [1, 2, 3]])
    out = write_tokens(tmp_path / "d", rows)
    _edit_manifest(out, vocab_size=50)
    with pytest.raises(LRCError, match=r"d/tokens.bin: holds token id 70, outside the vocabulary of 50"):
        TokenDataset(out)
    out = write_tokens(tmp_path / "e", rows)
    _edit_manifest(out, max_token_id=9)
    with pytest.raises(LRCError,
                       match=r"e/tokens.bin: holds token ids up to 70, but manifest.json records max_token_id 9"):
        TokenDataset(out)


def test_format_1_directories_are_verified_through_the_content_hash(tmp_path, tok):
    out = write_tokens(tmp_path / "d", np.arange(24).reshape(4, 6) % len(tok), tokenizer=tok)
    _edit_manifest(out, format=1, file_hashes=None)
    assert TokenDataset(out, expect_tokenizer=tok)[1]["input_ids"].tolist() == list(range(6, 12))
    (out / "tokens.bin").write_bytes(bytes(48))
    with pytest.raises(LRCError, match="tokens.bin: its SHA-256"):
        TokenDataset(out)
    rows = np.arange(24).reshape(4, 6) % len(tok)
    masked = write_tokens(tmp_path / "m", rows, loss_mask=np.ones_like(rows), tokenizer=tok)
    _edit_manifest(masked, format=1, file_hashes=None)
    with pytest.raises(LRCError,
                       match=r"m/manifest.json: a format-1 manifest with a loss mask .* re-run `lrc tokenize`"):
        TokenDataset(masked)


def test_a_read_only_directory_is_verified_without_a_stamp(tmp_path, tok, monkeypatch):
    def read_only(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    out = write_tokens(tmp_path / "d", np.arange(24).reshape(4, 6) % len(tok), tokenizer=tok)
    _age(out)
    monkeypatch.setattr(tokens, "write_json_atomic", read_only)
    calls = _count_hashing(monkeypatch)
    assert len(TokenDataset(out)) == 4 and len(TokenDataset(out)) == 4
    assert not (out / tokens.STAMP_FILE).exists() and len(calls) == 2  # verified at every open


def test_training_data_opened_by_its_tokenize_output_is_verified(tmp_path, tok):
    from lrc.io.tokens import open_token_data

    write_tokens(tmp_path / "corpus" / "train", np.arange(24).reshape(4, 6) % len(tok), tokenizer=tok)
    assert len(open_token_data(tmp_path / "corpus", tokenizer=tok)) == 4
    (tmp_path / "corpus/train/tokens.bin").write_bytes(bytes(48))
    with pytest.raises(LRCError, match=r"corpus/train/tokens.bin: its SHA-256"):
        open_token_data(tmp_path / "corpus", tokenizer=tok)
    with pytest.raises(LRCError, match=r"--data .*nowhere: no such token directory"):
        open_token_data(tmp_path / "nowhere")
