"""`accelerate launch` runs of `lrc distill` on 2 CPU processes (gloo) and what compares them with 1 process:
the FSDP2 world (a saved teacher, a corpus and a warm start), the flags, the launch command, the run, the
loss and weight comparison. Shared by test_fsdp, test_zero, test_teacher_recompute and test_resume, and by the
``world`` fixture (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

from lrc.method.reach import COORDINATE_ARMS
from tests.helpers import free_port, make_teacher, make_tokenizer, write_corpus

REPO = Path(__file__).resolve().parents[1]
FSDP_CONFIG = REPO / "config" / "accelerate" / "fsdp-cpu2.yaml"
DDP_CONFIG = REPO / "config" / "accelerate" / "cpu2.yaml"
ENV = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1",
                    "TOKENIZERS_PARALLELISM": "false",
                    "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
STEPS, BATCH, MICRO, SEQ = 8, 8, 2, 16
RTOL = ATOL = 1e-5


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


def distill_flags(root: Path, out: Path, arm: str, steps: int = STEPS, *extra: str, fsdp: bool = True) -> list[str]:
    # FSDP2 shards the MLP matrices, and the optimizer-step basis change needs them whole: core
    # and randcomp run with their parametrised implementation under FSDP (both processes counts
    # alike, so the comparison is like for like); fsdp=False keeps the default, in the optimiser step.
    # Likewise the weights are built per micro-batch, as FSDP2 builds them (lrc.training.weight_build).
    impl = ["--core-impl", "parametrized"] if fsdp and arm in COORDINATE_ARMS else []
    impl += ["--weight-build", "micro_batch"] if fsdp else []
    return flags(root, out, "--warmstart", str(root / "ws"), "--arm", arm, "--tokens", str(steps * BATCH * SEQ),
                 "--seed", "1", *impl, *extra)


def launch(*args: str, config: Path = FSDP_CONFIG) -> list[str]:
    """``accelerate launch`` on 2 CPU processes, on a free port: FSDP2 by default (config/accelerate/fsdp-cpu2.yaml),
    ``config=DDP_CONFIG`` for plain DDP."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
            "--main_process_port", str(free_port()), *args]


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
