"""`lrc plan`'s cost: the FLOPs of one traced step, split into token work, weight-side work and the
optimiser step, and the GPU time they give."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig

from lrc.errors import LRCError
from lrc.training.cost import gpu_cost, step_flops
from lrc.training.memory import StepSpec

TINY = LlamaConfig(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True)


def _flops(arm: str, **spec) -> dict:
    return step_flops(StepSpec(teacher_config=TINY, student_hidden=64, arm=arm, seq_len=32, **spec))


@pytest.mark.parametrize("arm", ["slice", "dense", "core", "coreortho"])
def test_the_split_is_token_work_that_scales_with_the_batch_and_weight_work_that_does_not(arm):
    """Twice the sequences: the token work doubles exactly; building the weights and the optimiser step
    do not move. Work misfiled as weight-side (or missed there) would break the doubling."""
    one, two = _flops(arm, micro_batch_size=1), _flops(arm, micro_batch_size=2)
    assert two["token_work"] == 2 * one["token_work"] > 0 and two["tokens"] == 2 * one["tokens"]
    assert two["weight_side"] == one["weight_side"] > 0 and two["optimizer"] == one["optimizer"]
    assert one["total"] == one["token_work"] + one["weight_side"] + one["optimizer"]
    again = _flops(arm, micro_batch_size=1, micro_batches=2)  # built in every forward: twice per step
    assert again["weight_side"] == 2 * one["weight_side"] and again["token_work"] == 2 * one["token_work"]
    once = _flops(arm, micro_batch_size=1, micro_batches=2, build_once=True)  # the traced step builds them once
    assert once["token_work"] == 2 * one["token_work"]
    # ... and the tied head reads the embedding's product: its build (vocab x H x r, 2 FLOPs per multiply-add) and
    # its product back to the factor (the teacher's embedding is frozen) counted once, not twice
    assert one["weight_side"] - once["weight_side"] == 2 * 2 * TINY.vocab_size * TINY.hidden_size * 64


def test_the_arms_differ_where_the_method_says():
    """The same tokens cost every arm the same; slice builds its MLP from teacher products, dense
    trains the MLP matrices themselves; core's basis change runs in the optimiser step."""
    slice_, dense, core = (_flops(arm, micro_batch_size=2) for arm in ("slice", "dense", "core"))
    assert dense["token_work"] == core["token_work"]
    assert slice_["weight_side"] > dense["weight_side"] == core["weight_side"]
    assert slice_["optimizer"] == dense["optimizer"] == 0 < core["optimizer"]


def test_gpu_time_from_the_counted_flops():
    flops = {"total": 989.4e12 * 0.5, "tokens": 6144}
    cost = gpu_cost(flops, gpu="h100", precision="bf16", mfu=0.5, gpus=8, tokens=6144 * 8 * 10 + 1)
    assert cost["step_s"] == pytest.approx(1.0) and cost["tokens_per_s_per_gpu"] == pytest.approx(6144)
    assert cost["steps"] == 11 and cost["gpu_hours"] == pytest.approx(11 * 8 / 3600)
    assert gpu_cost(flops, gpu="a100", precision="fp32", mfu=0.5, gpus=8, tokens=None)["step_s"] == pytest.approx(
        989.4 / 156.0)


def test_bad_cost_options_are_named():
    from lrc.commands.plan import main

    with pytest.raises(LRCError, match="--mfu"):
        main(["--teacher-config", "x.json", "--student-hidden", "8", "--micro-batch-size", "1", "--seq-len", "8",
              "--mfu", "1.5"])
    with pytest.raises(LRCError, match="--tokens"):
        main(["--teacher-config", "x.json", "--student-hidden", "8", "--micro-batch-size", "1", "--seq-len", "8",
              "--tokens", "0"])
