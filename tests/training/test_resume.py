"""Kill a training command with SIGKILL mid-run, restart it: the result equals an uninterrupted run.

The command is `lrc pretrain` (every training command shares the loop and its checkpoints;
tests/commands/test_distill_cli.py repeats this for `lrc distill` when the LRC core is present).
On the CPU the weights must be bitwise equal: the data order is a function of the step, the
checkpoint restores parameters, AdamW moments, the schedule and the RNG exactly, and the
restarted process runs the same kernels with the same thread count.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lrc.training import checkpoint as ckpt
from tests.helpers import (
    ENV,
    kill_mid_run,
    make_tokenizer,
    write_corpus,
    write_llama_config,
)


def pretrain_command(tmp_path: Path, steps: int):
    tok = make_tokenizer(tmp_path / "tok")
    write_corpus(tmp_path / "data", tok, rows=64, seq_len=32)
    write_llama_config(tmp_path / "config.json", len(tok))

    def cmd(out: Path) -> list[str]:
        return [sys.executable, "-m", "lrc.cli", "pretrain", "--model-config", str(tmp_path / "config.json"),
                "--tokenizer", str(tmp_path / "tok"), "--data", str(tmp_path / "data"), "--out", str(out),
                "--tokens", str(steps * 4 * 32), "--batch-size", "4", "--micro-batch-size", "2", "--lr", "3e-3",
                "--schedule", "cosine", "--warmup", "0.05", "--checkpoint-every", "40", "--log-every", "20",
                "--threads", "1", "--seed", "3", "--no-progress"]

    return cmd


@pytest.mark.slow
def test_sigkill_then_restart_gives_the_uninterrupted_weights(tmp_path):
    steps = 600
    cmd = pretrain_command(tmp_path, steps)

    subprocess.run(cmd(tmp_path / "straight"), env=ENV, check=True, capture_output=True, timeout=300)
    kill_mid_run(cmd(tmp_path / "killed"), tmp_path / "killed.ckpt", after_step=40)
    assert not (tmp_path / "killed" / "model.safetensors").exists()
    subprocess.run(cmd(tmp_path / "killed"), env=ENV, check=True, capture_output=True, timeout=300)

    training = json.loads((tmp_path / "killed" / "settings.json").read_text())["training"]
    resumed_at = int(Path(training["resumed_from"]).name.split("-")[1])
    assert 40 <= resumed_at < steps
    a = load_file(str(tmp_path / "straight" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"
    # The metrics log has each step once, as if never interrupted.
    steps_logged = [json.loads(x)["step"] for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert steps_logged == list(range(20, steps + 1, 20))
    # Rerunning the finished command retrains nothing and rewrites the same weights.
    subprocess.run(cmd(tmp_path / "killed"), env=ENV, check=True, capture_output=True, timeout=300)
    assert json.loads((tmp_path / "killed" / "settings.json").read_text())["training"]["already_done"]
    c = load_file(str(tmp_path / "killed" / "model.safetensors"))
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_pretrain_same_seed_same_weights_and_outputs(tmp_path):
    from lrc.commands.pretrain import main

    tok = make_tokenizer(tmp_path / "tok")
    write_corpus(tmp_path / "data", tok, rows=16, seq_len=16)
    write_llama_config(tmp_path / "config.json", len(tok))
    common = ["--model-config", str(tmp_path / "config.json"), "--tokenizer", str(tmp_path / "tok"),
              "--data", str(tmp_path / "data"), "--tokens", str(5 * 4 * 16), "--batch-size", "4",
              "--micro-batch-size", "4", "--lr", "1e-3", "--no-progress", "--log-every", "1"]
    for name in ("a", "b"):
        assert main(common + ["--out", str(tmp_path / name)]) == 0
    a, b = (load_file(str(tmp_path / n / "model.safetensors")) for n in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    out = tmp_path / "a"
    assert ({"config.json", "model.safetensors", "tokenizer.json", "settings.json", "metrics.jsonl"}
            <= {p.name for p in out.iterdir()})
    settings = json.loads((out / "settings.json").read_text())
    assert (settings["command"] == "pretrain" and settings["settings"]["tokens"] == 320
            and settings["training"]["steps"] == 5)
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert reloaded.config.vocab_size == len(tok)
    # A different seed gives different weights.
    assert main(common + ["--out", str(tmp_path / "c"), "--seed", "1"]) == 0
    c = load_file(str(tmp_path / "c" / "model.safetensors"))
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


@pytest.mark.slow
def test_a_rerun_beside_a_live_orphan_is_refused_naming_its_pid(tmp_path):
    """Issue 9 item 10: a run still training (an orphan of a killed Snakemake) keeps its
    checkpoint directory; a second run on it exits 2 naming that process and touches nothing."""
    cmd = pretrain_command(tmp_path, 4000)
    orphan = subprocess.Popen(cmd(tmp_path / "out"), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not ckpt.list_checkpoints(tmp_path / "out.ckpt"):
            assert orphan.poll() is None and time.monotonic() < deadline, "the first run ended or made no checkpoint"
            time.sleep(0.05)
        second = subprocess.run(cmd(tmp_path / "out"), env=ENV, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"in use by process {orphan.pid}" in second.stderr
        assert orphan.poll() is None, "the refused run must not disturb the one holding the directory"
        assert not (tmp_path / "out").exists()
    finally:
        orphan.send_signal(signal.SIGKILL)
        orphan.wait()
