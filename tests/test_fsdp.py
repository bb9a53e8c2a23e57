"""FSDP2 runs of `lrc distill` with 2 CPU processes (gloo), against 1 process.

`accelerate launch --config_file config/accelerate/fsdp-cpu2.yaml` (accelerate's FSDP plugin,
fsdp_version 2; :mod:`lrc.training.sharding` turns it on for CPU processes). Both runs take the same
global batch (8 sequences) in the same micro-batches (2 sequences): 4 accumulation steps on
one process, 2 on each of two, so the step's gradient is the same mean reduced in another
order (FSDP2: reduce-scatter of the shards). Tolerance: 1e-5 relative on every logged loss
and 1e-5 absolute on every saved weight (measured: ~1e-7; a broken tie, a wrong shard or a
wrong loss scale moves them by 1e-3 or more). A run killed mid-way and restarted under FSDP
ends bitwise equal to an uninterrupted FSDP run.

Also run as a script by the placement test: ``python tests/test_fsdp.py placement OUT KIND``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lrc.method.reach import COORDINATE_ARMS
from lrc.names import ARMS
from lrc.training import checkpoint as ckpt
from tests.helpers import make_teacher, make_tokenizer, write_corpus

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config" / "accelerate" / "fsdp-cpu2.yaml"
ENV = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1",
                    "TOKENIZERS_PARALLELISM": "false",
                    "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
STEPS, BATCH, MICRO, SEQ = 8, 8, 2, 16
RTOL = ATOL = 1e-5
_port = iter(range(29610, 29700))


def make_world(root: Path, kind: str) -> Path:
    """A saved teacher, a corpus and a trained warm start (4 steps) in ``root``: the ``world`` fixture
    (tests/conftest.py) of this module, test_zero and test_teacher_recompute."""
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
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG),
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


@pytest.mark.parametrize("arm", ARMS)
def test_fsdp2_two_processes_follow_one_process(world, tmp_path, arm):
    from lrc.commands.distill import main_distill

    assert main_distill(distill_flags(world, tmp_path / "p1", arm)) == 0
    run(launch("-m", "lrc.cli", "distill",
               *distill_flags(world, tmp_path / "p2", arm, STEPS, "--checkpoint-every", "4")))
    s1 = json.loads((tmp_path / "p1" / "settings.json").read_text())["training"]
    s2 = json.loads((tmp_path / "p2" / "settings.json").read_text())["training"]
    assert (s1["num_processes"], s1["grad_accumulation"]) == (1, 4)
    assert (s2["num_processes"], s2["grad_accumulation"]) == (2, 2)
    assert losses(tmp_path / "p1")[-1] < losses(tmp_path / "p1")[0]  # it trained
    rel, diff = compare(tmp_path / "p1", tmp_path / "p2")
    print(f"{world.name} {arm}: FSDP2 2 processes vs 1: max relative loss difference {rel:.2e}, "
          f"max |weight difference| {diff:.2e}")
    assert rel < RTOL and diff < ATOL
    step = ckpt.latest_checkpoint(tmp_path / "p2.ckpt")  # accelerate's sharded (DCP) model and optimiser
    assert (step / "pytorch_model_fsdp_0" / ".metadata").is_file() and (step / "optimizer_0" / ".metadata").is_file()
    assert not (step / ckpt.TRAINABLE_FILE).exists()
    if arm == "core":  # the sharded directories are verified before a resume; damage is named
        expect = {"trainable": None, "optimizer_params": None, "processes": 2, "sharded": True}
        ckpt.verify_checkpoint(step, **expect)
        shard = next((step / ckpt.SHARDED_OPTIMIZER_DIR).glob("*.distcp"))
        shard.unlink()
        with pytest.raises(ckpt.DamagedCheckpoint, match=shard.name):
            ckpt.verify_checkpoint(step, **expect)
        (step / ckpt.SHARDED_MODEL_DIR / ".metadata").write_bytes(b"garbage")
        with pytest.raises(ckpt.DamagedCheckpoint, match="metadata"):
            ckpt.verify_checkpoint(step, **expect)
    assert json.loads((tmp_path / "p2" / "lrc.json").read_text())["arm"] == arm


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


# Once, on the tied Llama: the sharded tie is the delicate part.
@pytest.mark.parametrize("world", ["llama-tied"], indirect=True)
def test_fsdp2_killed_and_restarted_equals_uninterrupted(world, tmp_path):
    steps = 40
    cmd = lambda out: launch("-m", "lrc.cli", "distill",  # noqa: E731
                             *distill_flags(world, out, "core", steps, "--checkpoint-every", "5", "--log-every", "5"))
    a = killed_and_restarted_equals_uninterrupted(cmd, tmp_path)
    (tmp_path / "killed").rename(tmp_path / "killed.first")
    run(cmd(tmp_path / "killed"))  # the finished checkpoint directory: nothing retrained, same weights
    assert json.loads((tmp_path / "killed" / "settings.json").read_text())["training"]["already_done"] is True
    c = load_file(str(tmp_path / "killed" / "student.safetensors"))
    assert all(torch.equal(a[n], c[n]) for n in a)


def test_fsdp2_shards_the_student_parameters_and_replicates_teacher_and_buffers(world, tmp_path):
    """Trainable parameters: DTensors sharded on dim 0 across the 2 ranks. Student buffers (core's
    bases and reflectors; the teacher weights the parametrisations read are the objective
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
        assert any("basis" in n for n in seen["buffers"]) and all(not b["dtensor"] for b in seen["buffers"].values())
        assert all(not t["dtensor"] and t["full"] for t in seen["teacher"].values())
        assert seen["after"]["dtensors"] == 0 and seen["after"]["plain_class"]
        assert seen["tied"] == seen["after"]["tied"] == kind.endswith("-tied")
        if "qwen2" in kind:  # frozen parameters (q/k/v biases) are parameters too: sharded
            assert any(n.endswith("bias") and not p["requires_grad"] for n, p in seen["params"].items())


def test_fsdp2_plain_lm_follows_one_process(tmp_path):
    """A plain Llama on the LM objective, as `lrc pretrain`/`lrc sft` train it (no LRC
    parametrisation: accelerate's own wrapping), equal to 1 process."""
    from tests.test_multiprocess import run_training

    run_training(tmp_path / "p1", "lm")
    run([*launch(str(REPO / "tests" / "test_multiprocess.py"), str(tmp_path / "p2"), "lm")])
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
    r.accelerator.end_training()  # destroys the process group: gloo left to the exit can abort


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "placement":
        placement(Path(sys.argv[2]), sys.argv[3])
