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
import sys
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
    launch,
    losses,
)
from tests.launch import run as run_ok

def zero_flags(root: Path, out: Path, arm: str, steps: int, *extra: str) -> list[str]:
    return distill_flags(root, out, arm, steps, "--shard-optimizer", *extra, fsdp=False)


ZERO_ARMS = ["dense", "core"]


@pytest.mark.slow
@pytest.mark.parametrize("world", ["llama-tied"], indirect=True)
def test_sharded_states_two_processes_follow_one_process(world, tmp_path):
    """Both arms, sharded and plain DDP, in one `accelerate launch` (the processes start once)."""
    from lrc.commands.distill import main_distill

    run_ok(launch(str(Path(__file__).resolve()), str(world), str(tmp_path), config=DDP_CONFIG))
    for arm in ZERO_ARMS:
        p1, p2, ddp = (tmp_path / f"{arm}-{run}" for run in ("p1", "p2", "ddp"))
        assert main_distill(zero_flags(world, p1, arm, 8)) == 0
        a, b = load_file(str(ddp / "student.safetensors")), load_file(str(p2 / "student.safetensors"))
        assert all(torch.equal(a[n], b[n]) for n in a), f"{arm}: sharding the states changed the 2-process weights"
        assert losses(ddp) == losses(p2)
        s2 = json.loads((p2 / "settings.json").read_text())["training"]
        assert s2["num_processes"] == 2
        share = s2["optimizer_coordinates"]  # the main process's share of the states
        assert 0 < share["state_params_this_process"] < share["state_params"]
        rel, diff = compare(p1, p2)
        print(f"{arm}: sharded states, 2 processes vs 1: max relative loss difference {rel:.2e}, "
              f"max |weight difference| {diff:.2e}")
        assert rel < 1e-5 and diff < 1e-4
        # the checkpoint holds every parameter's state, as one process's would
        saved = torch.load(ckpt.latest_checkpoint(tmp_path / f"{arm}-p2.ckpt") / ckpt.OPTIMIZER_FILE,
                           weights_only=True)
        params = sum(len(g["params"]) for g in saved["param_groups"])
        assert sorted(saved["state"]) == list(range(params))


def two_process_runs(world: Path, out: Path) -> None:
    """Each arm's sharded run and its plain-DDP twin, one after another in this launch's processes."""
    from lrc.commands.distill import main_distill

    for arm in ZERO_ARMS:
        assert main_distill(zero_flags(world, out / f"{arm}-p2", arm, 8, "--checkpoint-every", "4",
                                       "--keep-checkpoints", "all")) == 0
        plain = [f for f in zero_flags(world, out / f"{arm}-ddp", arm, 8) if f != "--shard-optimizer"]
        assert main_distill(plain) == 0


@pytest.mark.slow
@pytest.mark.parametrize("world", ["llama-tied"], indirect=True)
def test_sharded_states_are_refused_under_fsdp(world, tmp_path):
    out = subprocess.run(launch("-m", "lrc.cli", "distill",
                                     *distill_flags(world, tmp_path / "f", "dense", 2, "--shard-optimizer")),
                         env=ENV, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode != 0 and "FSDP2 shards the optimiser states itself" in out.stderr


if __name__ == "__main__":  # under `accelerate launch`: test_sharded_states_two_processes_follow_one_process
    from lrc.cli import end_process_group

    torch.set_num_threads(1)
    two_process_runs(Path(sys.argv[1]), Path(sys.argv[2]))
    end_process_group()
