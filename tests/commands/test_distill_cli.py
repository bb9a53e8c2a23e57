"""`lrc warmstart` and `lrc distill` end to end on a tiny teacher, and a kill/restart of `lrc distill`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lrc.errors import LRCError
from tests.helpers import make_teacher, make_tokenizer, write_corpus


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    tok = make_tokenizer(root / "teacher")
    make_teacher("llama-tied", vocab_size=len(tok)).save_pretrained(root / "teacher")
    write_corpus(root / "data" / "train", tok, rows=32, seq_len=16)
    return root


def common(root: Path, out: Path, *extra: str) -> list[str]:
    return ["--teacher", str(root / "teacher"), "--data", str(root / "data"), "--out", str(out),
            "--batch-size", "4", "--micro-batch-size", "2", "--lr", "3e-3", "--log-every", "1", "--no-progress",
            "--threads", "1", *extra]


def test_zero_token_warmstart_then_arms_train(setup, tmp_path):
    from lrc.commands.distill import main_distill, main_warmstart

    root = setup
    assert main_warmstart(common(root, tmp_path / "ws", "--student-hidden", "16", "--tokens", "0")) == 0
    meta = json.loads((tmp_path / "ws" / "lrc.json").read_text())
    assert meta["arm"] == "slice" and meta["meta"]["tokens"] == 0
    assert (tmp_path / "ws" / "metrics.jsonl").read_text() == ""
    for arm in ("slice", "core"):
        out = tmp_path / arm
        assert main_distill(common(root, out, "--warmstart", str(tmp_path / "ws"), "--arm", arm,
                                   "--tokens", str(6 * 4 * 16))) == 0
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert len(lines) == 6
        assert ({"loss", "ce", "kl", "q", "k", "v", "attn_out", "gate", "up", "mlp_out", "lr", "grad_norm"}
                <= set(lines[0]))
        assert lines[-1]["loss"] < lines[0]["loss"]
        assert json.loads((out / "lrc.json").read_text())["arm"] == arm
        settings = json.loads((out / "settings.json").read_text())
        assert settings["command"] == "distill" and settings["training"]["steps"] == 6


def test_kl_recipe_from_random_init_and_argument_errors(setup, tmp_path):
    from lrc.commands.distill import main_distill

    root = setup
    out = tmp_path / "kl"
    assert main_distill(common(root, out, "--student-hidden", "16", "--arm", "dense", "--recipe", "kl",
                               "--tokens", str(2 * 4 * 16))) == 0
    line = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert set(line) >= {"kl", "ce"} and "gate" not in line
    with pytest.raises(LRCError, match="exactly one of --warmstart"):
        main_distill(common(root, tmp_path / "x", "--arm", "dense"))
    with pytest.raises(LRCError, match="unknown --arm"):
        main_distill(common(root, tmp_path / "x", "--arm", "bogus", "--student-hidden", "16"))


@pytest.mark.slow
def test_distill_killed_and_restarted_equals_uninterrupted(setup, tmp_path):
    from lrc.commands.distill import main_warmstart
    from tests.helpers import ENV, kill_mid_run

    root = setup
    assert main_warmstart(common(root, tmp_path / "ws", "--student-hidden", "16", "--tokens", str(4 * 4 * 16))) == 0
    steps = 300

    def cmd(out: Path) -> list[str]:
        return [sys.executable, "-m", "lrc.cli", "distill",
                *common(root, out, "--warmstart", str(tmp_path / "ws"), "--arm", "core",
                        "--tokens", str(steps * 4 * 16), "--checkpoint-every", "20", "--log-every", "10",
                        "--seed", "2")]

    subprocess.run(cmd(tmp_path / "straight"), env=ENV, check=True, capture_output=True, timeout=300)
    kill_mid_run(cmd(tmp_path / "killed"), tmp_path / "killed.ckpt", after_step=20)
    subprocess.run(cmd(tmp_path / "killed"), env=ENV, check=True, capture_output=True, timeout=300)
    training = json.loads((tmp_path / "killed" / "settings.json").read_text())["training"]
    assert training["resumed_from"] is not None
    a = load_file(str(tmp_path / "straight" / "student.safetensors"))
    b = load_file(str(tmp_path / "killed" / "student.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
