"""Recover LRC factors from a merged student by least squares."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from lrc.cli import main as lrc_main
from lrc.commands.merge import save_merged
from lrc.commands.recover import recover_student
from lrc.method.student import build_student, load_lrc_state, trainable_parameters
from tests.helpers import make_teacher


def test_recovered_factors_reproduce_a_merged_lrc_student(teacher, token_batch, tmp_path):
    student = build_student(teacher, 16, seed=3, norm_eps=1e-4)
    with torch.no_grad():
        for _, p in trainable_parameters(student):
            p.add_(0.05 * torch.randn_like(p))
    save_merged(student, tmp_path / "m", check_ids=token_batch)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32)
    recovered, residuals = recover_student(teacher, merged)
    assert max(residuals.values()) < 1e-6
    diff = (recovered(input_ids=token_batch).logits - merged(input_ids=token_batch).logits).abs().max()
    assert diff <= 1e-5
    assert recovered.config.rms_norm_eps == 1e-4
    assert recovered.lrc_info["arm"] == "slice"


def test_a_non_lrc_model_is_reported(tmp_path, capsys):
    teacher = make_teacher("qwen2-untied")
    teacher.save_pretrained(tmp_path / "teacher")
    # a random model of the student's shape: not generated from this teacher
    torch.manual_seed(5)
    Qwen2ForCausalLM(build_student(teacher, 16).config).save_pretrained(tmp_path / "random")
    argv = ["recover", "--teacher", str(tmp_path / "teacher"), "--merged", str(tmp_path / "random"),
            "--out", str(tmp_path / "out")]
    assert lrc_main(argv) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "not an LRC student" in err
    report = json.loads((tmp_path / "out" / "recover.json").read_text())
    assert not report["is_lrc_student"] and report["max_relative_residual"] > 0.1
    assert load_lrc_state(tmp_path / "out", teacher).lrc_info["arm"] == "slice"
    assert lrc_main(argv + ["--strict"]) == 2


def test_recover_command_on_a_true_lrc_student(tmp_path, token_batch):
    teacher = make_teacher("llama-tied")
    teacher.save_pretrained(tmp_path / "teacher")
    student = build_student(teacher, 12, seed=2)
    save_merged(student, tmp_path / "m", check_ids=token_batch)
    assert lrc_main(["recover", "--teacher", str(tmp_path / "teacher"), "--merged", str(tmp_path / "m"),
                     "--out", str(tmp_path / "s")]) == 0
    report = json.loads((tmp_path / "s" / "recover.json").read_text())
    assert report["is_lrc_student"] and report["max_relative_residual"] < 1e-6
    again = load_lrc_state(tmp_path / "s", teacher)
    assert (again(input_ids=token_batch).logits - student(input_ids=token_batch).logits).abs().max() <= 1e-5
