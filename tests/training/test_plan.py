"""`lrc plan`: the traced peak against a measured one, the micro-batch search, bad options."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lrc.commands.plan import (
    GIB,
    PlanArgs,
    Planner,
    Setting,
    main,
    per_gpu,
    plan,
    resolve,
)
from lrc.errors import LRCError
from lrc.io.hf import load_model_config
from lrc.training.memory import StepSpec, trace_step

ROOT = Path(__file__).resolve().parents[2]

# Llama-shaped, tied, a vocabulary large enough that the loss's [B, L, V] tensors weigh as
# they do at paper scale; small enough for a step in seconds on one thread.
SMALL = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 32000,
         "tie_word_embeddings": True, "rms_norm_eps": 1e-5, "max_position_embeddings": 1024}


@pytest.fixture()
def small_config(tmp_path: Path) -> Path:
    path = tmp_path / "small.json"
    path.write_text(json.dumps(SMALL))
    return path


def _measured(spec_values: dict, tmp_path: Path) -> int:
    """The peak RSS of the same steps on real tensors, in a fresh process."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec_values))
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "lrc.training.memory", str(spec_file)], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak"]


@pytest.mark.slow
@pytest.mark.parametrize("arm,checkpointed,micro_batches",
                         [("slice", False, 1), ("dense", False, 1), ("slice", True, 1), ("dense", False, 3)])
def test_traced_peak_matches_the_measured_peak_of_a_real_step(arm, checkpointed, micro_batches, small_config, tmp_path):
    values = {"student_hidden": 128, "arm": arm, "micro_batch_size": 2, "seq_len": 512, "precision": "fp32",
              "activation_checkpointing": checkpointed, "micro_batches": micro_batches}
    predicted = trace_step(StepSpec(teacher_config=load_model_config(small_config), **values))
    measured = _measured(values | {"teacher_config": str(small_config)}, tmp_path)
    # The measure is the whole process's resident memory (allocator slack, autograd's
    # bookkeeping included); the trace counts tensors only. At this small size that non-tensor
    # part (~170 MB, not growing with the model) is 10-16 % of the measured peak (0.91 before the
    # fused loss shrank the traced tensors, 0.84-0.86 after), so the trace must lie between 80 %
    # of the measure and 15 % above it; the 15 % target itself is checked at Llama-3.2-3B width
    # (docs/planner.md: 0.978-0.990).
    assert 0.80 * measured <= predicted["peak"] <= 1.15 * measured, (predicted, measured)
    assert sum(predicted["parts"].values()) == predicted["peak"]
    assert predicted["parts"]["loss_workspace"] > 0 and predicted["parts"]["optimizer"] > 0


@pytest.mark.slow
def test_accumulated_micro_batches_hold_the_gradients_through_the_next_forward(small_config):
    """From the second micro-batch of a step on, every fp32 gradient is alive while the next
    forward runs: with accumulation the peak is one step's plus the gradients (dense, whose
    gradients are dead at a one-micro-batch step's peak)."""
    spec = dict(teacher_config=load_model_config(small_config), student_hidden=128, arm="dense", micro_batch_size=2,
                seq_len=256)
    one, three = trace_step(StepSpec(**spec)), trace_step(StepSpec(**spec, micro_batches=3))
    assert one["parts"]["gradients"] == 0 and three["parts"]["gradients"] == three["parts"]["student_weights"] > 0
    assert three["peak"] - one["peak"] == pytest.approx(three["parts"]["gradients"], abs=4096)  # (and a few scalars)


def _planner(config: Path, memory_gib: float) -> Planner:
    args = PlanArgs(teacher_config=config, student_hidden=128, micro_batch_size=2, seq_len=256, precision="fp32",
                    memory_gib=memory_gib)
    return Planner(args, resolve(args), "slice")


@pytest.mark.slow
def test_the_search_finds_the_largest_micro_batch_that_fits(small_config):
    peaks = [_planner(small_config, 1.0).at(m)["peak"] for m in (1, 2, 3, 4, 5, 6)]
    assert all(b > a for a, b in zip(peaks, peaks[1:])), peaks
    between = (peaks[3] + peaks[4]) / 2 / GIB  # above micro-batch 4's peak, below 5's
    planner = _planner(small_config, between)
    assert planner.fits(4) and not planner.fits(5)
    assert planner.largest_fitting() == 4
    assert _planner(small_config, peaks[0] / GIB * 0.9).largest_fitting() == 0


def test_fsdp_shards_the_trainable_state_and_keeps_the_teacher():
    trace = {"parts": {"student_weights": 800, "teacher": 1000, "gradients": 800, "optimizer": 1600, "activations": 50,
                       "loss_workspace": 70, "backward_temp": 0, "other": 0}, "largest_group_bytes": 10}
    setting = Setting(teacher_config=Path("t.json"), student_hidden=1, micro_batch_size=1, seq_len=1, precision="bf16",
                      gpus=8, sharding="fsdp")
    out = per_gpu(trace, setting)
    assert (out["parts"]["student_weights"] == 100 + 10 and out["parts"]["gradients"] == 100 + 10
            and out["parts"]["optimizer"] == 200)
    assert out["parts"]["teacher"] == 1000 and out["peak"] == sum(out["parts"].values())
    ddp = per_gpu(trace, Setting(**{**setting.__dict__, "sharding": "ddp"}))
    assert ddp["parts"] == trace["parts"]
    # at the end of the loss the one-process trace has no gradient alive; DDP's buckets hold them all
    before_backward = {"parts": {**trace["parts"], "gradients": 0}}
    assert per_gpu(before_backward, Setting(**{**setting.__dict__, "sharding": "ddp"}))["parts"]["gradients"] == 800
    assert per_gpu(before_backward,
                   Setting(**{**setting.__dict__, "sharding": "ddp", "gpus": 1}))["parts"]["gradients"] == 0


@pytest.mark.parametrize("arm", ["dense", "core"])
def test_sharded_optimizer_states_are_rank_zeros_share(arm, small_config):
    """--shard-optimizer traces process 0 of 4 holding its quarter of the states (the
    weights whole); the parameters are divided by size, so about a quarter of the bytes."""
    values = {"teacher_config": load_model_config(small_config), "student_hidden": 128, "arm": arm,
              "micro_batch_size": 1, "seq_len": 64, "precision": "fp32", "processes": 4}
    whole, share = trace_step(StepSpec(**values)), trace_step(StepSpec(**values, shard_optimizer=True))
    assert share["parts"]["student_weights"] == whole["parts"]["student_weights"]
    ratio = share["parts"]["optimizer"] / whole["parts"]["optimizer"]
    assert 0.2 < ratio < 0.35, ratio
    with pytest.raises(LRCError, match="--shard-optimizer"):
        resolve(PlanArgs(teacher_config=small_config, student_hidden=128, micro_batch_size=1, seq_len=64,
                         sharding="fsdp", shard_optimizer=True))


def test_a_paper_config_gives_its_distill_settings(tmp_path):
    config = yaml.safe_load((ROOT / "config/paper/llama3.2-3b.yaml").read_text())
    exp = config["experiments"]["llama3.2-3b"]
    # the distill section's micro-batch, not the warm start's: made to differ here
    exp["distill"]["train"]["micro_batch_size"] = exp["warmstart"]["micro_batch_size"] + 2
    path = tmp_path / "llama3.2-3b.yaml"
    path.write_text(yaml.safe_dump(config))
    setting = resolve(PlanArgs(workflow_config=path))
    assert (setting.student_hidden, setting.micro_batch_size, setting.seq_len, setting.precision, setting.gpus,
            setting.sharding) == (1536, exp["distill"]["train"]["micro_batch_size"], 2048, "bf16", 8, "ddp")
    assert setting.teacher_config == Path("config/teachers/llama3.2-3b.json")
    assert setting.activation_checkpointing == exp["distill"]["train"].get("activation_checkpointing", False)
    assert resolve(PlanArgs(workflow_config=path, activation_checkpointing=True)).activation_checkpointing is True
    assert setting.shard_optimizer is exp["distill"]["train"].get("shard_optimizer", False)
    # its arms, its budgets: one run's largest, every arm's over its seeds and recipes, the warm start's
    assert setting.arms == tuple(exp["distill"]["arms"])
    assert resolve(PlanArgs(workflow_config=path, arms=["dense"])).arms == ("dense",)
    runs = len(exp["distill"]["seeds"]) * len(exp["distill"]["recipes"])
    assert (setting.tokens, setting.arm_tokens, setting.warmstart_tokens) == (
        max(exp["distill"]["tokens"]), sum(exp["distill"]["tokens"]) * runs, exp["warmstart"]["tokens"])


def test_the_accumulation_follows_the_configs_batch_at_the_plans_micro_batch_and_gpus():
    config = ROOT / "config/paper/llama3.2-3b.yaml"  # distill: 24 sequences per step, micro-batch 3, 8 GPUs
    assert resolve(PlanArgs(workflow_config=config)).micro_batches == 1
    assert resolve(PlanArgs(workflow_config=config, gpus=1)).micro_batches == 8
    assert resolve(PlanArgs(workflow_config=config, micro_batch_size=1, gpus=2)).micro_batches == 12
    assert resolve(PlanArgs(workflow_config=config, micro_batches=2)).micro_batches == 2


def test_the_weights_are_planned_built_once_per_step_where_distill_builds_them_so():
    config = ROOT / "config/paper/llama3.2-3b.yaml"
    # auto: once per step with accumulation (8 micro-batches on one GPU), per micro-batch without (8 GPUs)
    assert not resolve(PlanArgs(workflow_config=config)).build_once
    assert resolve(PlanArgs(workflow_config=config, gpus=1)).build_once
    assert not resolve(PlanArgs(workflow_config=config, gpus=1, weight_build="micro_batch")).build_once
    assert resolve(PlanArgs(workflow_config=config, gpus=1, weight_build="step")).build_once
    assert resolve(PlanArgs(workflow_config=config, weight_build="step")).build_once
    with pytest.raises(LRCError, match="--weight-build step"):
        resolve(PlanArgs(workflow_config=config, sharding="fsdp", shard_optimizer=False, weight_build="step"))


def test_the_command_prints_a_table_and_writes_json(small_config, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["--teacher-config", str(small_config), "--student-hidden", "128", "--micro-batch-size", "1",
                 "--seq-len", "128", "--arms", "slice", "--no-search", "--out", str(out)]) == 0
    assert "| slice | 1 |" in capsys.readouterr().out
    assert json.loads(out.read_text())["rows"][0]["arm"] == "slice"


@pytest.mark.parametrize("argv, option", [
    (["--arms", "wide"], "--arms"),
    (["--memory-gib", "0"], "--memory-gib"),
    (["--student-hidden", "0"], "--student-hidden"),
    (["--teacher-config", "/nonexistent/teacher.json"], "--teacher-config"),
])
def test_bad_options_are_errors_naming_the_option(argv, option, small_config):
    base = {"--teacher-config": str(small_config), "--student-hidden": "64", "--micro-batch-size": "1",
            "--seq-len": "64"}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value
    with pytest.raises(LRCError, match=option):
        main([x for kv in base.items() for x in kv] + ["--no-search"])


def test_missing_settings_and_bad_experiments_are_named(tmp_path):
    with pytest.raises(LRCError, match="--student-hidden"):
        plan(PlanArgs(teacher_config=tmp_path / "t.json", micro_batch_size=1, seq_len=8))
    with pytest.raises(LRCError, match="--experiment 'nope'"):
        resolve(PlanArgs(workflow_config=ROOT / "config/paper/llama3.2-3b.yaml", experiment="nope"))


def test_a_local_teachers_own_config_is_read(small_config, tmp_path, monkeypatch):
    """A config whose teacher is a local directory needs no --teacher-config: its config.json is read
    where it lies (a path relative to the working directory, as the workflow takes it)."""
    teacher = tmp_path / "teachers" / "mine"
    teacher.mkdir(parents=True)
    (teacher / "config.json").write_text(Path(small_config).read_text())
    config = {"experiments": {"mine": {"teacher": {"source": "local", "local": {"path": "teachers/mine"}},
                                       "student": {"hidden_size": 64},
                                       "data": {"corpus": {"seq_len": 32}},
                                       "distill": {"train": {"micro_batch_size": 1, "batch_size": 2}}}}}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    setting = resolve(PlanArgs(workflow_config=Path("mine.yaml")))
    assert setting.teacher_config == Path("teachers/mine/config.json") and setting.micro_batches == 2
