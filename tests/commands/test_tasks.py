"""`lrc tasks`: multiple-choice lm-eval tasks from held-out real text (Python's own docstrings)."""

from __future__ import annotations

import inspect
import json
import re

import pytest
import yaml

from lrc.commands.tasks import main, shuffle_words
from lrc.errors import LRCError
from lrc.io.suites import load_suite

OBJECTS = ["json.dumps", "json.loads", "re.sub", "re.split", "textwrap.wrap", "textwrap.dedent", "functools.reduce",
           "functools.lru_cache", "itertools.groupby", "collections.Counter", "collections.OrderedDict",
           "shutil.copytree", "shutil.rmtree", "os.walk", "os.makedirs", "argparse.ArgumentParser", "subprocess.run",
           "heapq.merge", "bisect.insort_right", "difflib.SequenceMatcher", "statistics.median", "random.shuffle",
           "tempfile.mkdtemp", "zipfile.ZipFile", "string.Formatter", "logging.basicConfig", "pprint.pformat",
           "calendar.monthrange"]


def docstrings() -> list[str]:
    import importlib

    out = []
    for dotted in OBJECTS:
        module, name = dotted.rsplit(".", 1)
        doc = inspect.getdoc(getattr(importlib.import_module(module), name))
        if doc and len(doc) > 200:
            out.append(doc)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Docstrings as a .jsonl, and a small BPE tokenizer trained on them."""
    from lrc.world.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("docs")
    docs = docstrings()
    assert len(docs) >= 20
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    train_tokenizer(docs, vocab_size=400, out_dir=root / "tokenizer")
    return root, docs


def read(directory, task):
    return [json.loads(line) for line in (directory / f"{task}.jsonl").read_text().splitlines()]


def make(corpus, out, *extra):
    root, _ = corpus
    args = ["--data", str(root / "docs.jsonl"), "--tokenizer", str(root / "tokenizer"), "--out", str(out),
            "--prefix-tokens", "24", "--continuation-tokens", "8", *extra]
    assert main(args) == 0
    return out


def test_tasks_from_text_are_well_formed_and_deterministic(corpus, tmp_path):
    _, docs = corpus
    out = make(corpus, tmp_path / "a")
    assert sorted(p.name for p in out.iterdir()) == [".lrc-output", "heldout_continuation.jsonl",
                                                     "heldout_continuation.yaml", "heldout_shuffled.jsonl",
                                                     "heldout_shuffled.yaml", "settings.json", "suite.yaml"]
    continuation = read(out, "heldout_continuation")
    assert len(continuation) == len(docs)  # one question per document
    golds = set()
    for q in continuation:
        assert len(q["choices"]) == 4 and len(set(q["choices"])) == 4
        true = q["choices"][q["gold"]]
        source = [d for d in docs if d.startswith(q["context"])]
        assert len(source) == 1 and source[0][len(q["context"]):].startswith(true)  # the document's own next words
        assert true[:1].isspace()  # cut before a word, not inside one
        for k, other in enumerate(q["choices"]):
            if k != q["gold"]:  # a distractor: another document's span, not this one's
                assert (any(other in d for d in docs if d is not source[0])
                        and not source[0][len(q["context"]):].startswith(other))
        golds.add(q["gold"])
    assert golds == {0, 1, 2, 3}  # the gold position varies
    for q in read(out, "heldout_shuffled"):
        true, shuffled = q["choices"][q["gold"]], q["choices"][1 - q["gold"]]
        assert true != shuffled and sorted(true.split()) == sorted(shuffled.split())
        assert re.sub(r"\S+", "w", true) == re.sub(r"\S+", "w", shuffled)  # the whitespace stays in place
    suite = load_suite("local", out)
    assert suite["tasks"]["heldout_continuation"] == {"metric": "acc", "choices": 4, "chance": 0.25, "docs": len(docs)}
    assert suite["tasks"]["heldout_shuffled"]["chance"] == 0.5
    config = yaml.safe_load((out / "heldout_continuation.yaml").read_text())
    assert config["task"] == "heldout_continuation" and config["output_type"] == "multiple_choice"
    assert config["dataset_kwargs"]["data_files"]["test"] == str((out / "heldout_continuation.jsonl").resolve())
    # The same data and seed: the same questions; another seed: others.
    again = make(corpus, tmp_path / "b")
    assert (read(again, "heldout_continuation") == continuation
            and read(again, "heldout_shuffled") == read(out, "heldout_shuffled"))
    other = make(corpus, tmp_path / "c", "--seed", "1", "--items", "5", "--kinds", "continuation")
    assert len(read(other, "heldout_continuation")) == 5 and not (other / "heldout_shuffled.jsonl").exists()
    assert read(other, "heldout_continuation") != continuation[:5]


def test_token_rows_give_tasks_from_the_heldout_split_only(corpus, tmp_path):
    from lrc.commands.tokenize import TokenizeArgs, tokenize
    from lrc.io.sources import in_valid_split

    root, docs = corpus
    data = tmp_path / "data"
    tokenize(TokenizeArgs(tokenizer=str(root / "tokenizer"), source=str(root / "docs.jsonl"), out=data, seq_len=64,
                          valid_fraction=0.3))
    valid = [d for i, d in enumerate(docs) if in_valid_split(i, 0.3)]
    train = [d for i, d in enumerate(docs) if not in_valid_split(i, 0.3)]
    assert valid and train
    out = tmp_path / "tasks"
    assert main(["--data", str(data), "--tokenizer", str(root / "tokenizer"), "--out", str(out),
                 "--prefix-tokens", "24", "--continuation-tokens", "8", "--choices", "2"]) == 0
    questions = read(out, "heldout_continuation")
    assert questions
    settings = json.loads((out / "settings.json").read_text())
    # Each context is the start of a document split off into valid/ (decoded from its token
    # rows, split at the separators); the training documents gave none.
    for q in questions:
        assert (any(d.startswith(q["context"].strip()) for d in valid)
                and not any(q["context"].strip() in d for d in train))
        assert all(any(c.strip() in d for d in valid) for c in q["choices"])  # distractors: held out too
    assert settings["documents"] == len(valid)
    with pytest.raises(LRCError, match="training split"):
        main(["--data", str(data / "train"), "--tokenizer", str(root / "tokenizer"), "--out", str(tmp_path / "bad")])


def test_bad_input_is_named(corpus, tmp_path):
    root, _ = corpus
    base = ["--tokenizer", str(root / "tokenizer"), "--out", str(tmp_path / "t")]
    with pytest.raises(LRCError, match="--data .*nowhere.jsonl: no such file"):
        main(["--data", str(tmp_path / "nowhere.jsonl"), *base])
    with pytest.raises(LRCError, match="no text field 'body'"):
        main(["--data", str(root / "docs.jsonl"), "--text-field", "body", *base])
    with pytest.raises(LRCError, match="too few documents of .* tokens for the continuation task"):
        main(["--data", str(root / "docs.jsonl"), "--prefix-tokens", "5000", *base])
    with pytest.raises(LRCError, match="--kinds"):
        main(["--data", str(root / "docs.jsonl"), "--kinds", "cloze", *base])
    assert not (tmp_path / "t").exists()


def test_shuffled_words_keep_the_whitespace():
    import random

    text = "  a quick\nbrown fox  jumps"
    shuffled = shuffle_words(text, random.Random(0))
    assert shuffled != text and re.sub(r"\S+", "w", shuffled) == re.sub(r"\S+", "w", text)
    assert sorted(shuffled.split()) == sorted(text.split())
    assert shuffle_words("a a a", random.Random(0)) is None


def test_sliding_windows_give_many_items_from_other_documents_with_balanced_answers(corpus, tmp_path):
    _, docs = corpus
    one = read(make(corpus, tmp_path / "one", "--items", "100000"), "heldout_continuation")
    many = read(make(corpus, tmp_path / "many", "--items", "100000", "--stride", "8", "--choices", "4"),
                "heldout_continuation")
    assert len(one) <= len(docs) and len(many) > 4 * len(one)
    source = {}  # continuation text -> the documents it occurs in
    for q in many:
        assert len(q["choices"]) == 4 and len(set(q["choices"])) == 4
        true = q["choices"][q["gold"]]
        assert any(q["context"] + true in d or (q["context"] + true).strip() in d for d in docs)
        for other in q["choices"]:
            source[other] = [i for i, d in enumerate(docs) if other.strip() in d]
        # a distractor never comes only from the document the context is from
        home = {i for i, d in enumerate(docs) if q["context"].strip() in d}
        assert all(set(source[c]) - home for i, c in enumerate(q["choices"]) if i != q["gold"]), q
    counts = [sum(q["gold"] == g for q in many) for g in range(4)]
    assert max(counts) - min(counts) <= 1, counts
    shuffled = read(tmp_path / "many", "heldout_shuffled")
    halves = [sum(q["gold"] == g for q in shuffled) for g in range(2)]
    assert max(halves) - min(halves) <= 1, halves
    capped = read(make(corpus, tmp_path / "capped", "--items", "30", "--stride", "8"), "heldout_continuation")
    assert len(capped) == 30


def test_knowledge_tables_need_no_data_and_ask_every_fact(corpus, tmp_path):
    import html.entities
    import http

    root, _ = corpus
    out = tmp_path / "k"
    assert main(["--tokenizer", str(root / "tokenizer"), "--out", str(out), "--kinds", "http_status",
                 "html_entity", "time_zone"]) == 0
    http_items = read(out, "http_status")
    assert len(http_items) == len(http.HTTPStatus)
    assert {q["context"].split()[3] for q in http_items} == {str(s.value) for s in http.HTTPStatus}
    for q in http_items:
        code = int(q["context"].split()[3])
        assert q["choices"][q["gold"]] == f" {http.HTTPStatus(code).phrase}" and len(set(q["choices"])) == 4
    entities = read(out, "html_entity")
    assert len(entities) == len(html.entities.name2codepoint)
    zones = read(out, "time_zone")
    assert len(zones) > 300 and all(q["choices"][q["gold"]].strip() in ("Europe", "America", "Asia", "Africa",
                                    "Antarctica", "Arctic", "Atlantic", "Australia", "Indian", "Pacific")
                                    for q in zones)
    paris = [q for q in zones if q["context"].endswith("city of Paris lies in the region")]
    assert len(paris) == 1 and paris[0]["choices"][paris[0]["gold"]] == " Europe"
    for items in (http_items, entities, zones):
        counts = [sum(q["gold"] == g for q in items) for g in range(4)]
        assert max(counts) - min(counts) <= 1, counts
    suite = load_suite("local", out)
    assert suite["tasks"]["time_zone"]["chance"] == 0.25 and suite["tasks"]["http_status"]["docs"] == 62
    with pytest.raises(LRCError, match="held-out kinds need --data"):
        main(["--tokenizer", str(root / "tokenizer"), "--out", str(tmp_path / "x"), "--kinds", "continuation"])


def test_docstring_to_name_asks_about_held_out_modules_only(corpus, tmp_path):
    from lrc.io.knowledge_tasks import docstring_facts, heldout_stdlib_modules
    from lrc.io.sources import STDLIB_DOC_MODULES, in_valid_split

    root, _ = corpus
    held_out = heldout_stdlib_modules(0.1)
    assert held_out and all(in_valid_split(m, 0.1) for m in held_out)
    assert len(held_out) < len(STDLIB_DOC_MODULES) / 5  # the rest is the corpus's training split
    out = tmp_path / "d"
    assert main(["--tokenizer", str(root / "tokenizer"), "--out", str(out), "--kinds", "docstring_name",
                 "--modules", "json", "textwrap", "shlex", "fractions"]) == 0  # a fixed input: four small modules
    items = read(out, "docstring_name")
    assert len(docstring_facts("fractions")) == 3  # fewer names than choices: the module gives no item
    expected = {q: a for m in ("json", "textwrap", "shlex") for q, a in docstring_facts(m)}
    assert len(items) == len(expected) > 10
    for q in items:
        true = q["choices"][q["gold"]]
        assert expected[q["context"]] == true and len(set(q["choices"])) == 4
        module = q["context"].split("'s ")[1].split()[0]
        assert all(a in {b for k, b in expected.items() if f"'s {module} " in k} for a in q["choices"])
        first_line = q["context"].split('"')[1]
        assert true.strip().rsplit(".", 1)[-1].lower() not in first_line.lower()  # the name is not given away
    counts = [sum(q["gold"] == g for q in items) for g in range(4)]
    assert max(counts) - min(counts) <= 1, counts
    default = tmp_path / "default"
    assert main(["--tokenizer", str(root / "tokenizer"), "--out", str(default), "--kinds", "docstring_name"]) == 0
    asked = {q["context"].split("'s ")[1].split()[0] for q in read(default, "docstring_name")}
    assert asked and asked <= set(held_out)  # never a module of the training split


def test_code_next_line_asks_for_the_line_that_follows_in_the_same_file(corpus, tmp_path):
    import json as json_module
    import textwrap

    from lrc.io.knowledge_tasks import CONTEXT_LINES, MIN_LINE_CHARS

    root, _ = corpus
    out = tmp_path / "c"
    assert main(["--tokenizer", str(root / "tokenizer"), "--out", str(out), "--kinds", "code_next_line",
                 "--modules", "json", "textwrap", "--stride", "4"]) == 0
    items = read(out, "code_next_line")
    sources = {m.__name__: inspect.getsource(m) for m in (json_module, textwrap)}
    lines = {name: src.splitlines() for name, src in sources.items()}
    expected = sum(1 for ls in lines.values() for i in range(CONTEXT_LINES, len(ls), 4)
                   if len(ls[i].strip()) >= MIN_LINE_CHARS)
    assert len(items) == expected > 100
    for q in items:
        true = q["choices"][q["gold"]]
        home = [n for n, src in sources.items() if q["context"] + true + "\n" in src + "\n"]
        assert home, q  # the context, then the true line, as the file has them
        assert len(q["context"].splitlines()) == CONTEXT_LINES and len(set(q["choices"])) == 4
        assert all(c in lines[home[0]] for c in q["choices"])  # distractors: lines of the same file
    counts = [sum(q["gold"] == g for q in items) for g in range(4)]
    assert max(counts) - min(counts) <= 1, counts
    capped = tmp_path / "capped"
    assert main(["--tokenizer", str(root / "tokenizer"), "--out", str(capped), "--kinds", "code_next_line",
                 "--modules", "json", "--items", "5"]) == 0
    assert len(read(capped, "code_next_line")) == 5


def test_a_second_held_out_source_the_corpus_never_sees(corpus, tmp_path):
    from lrc.io.sources import BUILTIN_SOURCES, stdlib_documents

    root, _ = corpus
    out = tmp_path / "p"
    assert main(["--data", "python-package-docs", "--tokenizer", str(root / "tokenizer"), "--out", str(out),
                 "--kinds", "continuation", "--stride", "64", "--items", "300", "--prefix-tokens", "24",
                 "--continuation-tokens", "8"]) == 0
    items = read(out, "heldout_continuation")
    packages = [r["text"] for r in BUILTIN_SOURCES["python-package-docs"]()]
    stdlib = "\n".join(r["text"] for r in stdlib_documents())
    assert len(items) == 300
    for q in items[:50]:
        assert any(q["context"].strip() in t for t in packages) and q["context"].strip() not in stdlib
    with pytest.raises(LRCError, match="python-stdlib-docs is a training corpus"):
        main(["--data", "python-stdlib-docs", "--tokenizer", str(root / "tokenizer"), "--out", str(tmp_path / "s")])
