"""`lrc warmstart` and `lrc distill` end to end on a tiny teacher (killed and restarted: test_resume.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
