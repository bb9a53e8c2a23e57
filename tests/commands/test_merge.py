"""Merge: a plain HF checkpoint with the training student's logits, for every arm."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from lrc.cli import main as lrc_main
from lrc.commands.merge import merge_student, save_merged
from lrc.errors import LRCError
from lrc.method.reach import apply_arm
from lrc.method.spectral import compute_bases
from lrc.method.student import build_student, save_lrc_state, trainable_parameters
from lrc.names import ARMS
from tests.helpers import make_teacher


def trained_student(teacher, arm, bases):
    student = build_student(teacher, 16, seed=4)
    apply_arm(student, teacher, arm, bases=bases, seed=1)
    with torch.no_grad():  # move away from the warm start so the check means something
        for _, p in trainable_parameters(student):
            p.add_(0.05 * torch.randn_like(p))
    return student


def test_merge_round_trip_every_arm(teacher, token_batch, tmp_path):
    bases = compute_bases(teacher)
    for arm in ARMS:
        student = trained_student(teacher, arm, bases)
        before = {k: v.clone() for k, v in student.state_dict().items()}
        out = tmp_path / arm
        check = save_merged(student, out, check_ids=token_batch)
        assert check["passed"] and check["max_abs_diff"] <= 1e-5
        reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        diff = (reloaded(input_ids=token_batch).logits - student(input_ids=token_batch).logits).abs().max()
        assert diff <= 1e-5, arm
        tied = teacher.config.tie_word_embeddings
        assert reloaded.config.tie_word_embeddings == tied
        assert (reloaded.lm_head.weight is reloaded.model.embed_tokens.weight) == tied
        assert ("lm_head.weight" in load_file(str(out / "model.safetensors"))) == (not tied)
        assert reloaded.config.rms_norm_eps == teacher.config.rms_norm_eps
        assert reloaded.config.hidden_size == 16 and reloaded.config.head_dim == 8
        assert json.loads((out / "merge_check.json").read_text())["max_abs_diff"] == check["max_abs_diff"]
        # transformers' generate (KV cache) on the saved model continues as the student does
        generation = check["generation"]
        assert generation["passed"] and generation["merged"] == generation["student"]
        assert len(generation["student"]) == 8 and check["saved_dtype"] == "fp32"
        # the training student is untouched
        after = student.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)


def test_merged_model_has_no_parametrisations_and_trained_eps():
    teacher = make_teacher("qwen2-tied")
    student = build_student(teacher, 16, norm_eps=1e-5)
    merged = merge_student(student)
    assert not any("parametrizations" in k for k in merged.state_dict())
    assert merged.config.rms_norm_eps == 1e-5  # the eps trained, not the teacher's 1e-6


def test_failed_check_leaves_nothing(tmp_path, token_batch):
    teacher = make_teacher("llama-untied")
    student = trained_student(teacher, "dense", None)
    with pytest.raises(LRCError, match="merge check failed"):
        save_merged(student, tmp_path / "m", check_ids=token_batch, atol=-1.0)
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.tmp").exists()


def test_svd_and_merge_commands(tmp_path, capsys):
    teacher = make_teacher("qwen2-untied")
    teacher.save_pretrained(tmp_path / "teacher")
    assert lrc_main(["svd", "--teacher", str(tmp_path / "teacher"), "--out", str(tmp_path / "svd")]) == 0
    assert (tmp_path / "svd" / "bases.safetensors").is_file() and (tmp_path / "svd" / "settings.json").is_file()
    from lrc.method.spectral import load_bases

    bases = load_bases(tmp_path / "svd")
    student = trained_student(teacher, "core", bases)
    save_lrc_state(student, tmp_path / "state", tokens=0)
    common = ["merge", "--state", str(tmp_path / "state"), "--teacher", str(tmp_path / "teacher"),
              "--bases", str(tmp_path / "svd")]
    assert lrc_main(common + ["--out", str(tmp_path / "merged")]) == 0
    check = json.loads((tmp_path / "merged" / "merge_check.json").read_text())
    assert check["passed"] and check["arm"] == "core"
    assert (tmp_path / "merged" / "settings.json").is_file()
    # a model card: the teacher, the arm, the merge check and the command; no licence file to copy here
    card = (tmp_path / "merged" / "README.md").read_text()
    assert "arm `core`" in card and f"`{tmp_path / 'teacher'}`" in card and "max abs logit difference" in card
    assert "greedy `generate` continues as the student (yes)" in card and "| weights | fp32 |" in card
    assert "holds no licence file: look up the teacher's licence" in card and "`lrc merge --state " in card
    ids = torch.randint(0, 97, (2, 16))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    assert (reloaded(input_ids=ids).logits - student(input_ids=ids).logits).abs().max() <= 1e-5
    # the check batch can come from a token directory
    import numpy as np

    from lrc.io.tokens import write_tokens

    write_tokens(tmp_path / "tokens", np.arange(3 * 40).reshape(3, 40) % 97)
    (tmp_path / "teacher" / "LICENSE").write_text("the teacher's licence\n")  # travels with the student
    (tmp_path / "teacher" / "settings.json").write_text(json.dumps(
        {"settings": {"repo_id": "org/teacher", "revision": "abc123"}}))
    assert lrc_main(common + ["--data", str(tmp_path / "tokens"), "--out", str(tmp_path / "merged2"),
                              "--check-len", "24"]) == 0
    assert (tmp_path / "merged2" / "LICENSE").read_text() == "the teacher's licence\n"
    card = (tmp_path / "merged2" / "README.md").read_text()
    assert "base_model: org/teacher" in card and "at revision `abc123`" in card
    assert "copied here from the teacher: LICENSE" in card
    assert json.loads((tmp_path / "merged2" / "merge_check.json").read_text())["check_batch_shape"] == [2, 24]
    write_tokens(tmp_path / "big", np.full((1, 8), 500))
    assert lrc_main(common + ["--data", str(tmp_path / "big"), "--out", str(tmp_path / "merged3")]) == 2
    assert "500" in capsys.readouterr().err and not (tmp_path / "merged3").exists()
    assert lrc_main(["merge", "--state", str(tmp_path / "nothing"), "--teacher", str(tmp_path / "teacher"),
                     "--out", str(tmp_path / "x")]) == 2
    assert "lrc.json" in capsys.readouterr().err


def test_generation_check_can_fail():
    """Two students that differ: the check sees different greedy tokens (unless at a near-tie)."""
    from lrc.commands.merge import generation_check, greedy_tokens

    teacher = make_teacher("llama-untied")
    a, b = trained_student(teacher, "dense", None), trained_student(teacher, "slice", None)
    prompt = torch.arange(8) % 97
    result = generation_check(a, merge_student(b), prompt, atol=1e-5)
    assert result["student"] == greedy_tokens(a, prompt)[0] and result["merged"] == greedy_tokens(b, prompt)[0]
    assert result["student"] != result["merged"] and not result["passed"]


@pytest.mark.parametrize("dtype, torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_a_half_precision_checkpoint_is_the_checked_one_cast(dtype, torch_dtype, token_batch, tmp_path):
    teacher = make_teacher("llama-tied")
    student = trained_student(teacher, "core", compute_bases(teacher))
    check = save_merged(student, tmp_path / "m", check_ids=token_batch, dtype=dtype)
    assert check["passed"] and check["max_abs_diff"] <= 1e-5 and check["saved_dtype"] == dtype
    saved = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert {v.dtype for v in saved.values()} == {torch_dtype}
    fp32 = merge_student(student)
    assert all(torch.equal(saved[k], fp32.state_dict()[k].to(torch_dtype)) for k in saved)
    assert 0 < check["saved_max_abs_diff"] < 1  # rounding, recorded
    assert json.loads((tmp_path / "m" / "merge_check.json").read_text())["saved_dtype"] == dtype


def test_auto_saves_in_the_training_precision(tmp_path):
    from lrc.commands.merge import save_dtype

    assert save_dtype("auto", tmp_path) == "fp32"  # no settings.json
    (tmp_path / "settings.json").write_text(json.dumps({"training": {"mixed_precision": "bf16"}}))
    assert save_dtype("auto", tmp_path) == "bf16" and save_dtype("fp32", tmp_path) == "fp32"
    (tmp_path / "settings.json").write_text(json.dumps({"training": {"mixed_precision": "no"}}))
    assert save_dtype("auto", tmp_path) == "fp32"


def test_upload_checks_the_student_then_reaches_the_hub(tmp_path, capsys, monkeypatch):
    """`lrc upload` refuses what is not a checked merged student before any network call; a good one
    gets as far as the hub (offline here: named), leaving settings.json behind."""
    import huggingface_hub

    from lrc.commands.upload import files_to_upload

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    teacher = make_teacher("llama-tied")
    teacher.save_pretrained(tmp_path / "teacher")
    save_lrc_state(trained_student(teacher, "dense", None), tmp_path / "state", tokens=0)
    merged = tmp_path / "merged"
    assert lrc_main(["merge", "--state", str(tmp_path / "state"), "--teacher", str(tmp_path / "teacher"),
                     "--out", str(merged)]) == 0
    files = files_to_upload(merged)
    assert {"README.md", "config.json", "model.safetensors", "merge_check.json"} <= set(files)
    assert "settings.json" not in files and (merged / "settings.json").is_file()

    capsys.readouterr()
    assert lrc_main(["upload", str(merged), "--repo-id", "me/my-student"]) == 2
    assert "cannot upload to me/my-student: the hub is switched off here (HF_HUB_OFFLINE=1)" in capsys.readouterr().err
    assert lrc_main(["upload", str(merged), "--repo-id", "not a repo id"]) == 2
    assert "--repo-id 'not a repo id'" in capsys.readouterr().err
    check = json.loads((merged / "merge_check.json").read_text())
    (merged / "merge_check.json").write_text(json.dumps(check | {"passed": False}))
    with pytest.raises(LRCError, match="the merge check did not pass"):
        files_to_upload(merged)
    (merged / "README.md").unlink()
    with pytest.raises(LRCError, match="no README.md"):
        files_to_upload(merged)
