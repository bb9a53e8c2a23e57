"""Kill and restart, one matrix: a training command killed with SIGKILL mid-run and started again
ends bitwise equal to an uninterrupted run.

Every training command shares the loop and its checkpoints; the matrix runs it where the
checkpoint differs: the plain LM loop (`lrc pretrain`), LRC with the optimizer-step core and its
update-energy rows (written between checkpoints), 2 processes under DDP with sharded optimiser
states (process 0 gathers them), and 2 processes under FSDP2 on a tied Llama (accelerate's sharded
checkpoint, the sharded tie). The kill takes the launcher and every process below it, as a
scheduler kills a job. On the CPU the result must be bitwise equal: the data order is a function of
the step, the checkpoint restores parameters, AdamW moments, the schedule and the RNG exactly, and
the restarted process runs the same kernels with the same thread count.

The checkpoint's finer cases (a torn metrics line, other settings, a code change, a kill while
stripping, activation checkpointing switched on a resume) are tested in-process beside the module
that handles them; a live orphan holding the directory is tested here.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from lrc.method.update_energy import UPDATE_ENERGY_FILE
from lrc.training import checkpoint as ckpt
from tests.helpers import make_tokenizer, write_corpus, write_llama_config
from tests.launch import DDP_CONFIG, ENV, FSDP_CONFIG, REPO, distill_flags, launch, run

# case: (steps, checkpoint every); killed after its first checkpoint. One process is fast, so its
# runs are long enough that the kill lands well before the end.
CASES = {"pretrain": (300, 20), "distill": (150, 10), "zero": (40, 5), "fsdp": (40, 5)}


def pretrain_command(root: Path, steps: int, every: int):
    tok = make_tokenizer(root / "tok")
    write_corpus(root / "data", tok, rows=64, seq_len=32)
    write_llama_config(root / "config.json", len(tok))

    def cmd(out: Path) -> list[str]:
        return [sys.executable, "-m", "lrc.cli", "pretrain", "--model-config", str(root / "config.json"),
                "--tokenizer", str(root / "tok"), "--data", str(root / "data"), "--out", str(out),
                "--tokens", str(steps * 4 * 32), "--batch-size", "4", "--micro-batch-size", "2", "--lr", "3e-3",
                "--schedule", "cosine", "--warmup", "0.05", "--checkpoint-every", str(every), "--log-every", "20",
                "--threads", "1", "--seed", "3", "--no-progress"]

    return cmd


def case_command(case: str, world: Path, tmp_path: Path):
    """``cmd(out)`` of one case of the matrix, and the name of its weights file."""
    steps, every = CASES[case]
    if case == "pretrain":
        return pretrain_command(tmp_path, steps, every), "model.safetensors"

    def flags(out: Path) -> list[str]:
        extra = {"distill": ["--update-energy-every", "7"], "zero": ["--shard-optimizer"], "fsdp": []}[case]
        return distill_flags(world, out, "core", steps, "--checkpoint-every", str(every), "--log-every", "5", *extra,
                             fsdp=case == "fsdp")

    if case == "distill":
        return (lambda out: [sys.executable, "-m", "lrc.cli", "distill", *flags(out)]), "student.safetensors"
    config = DDP_CONFIG if case == "zero" else FSDP_CONFIG
    return (lambda out: launch("-m", "lrc.cli", "distill", *flags(out), config=config)), "student.safetensors"


def kill_after_checkpoint(cmd: list[str], ckpt_dir: Path, after_step: int, timeout: float = 240) -> None:
    """Start ``cmd``; SIGKILL it and every process below it (accelerate's launcher starts the
    ranks in sessions of their own) once a checkpoint at or after ``after_step`` exists."""
    proc = subprocess.Popen(cmd, env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def kill_all() -> None:
        try:
            tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(tree, timeout=30)

    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if any(int(p.name.split("-")[1]) >= after_step for p in ckpt.list_checkpoints(ckpt_dir)):
                kill_all()
                break
            time.sleep(0.01)
        else:
            raise AssertionError(f"no checkpoint at step >= {after_step} before the run ended: "
                                 f"{proc.stderr.read().decode()[-2000:]}")
    finally:
        kill_all()
        proc.wait(30)
    assert ckpt.read_done(ckpt_dir) is None, "killed too late: the run had finished"


def logged(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (out / ckpt.METRICS_FILE).read_text().splitlines())]


@pytest.mark.slow
@pytest.mark.parametrize("world", ["llama-tied"], indirect=True)
@pytest.mark.parametrize("case", list(CASES))
def test_killed_and_restarted_equals_uninterrupted(case, world, tmp_path):
    cmd, weights = case_command(case, world, tmp_path)
    steps, kill_at = CASES[case]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run(cmd(straight))
    kill_after_checkpoint(cmd(killed), tmp_path / "killed.ckpt", kill_at)
    assert not killed.exists()
    run(cmd(killed))

    training = json.loads((killed / "settings.json").read_text())["training"]
    assert kill_at <= int(Path(training["resumed_from"]).name.split("-")[1]) < steps
    a, b = load_file(str(straight / weights)), load_file(str(killed / weights))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ"
    # the metrics log has each logged step once, with the uninterrupted run's losses
    assert logged(killed) == logged(straight) and len({s for s, _ in logged(killed)}) == len(logged(killed))
    if case == "distill":  # the update-energy rows of the steps after the checkpoint are written once
        assert (killed / UPDATE_ENERGY_FILE).read_text() == (straight / UPDATE_ENERGY_FILE).read_text()

    # The finished run again (Snakemake removed its output): nothing retrained, the same weights.
    killed.rename(tmp_path / "killed.first")
    run(cmd(killed))
    assert json.loads((killed / "settings.json").read_text())["training"]["already_done"] is True
    c = load_file(str(killed / weights))
    assert all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.slow
def test_a_rerun_beside_a_live_orphan_is_refused_naming_its_pid(tmp_path):
    """Issue 9 item 10: a run still training (an orphan of a killed Snakemake) keeps its
    checkpoint directory; a second run on it exits 2 naming that process and touches nothing."""
    cmd = pretrain_command(tmp_path, 4000, 40)
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
