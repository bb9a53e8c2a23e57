"""What the distill seed varies and what it does not (docs/method.md, "What a seed varies")."""

from __future__ import annotations

import pytest
import torch

from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.method.reach import apply_arm
from lrc.method.spectral import compute_bases
from lrc.method.student import build_student
from lrc.names import ARMS, COORDINATES_ATTR, MLP_KINDS
from lrc.training.loop import StepBatches
from tests.helpers import make_teacher

R = 16


def order(seed: int, rows: int = 40, steps: int = 10) -> list[int]:
    """Every row the run reads, in order (one process, 4 sequences per step, 2 epochs)."""
    sampler = StepBatches(rows, seed=seed, batch_size=4, micro_batch_size=4, num_processes=1, process_index=0,
                          start_step=0, steps=steps * 2)
    return [row for batch in sampler for row in batch]


def test_the_seed_sets_the_data_order():
    a, b = order(0), order(1)
    assert a == order(0)
    assert a != b and a[:40] != b[:40]
    assert sorted(a[:40]) == sorted(b[:40]) == list(range(40))  # each epoch is a permutation of all rows
    assert a[:40] != a[40:]  # and each epoch has its own


def test_only_randcomp_reads_the_seed_of_the_arm():
    teacher = make_teacher("llama-untied")
    bases = compute_bases(teacher)
    warm = build_student(teacher, R, seed=5)

    def arm_student(arm, seed):
        student = build_student(teacher, R, seed=5)
        student.load_state_dict(warm.state_dict())
        apply_arm(student, teacher, arm, bases=bases, seed=seed)
        return student

    for arm in ARMS:
        a, b = arm_student(arm, 1), arm_student(arm, 2)
        for i in range(teacher.config.num_hidden_layers):
            for kind in MLP_KINDS:
                pa, pb = getattr(a.model.layers[i].mlp, f"{kind}_proj"), getattr(b.model.layers[i].mlp, f"{kind}_proj")
                # Step 0: the same deployed weight (the warm start's) whatever the seed.
                torch.testing.assert_close(pa.weight, pb.weight, rtol=0, atol=1e-6)
                rot_a = getattr(getattr(pa, COORDINATES_ATTR, None), "rotation", None)
                rot_b = getattr(getattr(pb, COORDINATES_ATTR, None), "rotation", None)
                if arm == "randcomp":  # its random completion is the seed's
                    assert rot_a is not None and (rot_a - rot_b).abs().max() > 0.1
                else:
                    assert rot_a is None and rot_b is None
        if arm != "randcomp":
            sa, sb = a.state_dict(), b.state_dict()
            assert all(torch.equal(sa[k], sb[k]) for k in sa), arm


@pytest.mark.parametrize("init", ["normal", "spectral"])
def test_a_fresh_init_reads_the_seed_only_when_normal(init):
    teacher = make_teacher("llama-tied")
    bases = compute_bases(teacher)
    a = build_student(teacher, R, init=init, seed=1, bases=bases).state_dict()
    b = build_student(teacher, R, init=init, seed=2, bases=bases).state_dict()
    same = all(torch.equal(a[k], b[k]) for k in a)
    assert same == (init != "normal")


def test_the_training_forward_draws_no_random_numbers(token_batch):
    """No dropout anywhere: the global RNG the loop seeds (accelerate's set_seed) changes nothing."""
    teacher = make_teacher("qwen2-tied")
    student = build_student(teacher, R, seed=0)
    apply_arm(student, teacher, "dense")
    student.train()
    objective = CloneObjective(teacher, student, RecipeArgs())
    losses = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        total, terms = objective.loss({"input_ids": token_batch})
        losses.append([total.item()] + [t.item() for t in terms.values()])
    assert losses[0] == losses[1]
