"""`accelerate launch` runs of `lrc distill` on 2 CPU processes (gloo) and what compares them with 1 process:
the FSDP2 world (a saved teacher, a corpus and a warm start), the flags, the launch command, the run, the
loss and weight comparison, and the kill-and-restart check. Shared by test_fsdp, test_zero and
test_teacher_recompute, and by the ``world`` fixture (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from lrc.method.reach import COORDINATE_ARMS
from lrc.training import checkpoint as ckpt
from tests.helpers import make_teacher, make_tokenizer, write_corpus

REPO = Path(__file__).resolve().parents[1]
FSDP_CONFIG = REPO / "config" / "accelerate" / "fsdp-cpu2.yaml"
ENV = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1",
                    "TOKENIZERS_PARALLELISM": "false",
                    "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
STEPS, BATCH, MICRO, SEQ = 8, 8, 2, 16
RTOL = ATOL = 1e-5
_port = iter(range(29610, 29700))


def make_world(root: Path, kind: str) -> Path:
    """A saved teacher, a corpus and a trained warm start (4 steps) in ``root``: the ``world`` fixture
    (tests/conftest.py) of test_fsdp, test_zero and test_teacher_recompute."""
    from lrc.commands.distill import main_warmstart

    tok = make_tokenizer(root / "tokenizer")  # beside the teacher: AutoTokenizer would swap Qwen2's class in
    make_teacher(kind, vocab_size=len(tok)).save_pretrained(root / "teacher")
    write_corpus(root / "data" / "train", tok, rows=48, seq_len=SEQ)
    assert main_warmstart(flags(root, root / "ws", "--student-hidden", "16", "--tokens", str(4 * BATCH * SEQ))) == 0
    return root


def flags(root: Path, out: Path, *extra: str) -> list[str]:
    return ["--teacher", str(root / "teacher"), "--data", str(root / "data"), "--out", str(out),
            "--batch-size", str(BATCH), "--micro-batch-size", str(MICRO), "--lr", "3e-3", "--warmup", "0.1",
            "--log-every", "1", "--no-progress", "--threads", "1", *extra]


def distill_flags(root: Path, out: Path, arm: str, steps: int = STEPS, *extra: str) -> list[str]:
    # FSDP2 shards the MLP matrices, and the optimizer-step basis change needs them whole: core
    # and randcomp run with their parametrised implementation under FSDP (both processes counts
    # alike, so the comparison is like for like).
    impl = ["--core-impl", "parametrized"] if arm in COORDINATE_ARMS else []
    return flags(root, out, "--warmstart", str(root / "ws"), "--arm", arm, "--tokens", str(steps * BATCH * SEQ),
                 "--seed", "1", *impl, *extra)


def launch(*args: str) -> list[str]:
    """``accelerate launch`` with config/accelerate/fsdp-cpu2.yaml (FSDP2, 2 CPU processes), on a fresh port."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP_CONFIG),
            "--main_process_port", str(next(_port)), *args]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=ENV, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def compare(a: Path, b: Path) -> tuple[float, float]:
    """(max relative loss difference, max |weight difference|) of two LRC state directories."""
    la, lb = losses(a), losses(b)
    assert len(la) == len(lb) > 0
    wa, wb = load_file(str(a / "student.safetensors")), load_file(str(b / "student.safetensors"))
    assert set(wa) == set(wb)
    rel = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
    return rel, max(float((wa[n] - wb[n]).abs().max()) if wa[n].numel() else 0.0 for n in wa)


def _kill_job_after(cmd: list[str], ckpt_dir: Path, after_step: int, timeout: float = 240) -> None:
    """Start ``cmd``; SIGKILL it and every process below it (the launcher and the ranks, which
    torchrun starts in sessions of their own) once a checkpoint at or after ``after_step``
    exists, as a scheduler kills a job's cgroup."""
    import psutil

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
                return
            time.sleep(0.05)
        raise AssertionError(f"no checkpoint at step >= {after_step} before the run ended (rc {proc.poll()})")
    finally:
        kill_all()
        proc.wait(30)


def killed_and_restarted_equals_uninterrupted(cmd, tmp_path: Path) -> dict:
    """Run ``cmd(out)`` straight, and killed after step 5 then restarted: the restart resumed
    from a checkpoint and ends bitwise equal (weights and losses). Returns the weights."""
    run(cmd(tmp_path / "straight"))
    _kill_job_after(cmd(tmp_path / "killed"), tmp_path / "killed.ckpt", after_step=5)
    assert not (tmp_path / "killed").exists() and not (tmp_path / "killed.ckpt" / ckpt.DONE_FILE).exists()
    run(cmd(tmp_path / "killed"))
    settings = json.loads((tmp_path / "killed" / "settings.json").read_text())["training"]
    assert settings["resumed_from"] and int(Path(settings["resumed_from"]).name.split("-")[1]) >= 5
    a, b = (load_file(str(tmp_path / "straight" / "student.safetensors")),
            load_file(str(tmp_path / "killed" / "student.safetensors")))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert losses(tmp_path / "straight") == losses(tmp_path / "killed")
    return a
