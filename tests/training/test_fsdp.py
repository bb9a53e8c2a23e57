"""FSDP2 runs of `lrc distill` with 2 CPU processes (gloo), against 1 process.

`accelerate launch --config_file config/accelerate/fsdp-cpu2.yaml` (accelerate's FSDP plugin,
fsdp_version 2; :mod:`lrc.training.sharding` turns it on for CPU processes). Both runs take the same
global batch (8 sequences) in the same micro-batches (2 sequences): 4 accumulation steps on
one process, 2 on each of two, so the step's gradient is the same mean reduced in another
order (FSDP2: reduce-scatter of the shards). Tolerance: 1e-5 relative on every logged loss
and 1e-5 absolute on every saved weight (measured: ~1e-7; a broken tie, a wrong shard or a
wrong loss scale moves them by 1e-3 or more). A run killed mid-way and restarted under FSDP
ends bitwise equal to an uninterrupted FSDP run (tests/training/test_resume.py).

Also run as a script under `accelerate launch`: ``python tests/training/test_fsdp.py placement OUT KIND`` (the placement
test) and ``... distill-arms WORLD OUT`` (every arm's 2-process run in the same two processes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lrc.names import ARMS
from lrc.training import checkpoint as ckpt
from tests.helpers import make_teacher
from tests.launch import (
    ATOL,
    REPO,
    RTOL,
    STEPS,
    compare,
    distill_flags,
    launch,
    losses,
    run,
)
from tests.training_runs import run_training


@pytest.mark.slow
def test_fsdp2_two_processes_follow_one_process(world, tmp_path):
    """Every arm, on both teacher kinds: one `accelerate launch` trains the arms in turn in the same
    two processes (as `lrc distill` each), so the processes start once per teacher, not per arm."""
    from lrc.commands.distill import main_distill

    run(launch(str(Path(__file__).resolve()), "distill-arms", str(world), str(tmp_path)))
    for arm in ARMS:
        one, two = tmp_path / f"{arm}-p1", tmp_path / f"{arm}-p2"
        assert main_distill(distill_flags(world, one, arm)) == 0
        s1 = json.loads((one / "settings.json").read_text())["training"]
        s2 = json.loads((two / "settings.json").read_text())["training"]
        assert (s1["num_processes"], s1["grad_accumulation"]) == (1, 4)
        assert (s2["num_processes"], s2["grad_accumulation"]) == (2, 2)
        assert losses(one)[-1] < losses(one)[0]  # it trained
        rel, diff = compare(one, two)
        print(f"{world.name} {arm}: FSDP2 2 processes vs 1: max relative loss difference {rel:.2e}, "
              f"max |weight difference| {diff:.2e}")
        assert rel < RTOL and diff < ATOL, arm
        step = ckpt.latest_checkpoint(tmp_path / f"{arm}-p2.ckpt")  # accelerate's sharded (DCP) model and optimiser
        assert ((step / "pytorch_model_fsdp_0" / ".metadata").is_file()
                and (step / "optimizer_0" / ".metadata").is_file())
        assert not (step / ckpt.TRAINABLE_FILE).exists()
        assert json.loads((two / "lrc.json").read_text())["arm"] == arm
    # the sharded directories are verified before a resume; damage is named
    step = ckpt.latest_checkpoint(tmp_path / "core-p2.ckpt")
    expect = {"trainable": None, "optimizer_params": None, "processes": 2, "sharded": True}
    ckpt.verify_checkpoint(step, **expect)
    shard = next((step / ckpt.SHARDED_OPTIMIZER_DIR).glob("*.distcp"))
    shard.unlink()
    with pytest.raises(ckpt.DamagedCheckpoint, match=shard.name):
        ckpt.verify_checkpoint(step, **expect)
    (step / ckpt.SHARDED_MODEL_DIR / ".metadata").write_bytes(b"garbage")
    with pytest.raises(ckpt.DamagedCheckpoint, match="metadata"):
        ckpt.verify_checkpoint(step, **expect)


def distill_arms(world: Path, out: Path) -> None:
    """Each arm's 2-process run, one after another in this launch's processes."""
    from lrc.commands.distill import main_distill

    for arm in ARMS:
        assert main_distill(distill_flags(world, out / f"{arm}-p2", arm, STEPS, "--checkpoint-every", "4")) == 0


@pytest.mark.slow
def test_fsdp2_shards_the_student_parameters_and_replicates_teacher_and_buffers(world, tmp_path):
    """Trainable parameters: DTensors sharded on dim 0 across the 2 ranks. Student buffers (core's
    complement reflectors; the teacher weights the parametrisations read are the objective
    teacher's own) and the objective's teacher: full plain tensors on each rank. A tied student's
    embedding and head share one sharded factor, and after training the student is a plain model
    again (full tensors, tie kept)."""
    kind = world.name.rstrip("0123456789")
    run(launch(str(Path(__file__).resolve()), "placement", str(tmp_path), kind))
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"placement-{rank}.json").read_text())
        assert seen["distributed_type"] == "FSDP" and seen["num_processes"] == 2
        # bf16 mixed precision: FSDP2 keeps fp32 parameters and reductions, autocast computes in bf16
        assert seen["mixed"] == "bf16" and seen["param_dtype"] == seen["reduce_dtype"] == "None"
        assert seen["params"] and all(p["dtensor"] and p["placements"] == ["S(0)"] for p in seen["params"].values())
        assert all(p["local_rows"] == -(-p["shape"][0] // 2) - (rank * (p["shape"][0] % 2))
                   for p in seen["params"].values())
        assert any("reflectors" in n for n in seen["buffers"])
        assert all(not b["dtensor"] for b in seen["buffers"].values())
        assert all(not t["dtensor"] and t["full"] for t in seen["teacher"].values())
        assert seen["after"]["dtensors"] == 0 and seen["after"]["plain_class"]
        assert seen["tied"] == seen["after"]["tied"] == kind.endswith("-tied")
        if "qwen2" in kind:  # frozen parameters (q/k/v biases) are parameters too: sharded
            assert any(n.endswith("bias") and not p["requires_grad"] for n, p in seen["params"].items())


@pytest.mark.slow
def test_fsdp2_plain_lm_follows_one_process(tmp_path):
    """A plain Llama on the LM objective, as `lrc pretrain`/`lrc sft` train it (no LRC
    parametrisation: accelerate's own wrapping), equal to 1 process."""
    run_training(tmp_path / "p1", "lm")
    run([*launch(str(REPO / "tests" / "training" / "test_multiprocess.py"), str(tmp_path / "p2"), "lm")])
    curve = lambda o: [json.loads(x)["loss"]  # noqa: E731
                       for x in Path(json.loads((o / "summary.json").read_text())["metrics"]).read_text().splitlines()]
    c1, c2 = curve(tmp_path / "p1"), curve(tmp_path / "p2")
    assert len(c1) == len(c2) > 0 and c1[-1] < c1[0]
    rel = max(abs(a - b) / abs(a) for a, b in zip(c1, c2))
    w1, w2 = (load_file(str(tmp_path / "p1" / "weights.safetensors")),
              load_file(str(tmp_path / "p2" / "weights.safetensors")))
    diff = max(float((w1[n] - w2[n]).abs().max()) for n in w1)
    print(f"plain LM: FSDP2 2 processes vs 1: max relative loss difference {rel:.2e}, "
          f"max |weight difference| {diff:.2e}")
    assert set(w1) == set(w2) and rel < RTOL and diff < ATOL


def placement(out: Path, kind: str) -> None:
    from torch.distributed.tensor import DTensor

    from lrc.method.clone import CloneObjective, RecipeArgs
    from lrc.method.reach import apply_arm
    from lrc.method.student import build_student
    from lrc.training import sharding
    from lrc.training.loop import TrainArgs, setup
    from tests.helpers import RandomTokens

    teacher = make_teacher(kind)
    student = build_student(teacher, 16, seed=0)
    apply_arm(student, teacher, "core", core_impl="parametrized")
    objective = CloneObjective(teacher, student, RecipeArgs(temperature=2.0))
    r = setup(objective, student, RandomTokens(rows=16),
              TrainArgs(tokens=0, batch_size=4, micro_batch_size=2, precision="bf16"), out / "ckpt")
    desc = lambda t: {"dtensor": isinstance(t, DTensor), "shape": list(t.shape),  # noqa: E731
                      "requires_grad": t.requires_grad,
                      "placements": [str(x) for x in t.placements] if isinstance(t, DTensor) else None,
                      "local_rows": int(t.to_local().shape[0]) if isinstance(t, DTensor) else None}
    tied_of = lambda m: ({id(p) for p in m.get_input_embeddings().parameters()}  # noqa: E731
                         == {id(p) for p in m.lm_head.parameters()})
    policy = r.accelerator.state.fsdp_plugin.mixed_precision_policy
    seen = {"distributed_type": r.accelerator.distributed_type.name, "num_processes": r.accelerator.num_processes,
            "tied": tied_of(r.wrapped), "mixed": r.mixed, "param_dtype": str(policy.param_dtype),
            "reduce_dtype": str(policy.reduce_dtype), "params": {n: desc(p) for n, p in r.wrapped.named_parameters()},
            "buffers": {n: desc(b) for n, b in r.wrapped.named_buffers()},
            "teacher": {n: desc(p)
                        | {"full": tuple(p.shape) == tuple(dict(make_teacher(kind).named_parameters())[n].shape)}
                        for n, p in objective.teacher.named_parameters()}}
    sharding.unshard(r.wrapped)
    seen["after"] = {"dtensors": sum(isinstance(p, DTensor) for p in student.parameters()), "tied": tied_of(student),
                     "plain_class": type(student).__name__ == type(teacher).__name__}
    (out / f"placement-{r.accelerator.process_index}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    from lrc.cli import end_process_group

    torch.set_num_threads(1)
    if sys.argv[1] == "placement":
        placement(Path(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "distill-arms":
        distill_arms(Path(sys.argv[2]), Path(sys.argv[3]))
    # As `lrc` does, once the run's objects are gone: ended inside placement(), the group lived on in
    # its DTensors' device mesh until the interpreter's exit, where gloo aborted the process (CI, once).
    end_process_group()
