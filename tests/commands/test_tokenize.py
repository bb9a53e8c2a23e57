"""The `lrc tokenize` pipeline: the LRC text recipe, chat masks, sources and mixtures, refusals."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from lrc.commands.tokenize import TokenizeArgs, chat_ids, main, text_ids, tokenize
from lrc.errors import LRCError
from lrc.io.tokens import TokenDataset, check_vocab, read_manifest
from lrc.world.tokenizer import train_tokenizer

DOCS = [f"Person {i} lives in town {i % 7} and works as a baker number {i}." for i in range(200)]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    train_tokenizer(DOCS, 400, path)
    return path


@pytest.fixture(scope="module")
def tok(tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tok_dir))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    return path


def test_plain_text_follows_the_recipe_and_round_trips(tmp_path, tok, tok_dir, corpus):
    args = TokenizeArgs(tokenizer=str(tok_dir), source=str(corpus), out=tmp_path / "tok", seq_len=16, valid_rows=2)
    written = tokenize(args)
    expected = []
    for d in DOCS:
        expected += [tok.eos_token_id] + tok(d, add_special_tokens=False)["input_ids"] + [tok.bos_token_id]
    train, valid = (TokenDataset(written["train"], expect_tokenizer=tok),
                    TokenDataset(written["valid"], expect_tokenizer=tok_dir))
    assert len(valid) == 2
    valid_ids = torch.cat([valid[i]["input_ids"] for i in range(len(valid))]).tolist()
    train_ids = torch.cat([train[i]["input_ids"] for i in range(len(train))]).tolist()
    assert valid_ids == expected[:32]
    # train/ starts at the first document that did not go to valid/: a clean document split.
    start = _find(expected, train_ids[:16])
    assert start >= 32 and expected[start] == tok.eos_token_id
    assert train_ids == expected[start:start + len(train_ids)]
    assert len(expected) - start - len(train_ids) < 16  # only the incomplete tail is dropped


def _find(haystack, needle):
    for i in range(len(haystack) - len(needle) + 1):
        if haystack[i:i + len(needle)] == needle:
            return i
    raise AssertionError("row not found in the expected stream")


def test_max_tokens_and_fraction_split_and_cli(tmp_path, tok_dir, corpus):
    rc = main(["--tokenizer", str(tok_dir), "--source", str(corpus), "--out", str(tmp_path / "tok"),
               "--seq-len", "8", "--max-tokens", "64", "--valid-fraction", "0.2"])
    assert rc == 0
    assert read_manifest(tmp_path / "tok" / "train")["rows"] == 8
    assert read_manifest(tmp_path / "tok" / "valid")["rows"] >= 1
    assert (tmp_path / "tok" / "settings.json").exists()


def test_same_input_same_bytes(tmp_path, tok_dir, corpus):
    hashes = []
    for name in ("a", "b"):
        tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(corpus), out=tmp_path / name, seq_len=16))
        hashes.append(read_manifest(tmp_path / name / "train")["content_hash"])
    assert hashes[0] == hashes[1]
    assert (tmp_path / "a/train/tokens.bin").read_bytes() == (tmp_path / "b/train/tokens.bin").read_bytes()


def test_other_tokenizer_is_refused_naming_both(tmp_path, tok_dir, corpus):
    other = tmp_path / "other_tok"
    train_tokenizer(DOCS[::-1] + ["zebra quokka"] * 30, 420, other)
    tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(corpus), out=tmp_path / "tok", seq_len=16))
    with pytest.raises(LRCError, match=r"built with tokenizer .*tok.*expected tokenizer .*other_tok"):
        TokenDataset(tmp_path / "tok" / "train", expect_tokenizer=other)


def test_chat_mask_covers_exactly_the_assistant_answers(tok):
    messages = [{"role": "user", "content": "Where does person 3 live?"},
                {"role": "assistant", "content": " town 3"},
                {"role": "user", "content": "And person 4?"},
                {"role": "assistant", "content": " town 4"}]
    ids, mask = chat_ids(tok, messages)
    assert ids == tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == " town 3<|eos|> town 4<|eos|>"


@pytest.mark.parametrize("layout", ["pack", "pad"])
def test_chat_tokenize_writes_a_mask(tmp_path, tok_dir, tok, layout):
    src = tmp_path / "sft.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"Where does person {i} live?"},
                          {"role": "assistant", "content": f" town {i % 7}"}]} for i in range(40)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(src), out=tmp_path / "sft", seq_len=24,
                                    chat=True, chat_layout=layout, valid_rows=2))
    ds = TokenDataset(written["train"])
    assert ds.has_mask and len(ds) > 0
    item = ds[0]
    answer = tok.decode(item["input_ids"][item["loss_mask"]].tolist())
    assert "town" in answer and "Where" not in answer
    if layout == "pad":
        assert item["input_ids"][-1].item() == tok.pad_token_id and not item["loss_mask"][-1]


def test_missing_source_file_is_named_and_nothing_is_left(tmp_path, tok_dir):
    out = tmp_path / "tok"
    with pytest.raises(LRCError, match="source file not found: .*nope.jsonl"):
        tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(tmp_path / "nope.jsonl"), out=out, seq_len=8))
    assert not out.exists() or list(out.iterdir()) == []


def test_unreadable_source_is_named(tmp_path, tok_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{not json\n')
    with pytest.raises(LRCError, match=r"bad.jsonl:2: not valid JSON"):
        tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(bad), out=tmp_path / "tok", seq_len=8))
    if os.geteuid() != 0:
        bad.write_text('{"text": "fine"}\n')
        bad.chmod(0)
        with pytest.raises(LRCError, match="cannot read source file .*bad.jsonl"):
            tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(bad), out=tmp_path / "tok", seq_len=8))
    assert not (tmp_path / "tok" / "train").exists()
    assert [p for p in (tmp_path / "tok").iterdir()] == []


def test_empty_corpus_is_refused(tmp_path, tok_dir):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(LRCError, match="empty corpus"):
        tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(empty), out=tmp_path / "tok", seq_len=8))
    assert list((tmp_path / "tok").iterdir()) == []


def test_wrong_text_field_is_named(tmp_path, tok_dir, corpus):
    with pytest.raises(LRCError, match="no field 'content'"):
        tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(corpus), out=tmp_path / "t", seq_len=8,
                              text_field="content"))


def test_vocabulary_larger_than_embedding_is_refused(tmp_path, tok, tok_dir, corpus):
    from tests.helpers import make_teacher

    with pytest.raises(LRCError, match="400 tokens, which does not fit an embedding of 97 rows"):
        tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(corpus), out=tmp_path / "t", seq_len=8,
                              model_vocab=97))
    written = tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(corpus), out=tmp_path / "t", seq_len=8))
    ds = TokenDataset(written["train"])
    with pytest.raises(LRCError, match=r"has 400 tokens, which does not fit the model's embedding \(97 rows"):
        check_vocab(ds, make_teacher("llama-tied"))
    check_vocab(ds, make_teacher("llama-tied", vocab_size=len(tok)))  # fits: no error


def test_hub_id_without_network_names_the_id(tmp_path, tok_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(LRCError, match="cannot load dataset 'someone/no-such-corpus'"):
        tokenize(TokenizeArgs(tokenizer=str(tok_dir), source="someone/no-such-corpus", out=tmp_path / "t", seq_len=8))
    assert list((tmp_path / "t").iterdir()) == []


def test_parquet_and_text_sources_give_the_same_tokens_as_jsonl(tmp_path, tok_dir, corpus):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": DOCS}), tmp_path / "corpus.parquet")
    (tmp_path / "corpus.txt").write_text("\n\n".join(DOCS) + "\n")
    digests = set()
    for src in (corpus, tmp_path / "corpus.parquet", tmp_path / "corpus.txt"):
        out = tmp_path / ("tok_" + src.suffix[1:])
        tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(src), out=out, seq_len=16, valid_rows=1))
        digests.add((out / "train" / "tokens.bin").read_bytes())
    assert len(digests) == 1


def test_dataset_repository_goes_through_datasets_streaming(tmp_path, tok_dir, corpus):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # A local stand-in for a hub dataset repository: datasets reads it like a hub id.
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    pq.write_table(pa.table({"content": DOCS}), repo / "data" / "train-00000-of-00001.parquet")
    tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(repo), out=tmp_path / "hub", seq_len=16,
                          text_field="content", valid_rows=1, max_tokens=160))
    tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(corpus), out=tmp_path / "local", seq_len=16,
                          valid_rows=1, max_tokens=160))
    assert read_manifest(tmp_path / "hub" / "train")["rows"] == 10
    assert (tmp_path / "hub/train/tokens.bin").read_bytes() == (tmp_path / "local/train/tokens.bin").read_bytes()
    with pytest.raises(LRCError, match="cannot load dataset .*repo.* split 'test'"):
        tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(repo), out=tmp_path / "x", seq_len=16, split="test",
                              text_field="content"))


# ---------------------------------------------------------------------------------------
# Revision, row filter and mixtures (the paper's FineWeb-Edu >= 4 + OpenHermes corpus)


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_filter_keeps_exactly_the_records_at_or_above_the_threshold(tmp_path, tok_dir):
    scored = [{"text": d, "metadata": {"int_score": i % 6}} for i, d in enumerate(DOCS)]
    src = _jsonl(tmp_path / "scored.jsonl", scored)
    kept = _jsonl(tmp_path / "kept.jsonl", [r for r in scored if r["metadata"]["int_score"] >= 4])
    filtered = tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(src), out=tmp_path / "f", seq_len=16,
                                     valid_rows=1, filter_field="metadata.int_score", filter_min=4))
    reference = tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(kept), out=tmp_path / "r", seq_len=16,
                                      valid_rows=1))
    assert (filtered["train"] / "tokens.bin").read_bytes() == (reference["train"] / "tokens.bin").read_bytes()
    m = read_manifest(filtered["train"])
    (entry,) = m["sources"]
    assert entry["filter_field"] == "metadata.int_score" and entry["filter_min"] == 4
    n_valid = read_manifest(filtered["valid"])["sources"][0]["documents"]
    assert entry["documents"] + n_valid == len(kept.read_text().splitlines())
    with pytest.raises(LRCError, match="source .*scored.jsonl: record has no field 'metadata.score'"):
        tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(src), out=tmp_path / "x", seq_len=16,
                              filter_field="metadata.score", filter_min=4))
    with pytest.raises(LRCError, match="filter_field and filter_min together"):
        TokenizeArgs(tokenizer=str(tok_dir), source=str(src), out=tmp_path / "x", seq_len=16, filter_field="x")


def test_revision_reaches_datasets_and_the_manifest(tmp_path, tok_dir, corpus, monkeypatch):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    pq.write_table(pa.table({"text": DOCS}), repo / "data" / "train-00000-of-00001.parquet")
    seen, real = [], datasets.load_dataset

    def spy(*a, **kw):  # records the call, then loads for real
        seen.append(kw.get("revision"))
        return real(*a, **kw)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    written = tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(repo), revision="v1.0", out=tmp_path / "t",
                                    seq_len=16, valid_rows=1))
    assert seen == ["v1.0"]
    assert read_manifest(written["train"])["sources"][0]["revision"] == "v1.0"
    with pytest.raises(LRCError, match="revision applies to dataset repositories"):
        TokenizeArgs(tokenizer=str(tok_dir), source=str(corpus), revision="v1.0", out=tmp_path / "x", seq_len=16)


def _segments(ids, eos):
    """The documents of a token stream: the spans that start at an eos."""
    starts = [i for i, t in enumerate(ids) if t == eos]
    return [ids[a:b] for a, b in zip(starts, starts[1:] + [len(ids)])]


def test_mixture_interleaves_sources_by_share_and_renders_chat(tmp_path, tok_dir, tok):
    towns = [f"Town {i} has a bakery and {i} bakers." for i in range(400)]
    text = _jsonl(tmp_path / "towns.jsonl", [{"body": t, "score": 5} for t in towns])
    chats = _jsonl(tmp_path / "chats.jsonl", [{"conversations": [
        {"from": "system", "value": "Answer briefly."},
        {"from": "human", "value": f"Where does person {i} live?"},
        {"from": "gpt", "value": f"In town {i % 7}."}]} for i in range(400)])
    mixture = tmp_path / "mix.yaml"
    mixture.write_text(f"""sources:
  - {{source: {text}, text_field: body, filter_field: score, filter_min: 4, share: 3}}
  - {{source: {chats}, messages_field: conversations, chat: true, share: 1}}
""")
    written = tokenize(TokenizeArgs(tokenizer=str(tok_dir), mixture=mixture, out=tmp_path / "mix", seq_len=32,
                                    valid_rows=1, max_tokens=32 * 60))
    train = TokenDataset(written["train"])
    assert not train.has_mask and len(train) == 60
    ids = torch.cat([train[i]["input_ids"] for i in range(len(train))]).tolist()

    def rendered(i):
        return tok.apply_chat_template([{"role": "system", "content": "Answer briefly."},
                                        {"role": "user", "content": f"Where does person {i} live?"},
                                        {"role": "assistant", "content": f"In town {i % 7}."}], tokenize=False)

    # Each chat document is eos + the conversation in the chat template + bos, like any text.
    text = tok.decode(ids)
    chat_found = [int(n) for n in re.findall(r"Where does person (\d+) live\?", text)]
    town_found = [int(n) for n in re.findall(r"Town (\d+) has a bakery", text)]
    assert chat_found and town_found
    _find(ids, text_ids(tok, rendered(chat_found[1])))
    chat_tokens = sum(len(text_ids(tok, rendered(i))) for i in chat_found)
    town_tokens = sum(len(text_ids(tok, towns[i])) for i in town_found)
    longest = max(len(text_ids(tok, rendered(i))) for i in chat_found)
    total = chat_tokens + town_tokens  # ~ len(ids); documents cut at either end are not counted
    assert total > len(ids) - 2 * longest
    assert abs(chat_tokens / total - 0.25) <= 2 * longest / total  # within a document of its share
    m = read_manifest(written["train"])
    assert m["source"] == str(mixture) and [s["share"] for s in m["sources"]] == [3, 1]
    assert m["sources"][1]["chat"] and m["sources"][0]["filter_field"] == "score"


@pytest.mark.parametrize("entry, message", [
    ("{source: DIR/a.jsonl, shares: 2}", r"sources\[1\] \(.*a.jsonl\): unknown key\(s\) \['shares'\]"),
    ("{source: DIR/a.jsonl, share: 0}", r"sources\[1\] \(.*a.jsonl\): share must be positive"),
    ("{source: DIR/a.jsonl, share: lots}", r"sources\[1\] \(.*a.jsonl\): share must be a number"),
    ("{split: train}", r"sources\[1\] \(no source\): each entry must be a mapping with a 'source'"),
    ("{source: DIR/a.jsonl, revision: main}", r"sources\[1\] \(.*a.jsonl\): revision applies to dataset repositories"),
])
def test_bad_mixture_entry_names_the_file_and_source(tmp_path, tok_dir, corpus, entry, message):
    mixture = tmp_path / "mix.yaml"
    mixture.write_text(f"sources:\n  - {{source: {corpus}}}\n  - {entry.replace('DIR', str(tmp_path))}\n")
    with pytest.raises(LRCError, match=message):
        tokenize(TokenizeArgs(tokenizer=str(tok_dir), mixture=mixture, out=tmp_path / "t", seq_len=16))
    assert not (tmp_path / "t" / "train").exists()


def test_mixture_and_source_exclude_each_other(tmp_path, tok_dir, corpus):
    with pytest.raises(LRCError, match="exactly one of --source and --mixture"):
        TokenizeArgs(tokenizer=str(tok_dir), out=tmp_path / "t", seq_len=16)
    with pytest.raises(LRCError, match="exactly one of --source and --mixture"):
        TokenizeArgs(tokenizer=str(tok_dir), source=str(corpus), mixture=tmp_path / "m.yaml", out=tmp_path / "t",
                     seq_len=16)


# ---------------------------------------------------------------------------------------
# --separator and the built-in stdlib-docstring corpus


def _tokenizer_variant(tok, path, *, end_of_text_is_eos: bool):
    """The test tokenizer with an ``<|endoftext|>`` token: as its eos (a base model's) or beside
    its eos (an instruct model's, whose eos ends a chat turn)."""
    from transformers import AutoTokenizer

    variant = AutoTokenizer.from_pretrained(str(tok.name_or_path))
    variant.add_special_tokens({"eos_token": "<|endoftext|>"} if end_of_text_is_eos
                               else {"additional_special_tokens": ["<|endoftext|>"]})
    variant.save_pretrained(path)
    return AutoTokenizer.from_pretrained(str(path))


def _stream(directory):
    data = TokenDataset(directory)
    return torch.cat([data[i]["input_ids"] for i in range(len(data))]).tolist()


def test_default_separator_keeps_eos_text_bos_for_a_base_tokenizer(tmp_path, tok_dir, corpus):
    for name, flags in (("auto", []), ("explicit", ["--separator", "eos-bos"])):
        main(["--tokenizer", str(tok_dir), "--source", str(corpus), "--out", str(tmp_path / name), "--seq-len", "16",
              "--valid-rows", "2", *flags])
    for split in ("train", "valid"):
        assert ((tmp_path / "auto" / split / "tokens.bin").read_bytes()
                == (tmp_path / "explicit" / split / "tokens.bin").read_bytes())
    assert read_manifest(tmp_path / "auto" / "train")["sources"][0]["document_layout"] == "eos+text+bos"


def test_auto_separator_is_the_end_of_text_token_beside_an_instruct_eos(tmp_path, tok, corpus):
    variant = _tokenizer_variant(tok, tmp_path / "instruct", end_of_text_is_eos=False)
    eot = variant.convert_tokens_to_ids("<|endoftext|>")
    assert eot != variant.eos_token_id
    main(["--tokenizer", str(tmp_path / "instruct"), "--source", str(corpus), "--out", str(tmp_path / "tok"),
          "--seq-len", "16", "--valid-rows", "2"])
    expected = []
    for d in DOCS:
        expected += [eot] + variant(d, add_special_tokens=False)["input_ids"]
    assert _stream(tmp_path / "tok" / "valid") == expected[:32]
    train = _stream(tmp_path / "tok" / "train")
    assert variant.eos_token_id not in train and variant.bos_token_id not in train
    assert read_manifest(tmp_path / "tok" / "train")["sources"][0]["document_layout"] == "<|endoftext|>+text"


def test_auto_separator_when_the_end_of_text_token_is_the_eos(tmp_path, tok, corpus):
    variant = _tokenizer_variant(tok, tmp_path / "base", end_of_text_is_eos=True)
    main(["--tokenizer", str(tmp_path / "base"), "--source", str(corpus), "--out", str(tmp_path / "tok"),
          "--seq-len", "16", "--valid-rows", "2"])
    first = [variant.eos_token_id] + variant(DOCS[0], add_special_tokens=False)["input_ids"] + [variant.bos_token_id]
    assert _stream(tmp_path / "tok" / "valid")[:len(first)] == first


def test_unknown_separator_token_is_named(tmp_path, tok_dir, corpus):
    with pytest.raises(LRCError, match=r"--separator '<\|nope\|>': not a token of tokenizer"):
        main(["--tokenizer", str(tok_dir), "--source", str(corpus), "--out", str(tmp_path / "tok"), "--seq-len", "16",
              "--separator", "<|nope|>"])
    assert not (tmp_path / "tok").exists()


def test_stdlib_docs_corpus_is_deterministic_and_split_by_document_name(tmp_path, tok_dir):
    import sys
    import zlib

    from lrc.io.sources import STDLIB_DOC_MODULES, stdlib_documents

    names = [d["name"] for d in stdlib_documents()]
    assert names == sorted(names) and len(names) >= 150 and set(names) <= set(STDLIB_DOC_MODULES)
    held_out = [n for n in names if zlib.crc32(n.encode()) / 2**32 < 0.1]
    for run in ("a", "b"):
        main(["--tokenizer", str(tok_dir), "--source", "python-stdlib-docs", "--out", str(tmp_path / run),
              "--seq-len", "64", "--valid-fraction", "0.1"])
    for split in ("train", "valid"):
        assert ((tmp_path / "a" / split / "tokens.bin").read_bytes()
                == (tmp_path / "b" / split / "tokens.bin").read_bytes())
    train, valid = (read_manifest(tmp_path / "a" / s)["sources"][0] for s in ("train", "valid"))
    assert valid["documents"] == len(held_out) and train["documents"] == len(names) - len(held_out)
    assert valid["valid_split"] == "crc32(document name) / 2**32 < 0.1"
    assert (valid["python"] == sys.version.split()[0] and len(valid["text_sha256"]) == 64
            and valid["license"].startswith("PSF"))
    assert valid["corpus_documents"] == len(names)


def test_text_pieces_cut_before_spaces_and_join_back():
    from lrc.commands.tokenize import text_pieces

    text = " ".join(DOCS)
    pieces = text_pieces(text, size=100)
    assert "".join(pieces) == text and all(len(p) <= 100 for p in pieces) and len(pieces) > 50
    assert all(p.startswith(" ") for p in pieces[1:])  # each cut just before a space
    assert text_pieces("x" * 250, size=100) == ["x" * 100, "x" * 100, "x" * 50]  # no space: cut anyway


def test_a_document_longer_than_a_piece_gives_the_ids_of_the_whole(tmp_path, tok, tok_dir):
    """Over PIECE_CHARS a document is tokenised piece by piece (bounded memory); on a byte-level BPE
    tokenizer the ids are those of one call on the whole text."""
    from lrc.commands.tokenize import PIECE_CHARS

    long_doc = " ".join(DOCS[i % len(DOCS)] for i in range(PIECE_CHARS // 60 + 1000))
    assert len(long_doc) > PIECE_CHARS
    source = tmp_path / "long.jsonl"
    source.write_text(json.dumps({"text": long_doc}) + "\n")
    valid = tmp_path / "valid.jsonl"
    valid.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS[:20]))
    written = tokenize(TokenizeArgs(tokenizer=str(tok_dir), source=str(source), valid_source=str(valid),
                                    out=tmp_path / "tok", seq_len=64))
    train = TokenDataset(written["train"])
    ids = torch.cat([train[i]["input_ids"] for i in range(len(train))]).tolist()
    whole = [tok.eos_token_id] + tok(long_doc, add_special_tokens=False)["input_ids"] + [tok.bos_token_id]
    assert ids == whole[:len(ids)] and len(whole) - len(ids) < 64
