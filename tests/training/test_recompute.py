"""Activation checkpointing (`lrc.training.recompute`, ``--activation-checkpointing``): the same loss,
gradients and trajectory as without it, the layers really rerun in backward, the parametrised
weights built once per micro-batch, less kept alive, resume and 2 processes unchanged.

Run as a script (what the 2-process test launches): ``python tests/training/test_recompute.py OUT``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.utils import parametrize

from lrc.errors import LRCError
from lrc.io.hf import trainable_parameters
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.method.objectives import LMObjective
from lrc.method.reach import apply_arm
from lrc.method.student import build_student
from lrc.training import recompute
from lrc.training.loop import TrainArgs, train
from lrc.training.memory import StepSpec, trace_step
from tests.helpers import SEQ, RandomTokens, free_port, make_teacher, tiny_llama
from tests.recompute_helpers import ARM_IMPLS, fit, masked_batch, perturbed_student
from tests.workflow_helpers import default_config, rule_shells

REPO = Path(__file__).resolve().parents[2]


class _Counts:
    """Parametrisation evaluations and decoder-layer bodies run (the recompute reruns the body,
    not the layer's ``__call__``: its input norm counts both)."""

    def __init__(self, student):
        self.weights = self.bodies = 0
        self.handles = [student.model.layers[i].input_layernorm.register_forward_hook(self._body)
                        for i in range(len(student.model.layers))]
        for m in student.modules():
            if parametrize.is_parametrized(m):
                self.handles += [plist.register_forward_hook(self._weight) for plist in m.parametrizations.values()]

    def _body(self, *_):
        self.bodies += 1

    def _weight(self, *_):
        self.weights += 1

    def remove(self):
        for h in self.handles:
            h.remove()


def _loss_and_grads(student, objective, checkpointed, keep_weights=True):
    (recompute.enable if checkpointed else recompute.disable)(student)
    student.zero_grad(set_to_none=True)
    counts = _Counts(student)
    with recompute.micro_batch(student, keep_weights=keep_weights):
        total, terms = objective.loss(masked_batch(), model=student)
        total.backward()
    counts.remove()
    grads = {n: p.grad.clone() for n, p in trainable_parameters(student)}
    return total.detach(), terms, grads, counts


@pytest.mark.parametrize("recipe", ["lrc", "kl"])
@pytest.mark.parametrize("arm,core_impl", ARM_IMPLS)
def test_checkpointed_loss_and_gradients_equal_the_plain_ones(arm, core_impl, recipe):
    teacher, student = perturbed_student("llama-tied" if recipe == "lrc" else "qwen2-untied", arm, core_impl)
    objective = CloneObjective(teacher, student, RecipeArgs(recipe=recipe, temperature=2.0))
    plain, plain_terms, plain_grads, plain_counts = _loss_and_grads(student, objective, False)
    ckpt, ckpt_terms, ckpt_grads, counts = _loss_and_grads(student, objective, True)
    torch.testing.assert_close(ckpt, plain, rtol=0, atol=1e-6)
    for name in plain_terms:  # each term once: not added again by the recompute
        torch.testing.assert_close(ckpt_terms[name], plain_terms[name], rtol=0, atol=1e-6)
    assert plain_grads.keys() == ckpt_grads.keys() and all(g.abs().sum() > 0 for g in plain_grads.values())
    for name, g in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], g, rtol=1e-6, atol=1e-6, msg=name)
    n_layers = len(student.model.layers)
    assert (plain_counts.bodies, counts.bodies) == (n_layers, 2 * n_layers)  # the recompute ran
    assert counts.weights == plain_counts.weights  # and built no weight again
    if plain_counts.weights > 2:  # parametrised layer weights: without keeping them, the recompute rebuilds each
        *_, rebuilt = _loss_and_grads(student, objective, True, keep_weights=False)
        assert rebuilt.weights > plain_counts.weights
    recompute.disable(student)
    assert not recompute.is_enabled(student) and not student.is_activation_checkpointing


def test_under_bf16_autocast_too():
    """The recompute runs under the forward's autocast state, and the weights it reuses were built under it."""
    teacher, student = perturbed_student("llama-tied", "core", "parametrized")
    objective = CloneObjective(teacher, student, RecipeArgs(temperature=2.0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain, _, plain_grads, _ = _loss_and_grads(student, objective, False)
        ckpt, _, ckpt_grads, counts = _loss_and_grads(student, objective, True)
    assert torch.equal(ckpt, plain) and all(torch.equal(ckpt_grads[n], g) for n, g in plain_grads.items())
    assert counts.bodies == 2 * len(student.model.layers)


@pytest.mark.slow
def test_checkpointing_keeps_less_alive_in_the_traced_step():
    """At the peak, the activations of a checkpointed step are those of the layers' inputs, the
    clone terms' one tensor each and the built weights: less than every layer's saved tensors."""
    teacher = make_teacher("llama-tied", vocab_size=4000)  # an embedding weight larger than the layers' weights
    cfg = teacher.config
    cfg.num_hidden_layers = 4
    spec = dict(teacher_config=cfg, student_hidden=16, arm="slice", micro_batch_size=2, seq_len=64, precision="fp32")
    plain, ckpt = trace_step(StepSpec(**spec)), trace_step(StepSpec(**spec, activation_checkpointing=True))
    assert ckpt["parts"]["activations"] < 0.8 * plain["parts"]["activations"], (plain, ckpt)
    assert ckpt["peak"] < plain["peak"]
    # What keeping the built weights costs is at most the layers' weights (not the embedding's)
    keep_weights = recompute.micro_batch
    try:
        recompute.micro_batch = lambda model: keep_weights(model, keep_weights=False)
        rebuilt = trace_step(StepSpec(**spec, activation_checkpointing=True))
    finally:
        recompute.micro_batch = keep_weights
    layer = build_student(teacher, 16).model.layers[0]
    layer_weights = 4 * sum(getattr(m, n).numel() * 4 for m in layer.modules() if parametrize.is_parametrized(m)
                            for n in m.parametrizations)
    embedding = cfg.vocab_size * 16 * 4
    assert embedding > layer_weights
    assert 0 < ckpt["parts"]["activations"] - rebuilt["parts"]["activations"] <= layer_weights, (
        ckpt, rebuilt, layer_weights)


def _train(out: Path, arm: str, checkpointed: bool, steps: int = 4, **kw) -> tuple[dict, dict]:
    teacher, student = perturbed_student("llama-tied", arm, "optimizer" if arm == "core" else None)
    return fit(CloneObjective(teacher, student, RecipeArgs(temperature=2.0)), student, out, steps,
               activation_checkpointing=checkpointed, **kw)


@pytest.mark.parametrize("arm", ["slice", "core"])
def test_a_few_optimizer_steps_give_the_same_weights(tmp_path, arm):
    plain, s_plain = _train(tmp_path / "plain", arm, False)
    ckpt, s_ckpt = _train(tmp_path / "ckpt", arm, True)
    assert s_plain["final"] == s_ckpt["final"]
    for name, w in plain.items():
        torch.testing.assert_close(ckpt[name], w, rtol=0, atol=1e-6, msg=name)


def test_resume_with_checkpointing_is_bitwise_and_may_switch_it(tmp_path):
    whole, _ = _train(tmp_path / "whole", "slice", True, steps=6, checkpoint_every=2, keep_checkpoints="all")
    for checkpointed in (True, False):  # resumed from step 4, with checkpointing on, then off
        ckpt_dir = tmp_path / f"cut-{checkpointed}.ckpt"
        shutil.copytree(tmp_path / "whole.ckpt", ckpt_dir)
        shutil.rmtree(ckpt_dir / "step-000006")
        (ckpt_dir / "DONE").unlink()
        resumed, summary = _train(tmp_path / f"cut-{checkpointed}", "slice", checkpointed, steps=6, checkpoint_every=2,
                                  ckpt_dir=ckpt_dir)
        assert summary["resumed_from"].endswith("step-000004")
        assert all(torch.equal(resumed[n], whole[n]) for n in whole), f"resumed (checkpointing {checkpointed}) differs"


def test_plain_models_checkpoint_too_and_bad_models_are_named():
    model = tiny_llama()
    objective = LMObjective(model)
    batch = {"input_ids": RandomTokens(rows=2).x}
    grads = []
    for on in (False, True):
        (recompute.enable if on else recompute.disable)(model)
        model.train().zero_grad(set_to_none=True)
        with recompute.micro_batch(model):
            objective.loss(batch, model=model)[0].backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, rtol=1e-6, atol=1e-6)
    with pytest.raises(LRCError, match="activation-checkpointing.*decoder layers"):
        recompute.enable(torch.nn.Linear(2, 2))


def test_the_options_reach_the_commands():
    from lrc.commands.distill import DistillArgs
    from lrc.commands.sft import SftArgs
    from lrc.options import parse_args

    args = parse_args(DistillArgs, ["--teacher", "t", "--data", "d", "--out", "o", "--arm", "dense", "--warmstart", "w",
                                    "--activation-checkpointing"], prog="lrc distill")
    assert args.activation_checkpointing is True and not hasattr(args, "loss_impl")
    default = parse_args(DistillArgs, ["--teacher", "t", "--data", "d", "--out", "o", "--arm", "dense",
                                       "--warmstart", "w"], prog="lrc distill")
    assert default.activation_checkpointing is False
    with pytest.raises(SystemExit):  # the reference CE + KL is the tests' oracle only, not an option
        parse_args(DistillArgs, ["--teacher", "t", "--data", "d", "--out", "o", "--arm", "dense", "--warmstart", "w",
                                 "--loss-impl", "reference"], prog="lrc distill")
    assert parse_args(SftArgs, ["--model", "m", "--data", "d", "--out", "o", "--activation-checkpointing"],
                      prog="lrc sft").activation_checkpointing
    teacher, student = perturbed_student()
    assert CloneObjective(teacher, student, RecipeArgs()).loss_impl == "fused"
    assert CloneObjective(teacher, student, RecipeArgs(), loss_impl="reference").loss_impl == "reference"
    with pytest.raises(LRCError, match="loss_impl"):
        CloneObjective(teacher, student, RecipeArgs(), loss_impl="chunked")
    with pytest.raises(TypeError, match="loss_impl"):
        RecipeArgs(loss_impl="reference")


def test_a_workflow_config_can_set_checkpointing_and_not_the_loss_impl():
    from lrc.workflow import config as wc

    config = default_config()
    exp = config["experiments"]["tiny"]
    exp["distill"]["train"]["activation_checkpointing"] = True
    assert wc.config_problems(config, rule_shells(), workdir=REPO) == []
    assert "--activation-checkpointing" in wc.cli_flags(exp["distill"]["train"])
    exp["loss"].setdefault("lrc", {})["loss_impl"] = "reference"  # no longer an option of lrc warmstart/distill
    problems = wc.config_problems(config, rule_shells(), workdir=REPO)
    assert problems and all("loss_impl" in p for p in problems), problems


def run_training(out: Path) -> None:
    """The `clone` run of tests/training_runs.py (core arm, `lrc` recipe), checkpointed."""
    from safetensors.torch import save_file

    from lrc.io.provenance import is_main_process

    teacher = make_teacher("llama-tied")
    model = build_student(teacher, 16, seed=0)
    apply_arm(model, teacher, "core")
    objective = CloneObjective(teacher, model, RecipeArgs(temperature=2.0))
    args = TrainArgs(tokens=8 * 8 * SEQ, batch_size=8, micro_batch_size=2, lr=3e-3, warmup=0.1, log_every=1, threads=1,
                     progress=False, activation_checkpointing=True)
    summary = train(objective, model, RandomTokens(rows=40), args, out)
    if is_main_process():
        out.mkdir(parents=True, exist_ok=True)
        save_file({n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad},
                  str(out / "weights.safetensors"))
        (out / "summary.json").write_text(json.dumps(summary))


@pytest.mark.slow
def test_two_checkpointed_processes_follow_one(tmp_path):
    from safetensors.torch import load_file

    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
                        "ACCELERATE_USE_CPU": "1"}
    script = str(Path(__file__).resolve())
    subprocess.run([sys.executable, script, str(tmp_path / "p1")], check=True, env=env, cwd=REPO, timeout=300)
    launch = [sys.executable, "-m", "accelerate.commands.launch",
              "--config_file", str(REPO / "config/accelerate/cpu2.yaml"), "--main_process_port", str(free_port()),
              script,
              str(tmp_path / "p2")]
    subprocess.run(launch, check=True, env=env, cwd=REPO, timeout=300)
    curves = []
    for p in ("p1", "p2"):
        metrics = Path(json.loads((tmp_path / p / "summary.json").read_text())["metrics"])
        curves.append([json.loads(line)["loss"] for line in metrics.read_text().splitlines()])
    assert len(curves[0]) == len(curves[1]) == 8 and curves[0][-1] < curves[0][0]
    rel = max(abs(a - b) / abs(a) for a, b in zip(*curves))
    w1, w2 = (load_file(str(tmp_path / p / "weights.safetensors")) for p in ("p1", "p2"))
    diff = max(float((w1[n] - w2[n]).abs().max()) for n in w1)
    print(f"checkpointed, 1 vs 2 processes: max relative loss difference {rel:.2e}, max |weight difference| {diff:.2e}")
    assert rel < 1e-4 and diff < 1e-4  # the tolerances of tests/training/test_multiprocess.py


if __name__ == "__main__":
    from lrc.cli import (
        end_process_group,  # a launched script ends its process group as `lrc` does
    )

    torch.set_num_threads(1)
    run_training(Path(sys.argv[1]))
    end_process_group()
