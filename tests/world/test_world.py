"""The tiny world: deterministic bytes, the promised files, learnable and well-formed tasks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from lrc.commands.world import main
from lrc.errors import LRCError
from lrc.io.suites import load_suite
from lrc.world.generator import FACTS, TEMPLATES


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "settings.json"}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("w") / "world"
    assert main(["--out", str(out), "--seed", "3", "--size", "test"]) == 0
    return out


def test_layout(world):
    for rel in ("corpus/train.jsonl", "corpus/valid.jsonl", "sft/train.jsonl", "sft/valid.jsonl",
                "tokenizer/tokenizer.json", "teacher_config.json", "world.json", "settings.json"):
        assert (world / rel).is_file(), rel
    assert sorted(p.name for p in world.parent.iterdir()) == ["world"]  # no temporary left


def test_same_seed_same_bytes_other_seed_other_world(world, tmp_path):
    first = _files(world)
    moved = tmp_path / "moved"
    shutil.copytree(world, moved)
    shutil.rmtree(world)
    try:
        assert main(["--out", str(world), "--seed", "3", "--size", "test"]) == 0
        assert _files(world) == first
    finally:
        if not world.exists():
            shutil.copytree(moved, world)
    main(["--out", str(tmp_path / "other"), "--seed", "4", "--size", "test"])
    assert _files(tmp_path / "other")["corpus/train.jsonl"] != first["corpus/train.jsonl"]


def test_corpus_states_facts_without_the_heldout_wording(world):
    record = json.loads((world / "world.json").read_text())
    person = record["people"][0]
    docs = [json.loads(line)["text"] for line in (world / "corpus/train.jsonl").read_text().splitlines()]
    about = [d for d in docs if d.startswith(person["name"] + " ") or f" {person['name']} " in d]
    assert len(about) >= record["size"]["docs_per_person"]
    for fact in FACTS:
        held = TEMPLATES[fact][person["heldout_template"][fact]].format(n=person["name"], v=person[fact])
        seen = [t.format(n=person["name"], v=person[fact]) for i, t in enumerate(TEMPLATES[fact])
                if i != person["heldout_template"][fact]]
        assert not any(held in d for d in docs), held
        assert any(s in d for d in docs for s in seen)


def test_sft_chats_are_about_people_the_tasks_never_ask_about(world):
    """SFT teaches the chat format on people of its own: no chat names an evaluated person, so a
    score after SFT measures what the student kept, not facts SFT taught again."""
    record = json.loads((world / "world.json").read_text())
    evaluated = {p["name"] for p in record["people"]}
    sft = set(record["sft_people"])
    assert len(sft) == len(evaluated) and not sft & evaluated
    asked = {json.loads(line)["person"] for path in (world / "tasks").glob("*.jsonl")
             for line in path.read_text().splitlines()}
    assert asked <= evaluated and not asked & sft
    words = set()
    for split in ("train", "valid"):
        for line in (world / "sft" / f"{split}.jsonl").read_text().splitlines():
            messages = json.loads(line)["messages"]
            words |= {w.strip(".?") for m in messages for w in m["content"].split()}
            assert [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2)
    assert not words & evaluated
    assert len(words & sft) >= 0.9 * len(sft)  # nearly every SFT person is asked about


def test_values_are_balanced_so_frequency_alone_is_at_chance(world):
    from collections import Counter

    record = json.loads((world / "world.json").read_text())
    for fact in FACTS:
        counts = Counter(p[fact] for p in record["people"])
        assert max(counts.values()) - min(counts.values()) <= 1, fact
    friends = [p["friend"] for p in record["people"]]
    assert sorted(friends) == sorted(p["name"] for p in record["people"])
    assert all(p["friend"] != p["name"] for p in record["people"])


def test_tasks_are_well_formed_multiple_choice(world):
    record = json.loads((world / "world.json").read_text())
    people = {p["name"]: p for p in record["people"]}
    suite = yaml.safe_load((Path(__file__).parents[2] / "lrc/io/suites/tiny.yaml").read_text())
    assert set(record["tasks"]) == set(suite["tasks"])
    for name, spec in suite["tasks"].items():
        config = yaml.safe_load((world / "tasks" / f"{name}.yaml").read_text())
        data = Path(config["dataset_kwargs"]["data_files"]["test"])
        assert config["task"] == name and data.is_absolute() and data == (world / "tasks" / f"{name}.jsonl").resolve()
        docs = [json.loads(line) for line in data.read_text().splitlines()]
        assert docs and record["tasks"][name]["chance"] == 1 / spec["choices"]
        for d in docs:
            assert len(d["choices"]) == spec["choices"] == len(set(d["choices"]))
            assert d["choices"][d["gold"]] == " " + people[d["person"]][d["fact"]]
            assert d["fact"] in spec["facts"]
            if spec["template"] == "heldout":
                template = TEMPLATES[d["fact"]][people[d["person"]]["heldout_template"][d["fact"]]]
                assert d["context"] == template.split(" {v}")[0].format(n=d["person"])


def test_eval_docs_0_asks_every_question_of_the_world_once(tmp_path):
    out = tmp_path / "world"
    assert main(["--out", str(out), "--seed", "3", "--size", "test", "--eval-docs", "0"]) == 0
    record = json.loads((out / "world.json").read_text())
    people = [p["name"] for p in record["people"]]
    for name, spec in load_suite("tiny")["tasks"].items():
        docs = [json.loads(line) for line in (out / "tasks" / f"{name}.jsonl").read_text().splitlines()]
        asked = [(d["person"], d["fact"]) for d in docs]
        assert sorted(asked) == sorted((p, f) for p in people for f in spec["facts"])
        assert record["tasks"][name]["docs"] == len(docs)


def test_tokenizer_and_teacher_config_agree(world):
    from transformers import AutoTokenizer, LlamaConfig

    tok = AutoTokenizer.from_pretrained(str(world / "tokenizer"))
    config = LlamaConfig(**json.loads((world / "teacher_config.json").read_text()))
    assert config.vocab_size == len(tok)
    assert ((config.bos_token_id, config.eos_token_id, config.pad_token_id)
            == (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id))
    assert config.intermediate_size / config.hidden_size >= 2.67
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|user|>Hi<|eos|><|assistant|>"
    conv = json.loads((world / "sft/train.jsonl").read_text().splitlines()[0])["messages"]
    assert [m["role"] for m in conv][:2] == ["user", "assistant"]


def test_bad_sizes_are_named(tmp_path):
    with pytest.raises(LRCError, match="--people must be at least 5"):
        main(["--out", str(tmp_path / "w"), "--size", "test", "--people", "3"])
    with pytest.raises(LRCError, match="--cities must be at least 4"):
        main(["--out", str(tmp_path / "w"), "--size", "test", "--cities", "2"])
    with pytest.raises(LRCError, match="rho below 2.67"):
        main(["--out", str(tmp_path / "w"), "--size", "test", "--intermediate-size", "64"])
    assert not (tmp_path / "w").exists()


def test_the_dry_runs_count_of_the_teacher_before_the_build_is_the_built_ones(world, tmp_path):
    """The workflow sizes the teacher's memory before the world exists, from the preset (its vocabulary the
    tokenizer's target): within 2 % of the teacher the world then builds."""
    from lrc.workflow.value_checks import known_teacher_config, llama_family_parameters

    preset, where = known_teacher_config("w", {"teacher": {"source": "world"}, "world": {"size": "test"}}, tmp_path)
    built = llama_family_parameters(json.loads((world / "teacher_config.json").read_text()))
    assert where == "the world's teacher preset" and abs(llama_family_parameters(preset) - built) <= 0.02 * built
