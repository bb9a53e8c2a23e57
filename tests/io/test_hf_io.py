"""Bad model files are refused by name (issue 9, items 3, 6, 7): pickles, truncated
safetensors, corrupt JSON, bases of another teacher. Each: exit 2 (or LRCError), the
message names the culprit, and what an earlier run wrote is untouched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lrc.cli import main as lrc_main
from lrc.errors import LRCError
from lrc.io.hf import load_causal_lm, load_teacher
from lrc.method.reach import apply_arm
from lrc.method.spectral import (
    BASES_FILE,
    BASES_META,
    compute_bases,
    load_bases,
    save_bases,
    teacher_fingerprint,
)
from lrc.method.student import STATE_FILE, STATE_META, build_student, save_lrc_state
from tests.helpers import make_teacher

R = 16


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A teacher, a second teacher of the same shapes, the first one's bases (`lrc svd`),
    a `confined` LRC state and its merged model."""
    root = tmp_path_factory.mktemp("hfio")
    teacher = make_teacher("llama-untied")
    teacher.save_pretrained(root / "teacher")
    make_teacher("llama-untied", seed=1).save_pretrained(root / "other")
    assert lrc_main(["svd", "--teacher", str(root / "teacher"), "--out", str(root / "svd")]) == 0
    assert lrc_main(["svd", "--teacher", str(root / "other"), "--out", str(root / "svd_other")]) == 0
    student = build_student(teacher, R)
    apply_arm(student, teacher, "confined", bases=load_bases(root / "svd"))
    save_lrc_state(student, root / "state", tokens=0)
    assert lrc_main(["merge", *_merge_args(root, root / "merged")]) == 0
    return root


def _merge_args(root: Path, out: Path, *, state=None, teacher=None, bases=None) -> list[str]:
    return ["--state", str(state or root / "state"), "--teacher", str(teacher or root / "teacher"),
            "--bases", str(bases or root / "svd"), "--out", str(out)]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def _pickled_copy(src: Path, dst: Path) -> Path:
    """The same checkpoint with its weights as pytorch_model.bin only."""
    model = load_causal_lm(src, dtype=torch.float32)
    dst.mkdir()
    model.config.save_pretrained(dst)
    torch.save(model.state_dict(), dst / "pytorch_model.bin")
    return dst


def _fails(argv: list[str], capsys, *culprits: str) -> str:
    capsys.readouterr()
    assert lrc_main(argv) == 2
    err = capsys.readouterr().err
    assert "\nerror: " in "\n" + err and "Traceback" not in err, err
    for culprit in culprits:
        assert culprit in err, (culprit, err)
    return err


# ---------------------------------------------------------------- item 7: pickles


def test_pickled_teacher_is_refused_by_every_command_unless_allowed(world, tmp_path, capsys):
    pickled = _pickled_copy(world / "teacher", tmp_path / "pickled")
    (tmp_path / "svd").mkdir()
    (tmp_path / "svd" / "earlier.txt").write_text("kept")
    _fails(["svd", "--teacher", str(pickled), "--out", str(tmp_path / "svd")], capsys, "pytorch_model.bin",
           "--allow-pickle")
    assert _snapshot(tmp_path / "svd") == {"earlier.txt": b"kept"}
    _fails(["merge", *_merge_args(world, tmp_path / "m", teacher=pickled)], capsys, "pytorch_model.bin")
    _fails(["recover", "--teacher", str(pickled), "--merged", str(world / "merged"), "--out", str(tmp_path / "r")],
           capsys, "pytorch_model.bin")
    _fails(["recover", "--teacher", str(world / "teacher"),
            "--merged", str(_pickled_copy(world / "merged", tmp_path / "pm")), "--out", str(tmp_path / "r")],
           capsys, "pytorch_model.bin")
    _fails(["audit", str(pickled), "--student-hidden", str(R), "--student", str(world / "merged")], capsys,
           "pytorch_model.bin")
    _fails(["bench", "--teacher", str(pickled), "--student-hidden", str(R), "--out", str(tmp_path / "b.csv")], capsys,
           "pytorch_model.bin")
    assert not any((tmp_path / d).exists() for d in ("m", "r", "b.csv"))
    # explicitly allowed: loaded (with torch.load(weights_only=True)), same bases as from safetensors
    assert lrc_main(["svd", "--teacher", str(pickled), "--out", str(tmp_path / "svd2"), "--allow-pickle"]) == 0
    ours, theirs = load_bases(world / "svd"), load_bases(tmp_path / "svd2")
    assert all(torch.equal(ours.U[k], theirs.U[k]) for k in ours.U)
    assert ours.meta["teacher_fingerprint"] == theirs.meta["teacher_fingerprint"]


def test_pickles_are_refused_by_the_shared_loader(world, tmp_path):
    from lrc.commands.evaluate import load_model
    from lrc.commands.sft import load_hf_model

    pickled = _pickled_copy(world / "merged", tmp_path / "pickled")
    for load in (lambda: load_hf_model(pickled), lambda: load_model(str(pickled), torch.device("cpu")),
                 lambda: load_teacher(pickled), lambda: load_causal_lm(pickled, dtype=torch.float32)):
        with pytest.raises(LRCError, match="refusing pickled weights pytorch_model.bin"):
            load()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text((pickled / "config.json").read_text())
    with pytest.raises(LRCError, match="has no weights"):
        load_causal_lm(tmp_path / "empty", dtype=torch.float32)
    sharded = _copy(world / "teacher", tmp_path / "sharded")
    (sharded / "model.safetensors.index.json").write_text('{"weight_map": ')
    with pytest.raises(LRCError, match="model.safetensors.index.json is not valid JSON"):
        load_teacher(sharded)


def test_distill_refuses_a_pickled_teacher(world, tmp_path):
    from lrc.commands.distill import main_distill
    from lrc.io.tokens import write_tokens

    write_tokens(tmp_path / "tokens", np.arange(8 * 16).reshape(8, 16) % 97)
    pickled = _pickled_copy(world / "teacher", tmp_path / "pickled")
    with pytest.raises(LRCError, match="pytorch_model.bin"):
        main_distill(["--teacher", str(pickled), "--data", str(tmp_path / "tokens"), "--out", str(tmp_path / "d"),
                      "--warmstart", str(world / "state"), "--arm", "dense", "--tokens", "0"])
    assert not (tmp_path / "d").exists()


# ---------------------------------------------------------------- item 6: corrupt files


def test_truncated_teacher_and_config_that_is_not_json(world, tmp_path, capsys):
    bad = _copy(world / "teacher", tmp_path / "teacher")
    _truncate(bad / "model.safetensors")
    (tmp_path / "svd").mkdir()
    (tmp_path / "svd" / "earlier.txt").write_text("kept")
    _fails(["svd", "--teacher", str(bad), "--out", str(tmp_path / "svd")], capsys, str(bad / "model.safetensors"),
           "truncated")
    _fails(["merge", *_merge_args(world, tmp_path / "m", teacher=bad)], capsys, str(bad / "model.safetensors"))
    assert _snapshot(tmp_path / "svd") == {"earlier.txt": b"kept"} and not (tmp_path / "m").exists()
    bad = _copy(world / "teacher", tmp_path / "teacher2")
    (bad / "config.json").write_text('{"model_type": "llama", "hidden_size": 32')  # cut short
    _fails(["svd", "--teacher", str(bad), "--out", str(tmp_path / "svd")], capsys, str(bad / "config.json"),
           "not valid JSON")
    _fails(["audit", str(bad), "--student-hidden", str(R)], capsys, str(bad / "config.json"))
    assert _snapshot(tmp_path / "svd") == {"earlier.txt": b"kept"}


def test_corrupt_student_state_and_lrc_json_and_bases(world, tmp_path, capsys):
    out = tmp_path / "merged"
    assert lrc_main(["merge", *_merge_args(world, out)]) == 0
    before = _snapshot(out)
    state = _copy(world / "state", tmp_path / "state")
    _truncate(state / STATE_FILE)
    _fails(["merge", *_merge_args(world, out, state=state)], capsys, str(state / STATE_FILE))
    state = _copy(world / "state", tmp_path / "state2")
    (state / STATE_META).write_text('{"arm": "confined", ')
    _fails(["merge", *_merge_args(world, out, state=state)], capsys, str(state / STATE_META), "not valid JSON")
    bases = _copy(world / "svd", tmp_path / "svd")
    _truncate(bases / BASES_FILE, 0.9)
    _fails(["merge", *_merge_args(world, out, bases=bases)], capsys, str(bases / BASES_FILE))
    bases = _copy(world / "svd", tmp_path / "svd2")
    (bases / BASES_META).write_text("{not json")
    _fails(["merge", *_merge_args(world, out, bases=bases)], capsys, str(bases / BASES_META))
    assert _snapshot(out) == before


def test_truncated_merged_model_is_named(world, tmp_path, capsys):
    merged = _copy(world / "merged", tmp_path / "merged")
    _truncate(merged / "model.safetensors", 0.3)
    _fails(["recover", "--teacher", str(world / "teacher"), "--merged", str(merged), "--out", str(tmp_path / "r")],
           capsys, str(merged / "model.safetensors"))
    _fails(["audit", str(world / "teacher"), "--student-hidden", str(R), "--student", str(merged),
            "--knockout", str(tmp_path / "k")],
           capsys, str(merged / "model.safetensors"))
    assert not (tmp_path / "r").exists() and not (tmp_path / "k").exists()
    from lrc.commands.evaluate import load_model

    with pytest.raises(LRCError, match="model.safetensors"):
        load_model(str(merged), torch.device("cpu"))


# ---------------------------------------------------------------- item 3: bases of another teacher


def test_bases_record_the_teacher_fingerprint(world):
    bases = load_bases(world / "svd")
    teacher = load_teacher(world / "teacher")
    assert (bases.meta["teacher_fingerprint"] == teacher_fingerprint(teacher)
            == compute_bases(teacher).meta["teacher_fingerprint"])
    assert bases.meta["teacher"] == str(world / "teacher")
    assert teacher_fingerprint(load_teacher(world / "other")) != bases.meta["teacher_fingerprint"]
    load_bases(world / "svd", teacher)  # its own teacher: accepted


def test_bases_of_another_teacher_with_the_same_shapes_are_refused(world, tmp_path, capsys):
    from lrc.commands.distill import main_distill
    from lrc.io.tokens import write_tokens

    out = tmp_path / "merged"
    assert lrc_main(["merge", *_merge_args(world, out)]) == 0
    before = _snapshot(out)
    wrong = world / "svd_other"
    _fails(["merge", *_merge_args(world, out, bases=wrong)], capsys, str(wrong / BASES_FILE), "another teacher",
           str(world / "other"))
    _fails(["audit", str(world / "teacher"), "--student-hidden", str(R), "--student", str(world / "merged"),
            "--bases", str(wrong)],
           capsys, str(wrong / BASES_FILE), "fingerprint")
    assert _snapshot(out) == before
    write_tokens(tmp_path / "tokens", np.arange(8 * 16).reshape(8, 16) % 97)
    with pytest.raises(LRCError, match="another teacher"):
        main_distill(["--teacher", str(world / "teacher"), "--data", str(tmp_path / "tokens"),
                      "--out", str(tmp_path / "d"), "--warmstart", str(world / "state"), "--bases", str(wrong),
                      "--arm", "confined", "--tokens", "0"])
    assert not (tmp_path / "d").exists()


def test_bases_without_a_fingerprint_are_accepted_with_a_warning(world, tmp_path, capsys):
    bases = load_bases(world / "svd")
    del bases.meta["teacher_fingerprint"]
    save_bases(bases, tmp_path / "old")
    load_bases(tmp_path / "old", load_teacher(world / "teacher"))
    err = capsys.readouterr().err
    assert "warning" in err and str(tmp_path / "old" / BASES_FILE) in err and "lrc svd" in err
    meta = json.loads((tmp_path / "old" / BASES_META).read_text())
    assert "teacher_fingerprint" not in meta


def test_the_teacher_is_frozen_where_it_becomes_one_not_by_the_loader(world):
    """The loader serves models that train (sft) too: it does not freeze; the LRC student
    built on a teacher, or the plain-KD objective, does (lrc.io.hf, "Where the teacher is frozen")."""
    from lrc.method.objectives import KDObjective
    from lrc.method.student import student_config

    teacher = load_teacher(world / "teacher")
    assert not teacher.training and all(p.requires_grad for p in teacher.parameters())
    build_student(teacher, R)
    assert not any(p.requires_grad for p in teacher.parameters())
    teacher = make_teacher("llama-untied").train()
    KDObjective(teacher, type(teacher)(student_config(teacher.config, R)))
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())


def test_a_sharded_safetensors_checkpoint_loads_and_a_truncated_shard_is_named(tmp_path):
    teacher = make_teacher("qwen2-tied")
    teacher.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    shards = sorted((tmp_path / "sharded").glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    loaded = load_teacher(tmp_path / "sharded")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), teacher.state_dict().values()))
    _truncate(shards[-1])
    with pytest.raises(LRCError, match=str(shards[-1])):
        load_teacher(tmp_path / "sharded")


def test_saved_configs_carry_rope_for_transformers_4_too(tmp_path):
    """A Llama-3.2-shaped RoPE (theta 500000, llama3 scaling): transformers 5 writes it only as
    rope_parameters, which 4.x ignores (theta 10000, no scaling: a wrong model). The saved config
    carries rope_theta and rope_scaling too, and 5.x still reads exactly its own."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from lrc.io.hf import save_causal_lm

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=96, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, rope_parameters=rope))
    save_causal_lm(model, tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["rope_theta"] == 500000.0
    assert saved["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}
    assert AutoConfig.from_pretrained(tmp_path / "m").rope_parameters == rope
    ids = torch.randint(0, 64, (1, 12))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert torch.equal(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)
