"""`lrc distill --update-energy-every`: the rows, their meaning per arm, no effect on training, resume."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lrc.errors import LRCError
from lrc.method.update_energy import COLUMNS, UPDATE_ENERGY_FILE, logged_steps
from lrc.training import checkpoint as ckpt
from tests.helpers import free_port, make_teacher, make_tokenizer, write_corpus

STEPS = 7  # tokens = STEPS * batch 4 * seq 16


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny teacher, its bases, a token directory and a short warm start."""
    from lrc.commands.distill import main_warmstart
    from lrc.method.spectral import compute_bases, save_bases

    root = tmp_path_factory.mktemp("energy")
    tok = make_tokenizer(root / "teacher")
    teacher = make_teacher("llama-tied", vocab_size=len(tok))
    teacher.save_pretrained(root / "teacher")
    save_bases(compute_bases(teacher), root / "svd")
    write_corpus(root / "data" / "train", tok, rows=32, seq_len=16)
    assert main_warmstart(common(root, root / "ws", "--student-hidden", "16", "--tokens", str(3 * 4 * 16))) == 0
    return root


def common(root: Path, out: Path, *extra: str) -> list[str]:
    return ["--teacher", str(root / "teacher"), "--data", str(root / "data"), "--out", str(out),
            "--bases", str(root / "svd"), "--batch-size", "4", "--micro-batch-size", "2", "--lr", "3e-3",
            "--log-every", "2", "--no-progress", "--threads", "1", *extra]


def distill(root: Path, out: Path, arm: str, *extra: str) -> Path:
    from lrc.commands.distill import main_distill

    assert main_distill(common(root, out, "--warmstart", str(root / "ws"), "--arm", arm,
                               "--tokens", str(STEPS * 4 * 16), "--seed", "1", *extra)) == 0
    return out


def read_rows(out: Path) -> list[dict]:
    with (out / UPDATE_ENERGY_FILE).open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == COLUMNS
        return list(reader)


def test_logged_steps_are_the_multiples_and_the_last():
    assert logged_steps(3, 7, 7) == [3, 6, 7]
    assert logged_steps(3, 6, 7) == [3, 6]
    assert logged_steps(7, 7, 7) == [7]
    assert logged_steps(5, 0, 0) == []


@pytest.mark.parametrize("arm, extra", [("slice", ()), ("confined", ()), ("dense", ()), ("core", ()),
                                        ("core", ("--core-impl", "parametrized")), ("randcomp", ())])
def test_rows_and_share_inside_per_arm(world, tmp_path, arm, extra):
    out = distill(world, tmp_path / arm, arm, "--update-energy-every", "3", *extra)
    rows = read_rows(out)
    # 2 layers x 3 weights at steps 3, 6 and the last (7)
    assert [(int(r["step"]), int(r["layer"]), r["weight"]) for r in rows] == [
        (s, i, w) for s in (3, 6, 7) for i in (0, 1) for w in ("gate_proj", "up_proj", "down_proj")]
    assert all(int(r["tokens"]) == int(r["step"]) * 4 * 16 for r in rows)
    energy = torch.tensor([float(r["energy"]) for r in rows])
    share = torch.tensor([float(r["share_inside"]) for r in rows], dtype=torch.float64)
    inside = torch.tensor([float(r["inside"]) for r in rows], dtype=torch.float64)
    assert (energy > 0).all()
    assert torch.allclose(share, inside / energy.double())
    if arm in ("slice", "confined"):  # they cannot leave the teacher's spaces
        assert (share - 1).abs().max() < 1e-6, share
    else:  # the full-reach arms do
        assert share.max() < 1 - 1e-3, share


def test_energy_is_the_change_of_the_deployed_weight(world, tmp_path):
    """Recompute the last row set from the warm start and the saved student, independently."""
    from lrc.commands.merge import merge_student
    from lrc.io.hf import load_teacher
    from lrc.method.spectral import load_bases
    from lrc.method.student import load_lrc_state

    out = distill(world, tmp_path / "dense", "dense", "--update-energy-every", "7")
    teacher = load_teacher(world / "teacher")
    bases = load_bases(world / "svd", teacher)
    start = merge_student(load_lrc_state(world / "ws", teacher, bases))
    trained = load_lrc_state(out, teacher, bases)
    end = merge_student(trained)
    rows = {(int(r["layer"]), r["weight"]): r for r in read_rows(out)}
    for (i, name), row in rows.items():
        w = getattr(end.model.layers[i].mlp, name).weight.double()
        w0 = getattr(start.model.layers[i].mlp, name).weight.double()
        d = (w - w0).T if name == "down_proj" else (w - w0)
        u = bases.basis(i, name.split("_")[0]).double()
        assert float(row["energy"]) == pytest.approx(d.pow(2).sum().item(), rel=1e-5)
        assert float(row["inside"]) == pytest.approx((u @ (u.T @ d)).pow(2).sum().item(), rel=1e-5)


@pytest.mark.parametrize("arm, extra", [("core", ()), ("core", ("--core-impl", "parametrized")), ("confined", ())])
def test_logging_does_not_change_training(world, tmp_path, arm, extra):
    off = distill(world, tmp_path / "off", arm, *extra)
    on = distill(world, tmp_path / "on", arm, "--update-energy-every", "1", *extra)
    assert not (off / UPDATE_ENERGY_FILE).exists() and len(read_rows(on)) == STEPS * 6
    a, b = load_file(str(off / "student.safetensors")), load_file(str(on / "student.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = [[json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (off, on)]
    assert losses[0] == losses[1]


def test_resume_keeps_exactly_the_uninterrupted_rows(world, tmp_path):
    """A kill after the last step's rows but before its checkpoint: the resumed file equals an uninterrupted one."""
    every = ("--update-energy-every", "2", "--checkpoint-every", "3", "--keep-checkpoints", "all")
    straight = distill(world, tmp_path / "straight", "core", *every)
    killed = distill(world, tmp_path / "killed", "core", *every)
    # Undo what happened after the step-6 checkpoint: the step-7 checkpoint, DONE and the output.
    ckpt_dir = tmp_path / "killed.ckpt"
    shutil.rmtree(ckpt.latest_checkpoint(ckpt_dir))
    (ckpt_dir / ckpt.DONE_FILE).unlink()
    shutil.rmtree(killed)
    with (ckpt_dir / UPDATE_ENERGY_FILE).open("a") as fh:
        fh.write("7,448,0,gate_pr")  # a row torn by the kill
    distill(world, killed, "core", *every)
    training = json.loads((killed / "settings.json").read_text())["training"]
    assert Path(training["resumed_from"]).name == ckpt.step_dir_name(6)
    assert (killed / UPDATE_ENERGY_FILE).read_text() == (straight / UPDATE_ENERGY_FILE).read_text()
    # Rerunning the finished run copies the same file again.
    shutil.rmtree(killed)
    distill(world, killed, "core", *every)
    assert (killed / UPDATE_ENERGY_FILE).read_text() == (straight / UPDATE_ENERGY_FILE).read_text()


def test_a_zero_step_run_writes_the_header_only(world, tmp_path):
    from lrc.commands.distill import main_distill

    out = tmp_path / "zero"
    assert main_distill(common(world, out, "--warmstart", str(world / "ws"), "--arm", "dense", "--tokens", "0",
                               "--update-energy-every", "5")) == 0
    assert (out / UPDATE_ENERGY_FILE).read_text() == ",".join(COLUMNS) + "\n"


def test_a_checkpoint_of_other_settings_is_refused(world, tmp_path):
    distill(world, tmp_path / "run", "dense", "--update-energy-every", "3")
    shutil.rmtree(tmp_path / "run")
    with pytest.raises(LRCError, match="update_energy.csv holds the rows of steps"):
        distill(world, tmp_path / "run", "dense", "--update-energy-every", "2")
    with pytest.raises(LRCError, match="--update-energy-every must be >= 0"):
        distill(world, tmp_path / "x", "dense", "--update-energy-every", "-1")


@pytest.mark.slow
def test_two_processes_write_the_one_process_rows_once(world, tmp_path):
    """Under DDP (2 CPU processes, gloo) rank 0 writes; the rows match one process to float rounding."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1",
                        "ACCELERATE_USE_CPU": "1"}
    args = ["distill", *common(world, tmp_path / "p2", "--warmstart", str(world / "ws"), "--arm", "core", "--tokens",
                               str(STEPS * 4 * 16), "--seed", "1", "--update-energy-every", "3")]
    launch = [sys.executable, "-m", "accelerate.commands.launch",
              "--config_file", str(repo / "config/accelerate/cpu2.yaml"), "--main_process_port", str(free_port()),
              "-m", "lrc.cli", *args]
    subprocess.run(launch, check=True, env=env, cwd=repo, timeout=300, capture_output=True)
    one, two = (read_rows(distill(world, tmp_path / "p1", "core", "--update-energy-every", "3")),
                read_rows(tmp_path / "p2"))
    assert json.loads((tmp_path / "p2" / "settings.json").read_text())["training"]["num_processes"] == 2
    assert [(r["step"], r["layer"], r["weight"]) for r in one] == [(r["step"], r["layer"], r["weight"]) for r in two]
    for a, b in zip(one, two):
        for column in ("energy", "inside", "share_inside"):
            assert float(a[column]) == pytest.approx(float(b[column]), rel=1e-3, abs=1e-9)
