"""2 CPU processes (gloo, `accelerate launch`) follow the same loss curve as 1 process.

Both runs use the same global batch (8 sequences per step) and the same micro-batches (2
sequences each): 4 accumulation steps on one process, 2 on each of two. The step's
gradient is then the same mean over the same micro-batches, reduced in a different order,
so the curves agree to float32 rounding amplified by a few Adam steps. Tolerance: 1e-4
relative on every logged loss and 1e-4 absolute on every final weight (measured: about 1e-7 on
the losses, 1e-7 on the plain model's weights and on the LRC student's, 1.5e-5 when the two processes
build its weights in halves, lrc.training.weight_build; in float64 those agree to 2e-13; a wrong
sharding or loss scaling moves them by 1e-2 or more).

Run as a script (what the test launches): ``python tests/training/test_multiprocess.py OUT``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import free_port
from tests.training_runs import STEPS, run_training

REPO = Path(__file__).resolve().parents[2]


def _curve(out: Path) -> list[float]:
    metrics = Path(json.loads((out / "summary.json").read_text())["metrics"])
    return [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lm", "clone", "clone-divided"])
def test_two_processes_follow_one_process(tmp_path, kind):
    from safetensors.torch import load_file

    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
                        "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1"}
    script = str(Path(__file__).resolve())
    subprocess.run([sys.executable, script, str(tmp_path / "p1"), kind], check=True, env=env, cwd=REPO, timeout=300)
    launch = [sys.executable, "-m", "accelerate.commands.launch",
              "--config_file", str(REPO / "config/accelerate/cpu2.yaml"), "--main_process_port", str(free_port()),
              script,
              str(tmp_path / "p2"), kind]
    subprocess.run(launch, check=True, env=env, cwd=REPO, timeout=300)

    s1 = json.loads((tmp_path / "p1" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "p2" / "summary.json").read_text())
    assert (s1["num_processes"], s1["grad_accumulation"]) == (1, 4)
    assert (s2["num_processes"], s2["grad_accumulation"]) == (2, 2)
    # The LRC student's weights are built once per step, its gradients averaged after the step's backward
    # (lrc.training.weight_build); the plain model's by DDP's own hooks in its last micro-batch.
    clone = kind.startswith("clone")
    assert s1["weight_build"] == s2["weight_build"] == ("step" if clone else "micro_batch")
    if clone:  # ... whole on each process, or each of the two building half of every weight's rows
        assert s1["weight_rows_share"] == 1.0
        assert s2["weight_rows_share"] == (pytest.approx(0.5, abs=0.01) if kind == "clone-divided" else 1.0)
    if clone:  # core's basis changes, in the optimiser step, divided between the processes
        assert s1["optimizer_coordinates"] == {"maps": 6, "this_process": 6, "processes": 1}
        assert s2["optimizer_coordinates"] == {"maps": 6, "this_process": 3, "processes": 2}
    c1, c2 = _curve(tmp_path / "p1"), _curve(tmp_path / "p2")
    assert len(c1) == len(c2) == STEPS
    assert c1[-1] < c1[0]  # it trained
    rel = max(abs(a - b) / abs(a) for a, b in zip(c1, c2))
    print(f"max relative loss difference 1 vs 2 processes: {rel:.2e}")
    assert rel < 1e-4
    w1, w2 = (load_file(str(tmp_path / "p1" / "weights.safetensors")),
              load_file(str(tmp_path / "p2" / "weights.safetensors")))
    diff = max(float((w1[n] - w2[n]).abs().max()) for n in w1)
    print(f"max |weight difference| 1 vs 2 processes: {diff:.2e}")
    assert diff < 1e-4


def test_a_finished_command_ends_its_process_group(tmp_path):
    """`lrc` destroys the process group once a command has succeeded (left to the interpreter's
    exit, gloo's threads aborted a finished 2-process run with SIGABRT in CI), and leaves it to
    a failed command, whose peers may still wait inside a collective."""
    import torch.distributed as dist

    from lrc.cli import main as lrc_main

    audit = ["audit", str(REPO / "config" / "teachers" / "llama3.2-3b.json"), "--student-hidden"]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert lrc_main(audit + ["3072"]) == 2 and dist.is_initialized()  # refused: r must be below H
        assert lrc_main(audit + ["1536"]) == 0 and not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_ddp_gradients_are_bucket_views_and_buffers_not_broadcast():
    from lrc.training.loop import TrainArgs, _accelerator

    accelerator, _ = _accelerator(TrainArgs())
    assert accelerator.ddp_handler.gradient_as_bucket_view is True
    assert accelerator.ddp_handler.broadcast_buffers is False


@pytest.mark.parametrize("name", ["cpu2", "ddp", "fsdp", "fsdp-cpu2"])
def test_shipped_accelerate_configs_parse(name):
    """Every shipped config loads with accelerate's own loader and says what its comments say.

    (FSDP runs here on CPU processes: tests/training/test_fsdp.py, with fsdp-cpu2.yaml.)
    """
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(REPO / "config" / "accelerate" / f"{name}.yaml"))
    assert cfg.distributed_type.value == {"cpu2": "MULTI_GPU", "ddp": "MULTI_GPU", "fsdp": "FSDP",
                                          "fsdp-cpu2": "FSDP"}[name]
    assert cfg.mixed_precision == ("no" if name in ("cpu2", "fsdp-cpu2") else "bf16")
    if name.startswith("fsdp"):
        assert int(cfg.fsdp_config["fsdp_version"]) == 2
        assert cfg.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        # No class list: accelerate refuses a listed class the model lacks ("LlamaDecoderLayer,
        # Qwen2DecoderLayer" failed on every model); it wraps the model's _no_split_modules.
        assert "fsdp_transformer_layer_cls_to_wrap" not in cfg.fsdp_config


def test_fsdp_wraps_the_decoder_layers_of_both_architectures():
    """With no class list the plugin wraps each model's own decoder layer class; the list the
    config used to ship is refused for a Llama (it names Qwen2DecoderLayer)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from tests.helpers import make_teacher

    for kind, layer in (("llama-tied", "LlamaDecoderLayer"), ("qwen2-untied", "Qwen2DecoderLayer")):
        model = make_teacher(kind)
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
        plugin.set_auto_wrap_policy(model)
        assert plugin.auto_wrap_policy.func is transformer_auto_wrap_policy
        assert {c.__name__ for c in plugin.auto_wrap_policy.keywords["transformer_layer_cls"]} == {layer}
    old = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                         transformer_cls_names_to_wrap=["LlamaDecoderLayer", "Qwen2DecoderLayer"])
    with pytest.raises(ValueError, match="Qwen2DecoderLayer"):
        old.set_auto_wrap_policy(make_teacher("llama-tied"))


if __name__ == "__main__":
    from lrc.cli import (
        end_process_group,  # a launched script ends its process group as `lrc` does
    )

    torch.set_num_threads(1)
    run_training(Path(sys.argv[1]), sys.argv[2])
    end_process_group()
