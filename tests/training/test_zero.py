"""`lrc distill --shard-optimizer` (ZeRO stage 1 under DDP) with 2 CPU processes (gloo).

Each process keeps AdamW's states for its share of the parameters only
(:class:`lrc.training.optim.CoordinateAdamW` with ``shard_states``). It changes nothing: its weights
and losses are bitwise those of plain DDP with 2 processes, and they follow 1 process (the
same micro-batches, the gradient reduced in another order) within test_multiprocess's
tolerance (1e-5 relative on every loss, 1e-4 on every weight; measured 8e-8 and 1e-7 dense,
9e-6 core). The checkpoint is the one-process optimiser state (process 0 collects it), and
a 2-process run killed mid-way and restarted ends bitwise equal to an uninterrupted one
(tests/training/test_resume.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lrc.training import checkpoint as ckpt
from tests.launch import (
    DDP_CONFIG,
    ENV,
    REPO,
    compare,
    distill_flags,
    losses,
)
from tests.launch import launch as fsdp_launch
from tests.launch import run as run_ok

def launch(*args: str) -> list[str]:
    return fsdp_launch(*args, config=DDP_CONFIG)


def zero_flags(root: Path, out: Path, arm: str, steps: int, *extra: str) -> list[str]:
    return distill_flags(root, out, arm, steps, "--shard-optimizer", *extra, fsdp=False)


@pytest.mark.slow
@pytest.mark.parametrize("world", ["llama-tied"], indirect=True)
@pytest.mark.parametrize("arm", ["dense", "core"])
def test_sharded_states_two_processes_follow_one_process(world, tmp_path, arm):
    from lrc.commands.distill import main_distill

    assert main_distill(zero_flags(world, tmp_path / "p1", arm, 8)) == 0
    run_ok(launch("-m", "lrc.cli", "distill",
                  *zero_flags(world, tmp_path / "p2", arm, 8, "--checkpoint-every", "4", "--keep-checkpoints", "all")))
    plain = [f for f in zero_flags(world, tmp_path / "ddp", arm, 8) if f != "--shard-optimizer"]
    run_ok(launch("-m", "lrc.cli", "distill", *plain))
    a, b = (load_file(str(tmp_path / "ddp" / "student.safetensors")),
            load_file(str(tmp_path / "p2" / "student.safetensors")))
    assert all(torch.equal(a[n], b[n]) for n in a), "sharding the states changed the 2-process weights"
    assert losses(tmp_path / "ddp") == losses(tmp_path / "p2")
    s2 = json.loads((tmp_path / "p2" / "settings.json").read_text())["training"]
    assert s2["num_processes"] == 2
    share = s2["optimizer_coordinates"]  # the main process's share of the states
    assert 0 < share["state_params_this_process"] < share["state_params"]
    rel, diff = compare(tmp_path / "p1", tmp_path / "p2")
    print(f"{arm}: sharded states, 2 processes vs 1: max relative loss difference {rel:.2e}, "
          f"max |weight difference| {diff:.2e}")
    assert rel < 1e-5 and diff < 1e-4
    # the checkpoint holds every parameter's state, as one process's would
    saved = torch.load(ckpt.latest_checkpoint(tmp_path / "p2.ckpt") / ckpt.OPTIMIZER_FILE, weights_only=True)
    params = sum(len(g["params"]) for g in saved["param_groups"])
    assert sorted(saved["state"]) == list(range(params))


@pytest.mark.slow
@pytest.mark.parametrize("world", ["llama-tied"], indirect=True)
def test_sharded_states_are_refused_under_fsdp(world, tmp_path):
    out = subprocess.run(fsdp_launch("-m", "lrc.cli", "distill",
                                     *distill_flags(world, tmp_path / "f", "dense", 2, "--shard-optimizer")),
                         env=ENV, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode != 0 and "FSDP2 shards the optimiser states itself" in out.stderr
