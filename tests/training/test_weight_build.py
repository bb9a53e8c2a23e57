"""The student's weights built once per optimiser step (`lrc.training.weight_build`, ``--weight-build``):
the same trajectory as building them in every micro-batch, built once, refused where it cannot run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState
from torch.nn.utils import parametrize

from lrc.errors import LRCError
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.training.loop import TrainArgs, train
from lrc.training.weight_build import built_once, builds_once
from tests.helpers import SEQ, RandomTokens
from tests.recompute_helpers import perturbed_student

STEPS = 20


def _run(tmp_path: Path, name: str, *, kind: str, arm: str, recipe: str, weight_build: str, **extra):
    teacher, student = perturbed_student(kind, arm)
    objective = CloneObjective(teacher, student, RecipeArgs(recipe=recipe, temperature=2.0))
    args = TrainArgs(tokens=STEPS * 4 * SEQ, batch_size=4, micro_batch_size=1, lr=3e-3, warmup=0.1, log_every=1,
                     threads=1, progress=False, weight_build=weight_build, **extra)
    summary = train(objective, student, RandomTokens(rows=40), args, tmp_path / name)
    losses = [json.loads(line)["loss"] for line in Path(summary["metrics"]).read_text().splitlines()]
    return summary, losses, {n: p.detach().clone() for n, p in student.named_parameters() if p.requires_grad}


def _agree(losses, expected_losses, weights, expected_weights):
    """Every logged loss within 1e-5 relative (1e-6 absolute: the `kl` recipe's loss of about 0.02 carries
    float32 noise of 1e-7), every trained weight within 1e-5 (measured: about 2e-7)."""
    assert all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) for a, b in zip(losses, expected_losses))
    assert max(float((weights[n] - expected_weights[n]).abs().max()) for n in expected_weights) < 1e-5


# Every arm and both recipes, on a tied and an untied teacher of both architectures.
CASES = [("llama-tied", "slice", "lrc"), ("qwen2-untied", "slice", "kl"), ("llama-untied", "dense", "lrc"),
         ("qwen2-tied", "core", "lrc"), ("llama-tied", "coreortho", "kl"), ("llama-untied", "confined", "lrc"),
         ("qwen2-untied", "randcomp", "kl")]


@pytest.mark.parametrize(("kind", "arm", "recipe"), CASES)
def test_built_once_per_step_follows_the_per_micro_batch_build(tmp_path, kind, arm, recipe):
    """4 micro-batches per step, 20 AdamW steps: the losses and every trained weight agree within 1e-5."""
    once, once_losses, once_w = _run(tmp_path, "step", kind=kind, arm=arm, recipe=recipe, weight_build="step")
    each, each_losses, each_w = _run(tmp_path, "each", kind=kind, arm=arm, recipe=recipe, weight_build="micro_batch")
    assert (once["weight_build"], each["weight_build"], once["grad_accumulation"]) == ("step", "micro_batch", 4)
    assert len(once_losses) == STEPS and once_losses[-1] < once_losses[0]  # it trained
    _agree(once_losses, each_losses, once_w, each_w)


def test_the_same_math_in_float64(tmp_path):
    """In float64 the two builds agree to rounding of 1e-16: the float32 differences above are the order of the
    additions (the orthonormal coordinates, built by Householder products, amplify them most)."""
    weights = {}
    for build in ("step", "micro_batch"):
        teacher, student = perturbed_student("llama-tied", "coreortho", "parametrized")
        teacher.double(), student.double()
        objective = CloneObjective(teacher, student, RecipeArgs(temperature=2.0))
        args = TrainArgs(tokens=STEPS * 4 * SEQ, batch_size=4, micro_batch_size=1, lr=3e-3, progress=False,
                         weight_build=build)
        train(objective, student, RandomTokens(rows=40), args, tmp_path / build)
        weights[build] = {n: p.detach().clone() for n, p in student.named_parameters() if p.requires_grad}
    assert max(float((weights["step"][n] - w).abs().max()) for n, w in weights["micro_batch"].items()) < 1e-12


def test_built_once_under_activation_checkpointing(tmp_path):
    """With the layers recomputed in backward, the recompute reads the step's weights too."""
    kwargs = dict(kind="llama-untied", arm="slice", recipe="lrc", activation_checkpointing=True)
    _, once_losses, once_w = _run(tmp_path, "step", weight_build="step", **kwargs)
    _, each_losses, each_w = _run(tmp_path, "each", weight_build="micro_batch", **kwargs)
    _agree(once_losses, each_losses, once_w, each_w)


@pytest.mark.parametrize(("weight_build", "builds_per_step"), [("step", 1), ("micro_batch", 4)])
def test_each_weight_is_built_once_per_step(tmp_path, weight_build, builds_per_step):
    """Counted at the parametrisations themselves: every parametrised weight is evaluated once per step
    (4 times, once per micro-batch, on the other path)."""
    teacher, student = perturbed_student("llama-untied", "slice")
    built: dict[str, int] = {}
    for name, module in student.named_modules():
        if parametrize.is_parametrized(module):
            def count(*_, name=name):
                built[name] = built.get(name, 0) + 1
            module.parametrizations.weight.register_forward_hook(count)
    objective = CloneObjective(teacher, student, RecipeArgs())
    args = TrainArgs(tokens=2 * 4 * SEQ, batch_size=4, micro_batch_size=1, progress=False, weight_build=weight_build)
    train(objective, student, RandomTokens(rows=8), args, tmp_path / "run")
    assert len(built) == 7 * 2 + 2  # q, k, v, o, gate, up, down per layer; the embedding and the head
    assert set(built.values()) == {2 * builds_per_step}


def test_a_tied_head_reads_the_embeddings_build(tmp_path):
    """A tied student's embedding and head are one product (the teacher's embedding times the shared factor):
    built once per step for both, where the per-micro-batch order builds it twice per forward."""
    teacher, student = perturbed_student("llama-tied", "slice")
    built: dict[str, int] = {}
    for name in ("model.embed_tokens", "lm_head"):
        def count(*_, name=name):
            built[name] = built.get(name, 0) + 1
        student.get_submodule(name).parametrizations.weight.register_forward_hook(count)
    args = TrainArgs(tokens=2 * 4 * SEQ, batch_size=4, micro_batch_size=1, progress=False, weight_build="step")
    train(CloneObjective(teacher, student, RecipeArgs()), student, RandomTokens(rows=8), args, tmp_path / "run")
    assert built == {"model.embed_tokens": 2}  # 2 steps; the head read the same leaf


def test_auto_builds_once_only_where_it_can_and_step_is_refused_under_fsdp():
    assert builds_once("auto", accum=4, fsdp=False) and not builds_once("auto", accum=1, fsdp=False)
    assert not builds_once("auto", accum=4, fsdp=True) and not builds_once("micro_batch", accum=4, fsdp=False)
    assert builds_once("step", accum=1, fsdp=False)
    with pytest.raises(LRCError, match="weight_build.*FSDP2"):
        builds_once("step", accum=4, fsdp=True)


@pytest.mark.parametrize(("weight_build", "micro_batch_size", "why"),
                         [("micro_batch", 1, "--weight-build micro_batch with 4 micro-batches"),
                          ("auto", 4, "--weight-build auto with 1 micro-batch per step")])
def test_dividing_a_build_that_is_not_once_per_step_is_refused(tmp_path, weight_build, micro_batch_size, why):
    """--divide-weight-build has nothing to divide where the weights are built in every micro-batch: refused
    before any work, naming the key and the reason, instead of running undivided."""
    teacher, student = perturbed_student("llama-untied", "dense")
    args = TrainArgs(tokens=4 * SEQ, batch_size=4, micro_batch_size=micro_batch_size, progress=False,
                     weight_build=weight_build, divide_weight_build=True)
    with pytest.raises(LRCError, match=f"train.divide_weight_build.*{why}"):
        train(CloneObjective(teacher, student, RecipeArgs()), student, RandomTokens(rows=8), args, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_under_bf16_autocast_the_leaves_share_the_built_weights_and_sum_gradients_in_fp32(tmp_path):
    """Under bf16 mixed precision a step holds each weight once, in bf16 (the leaf is the built weight, not an
    fp32 copy), and sums its micro-batches' gradients in one fp32 tensor; with --precision bf16 on the CPU, 20
    AdamW steps of 4 micro-batches then follow the per-micro-batch build within 1e-4 (measured: 1e-5)."""
    teacher, student = perturbed_student("llama-untied", "dense")
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    ids = torch.randint(0, student.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with built_once(student, autocast) as weights:
        assert {leaf.dtype for leaf in weights.leaves} == {torch.bfloat16}
        assert all(leaf.data_ptr() == w.data_ptr() for leaf, w in zip(weights.leaves, weights.built))
        for _ in range(2):
            with autocast():
                student(input_ids=ids).logits.float().pow(2).mean().backward()
        trained = [i for i, leaf in enumerate(weights.leaves) if leaf.requires_grad]
        assert trained and all(weights.leaves[i].grad is None for i in trained)
        assert {weights.sums[i].dtype for i in trained} == {torch.float32}
        weights.backward()
    assert all(p.grad is not None for n, p in student.named_parameters() if p.requires_grad and "original" in n)
    # accelerate keeps one precision per process: bf16 here, then back to the other tests' fp32
    AcceleratorState._reset_state(True)
    try:
        losses = {build: _run(tmp_path, build, kind="llama-tied", arm="dense", recipe="lrc", weight_build=build,
                              precision="bf16")[1] for build in ("step", "micro_batch")}
    finally:
        AcceleratorState._reset_state(True)
    assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(losses["step"], losses["micro_batch"]))
