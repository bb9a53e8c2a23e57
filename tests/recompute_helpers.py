"""Students, a batch and a short training run for the activation-checkpointing tests
(test_recompute, test_teacher_recompute)."""

from __future__ import annotations

from pathlib import Path

import torch

from lrc.io.hf import trainable_parameters
from lrc.method.reach import apply_arm
from lrc.method.student import build_student
from lrc.training import recompute
from lrc.training.loop import TrainArgs, train
from tests.helpers import SEQ, RandomTokens, make_teacher

# (arm, core_impl): every arm, and core and randcomp in both implementations.
ARM_IMPLS = [("slice", None), ("dense", None), ("core", "optimizer"), ("core", "parametrized"), ("confined", None),
             ("randcomp", "optimizer"), ("randcomp", "parametrized")]


def perturbed_student(kind="llama-tied", arm="slice", core_impl=None):
    """(teacher, student): a ``kind`` teacher and its width-16 student on ``arm``, moved off its init, in train mode."""
    teacher = make_teacher(kind)
    student = build_student(teacher, 16, seed=3)
    if arm != "slice":
        apply_arm(student, teacher, arm, **({"core_impl": core_impl} if core_impl else {}))
    with torch.no_grad():  # away from the init, so that every term and gradient is non-trivial
        for _, p in trainable_parameters(student):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    return teacher, student.train()


def masked_batch():
    """2 seeded sequences of 16 tokens with a seeded loss mask."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (2, 16), generator=g)
    return {"input_ids": ids, "loss_mask": torch.rand(2, 16, generator=g) > 0.3}


def fit(objective, student, out: Path, steps: int, **kw) -> tuple[dict, dict]:
    """``steps`` optimiser steps of 2 micro-batches of 2 sequences; the trained weights and the summary."""
    args = TrainArgs(tokens=steps * 4 * SEQ, batch_size=4, micro_batch_size=2, lr=3e-3, warmup=0.0, log_every=1,
                     progress=False, **kw)
    summary = train(objective, student, RandomTokens(rows=24), args, out)
    objective.close()
    assert not recompute.is_enabled(student)  # train() leaves the model as it came
    return {n: p.detach().clone() for n, p in trainable_parameters(student)}, summary
