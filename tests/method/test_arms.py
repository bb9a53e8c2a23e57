"""The arms: same function at step 0, parameter counts, reachable sets, coordinates."""

from __future__ import annotations

import pytest
import torch

from lrc.errors import LRCError
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.method.reach import CORE_IMPLS, apply_arm
from lrc.method.spectral import compute_bases, mlp_teacher_matrix
from lrc.method.student import build_student, trainable_parameters
from lrc.names import ARMS
from lrc.training.optim import CoordinateAdamW, coordinate_maps
from tests.helpers import make_teacher

R = 16
H, D_FF = 32, 96


def arm_student(teacher, arm, bases, seed=0, core_impl="optimizer"):
    student = build_student(teacher, R, seed=seed)
    apply_arm(student, teacher, arm, bases=bases, seed=7, core_impl=core_impl)
    return student


def adamw(student, **kwargs):
    """AdamW as the training loop builds it: in the arm's coordinates where it has a map."""
    return CoordinateAdamW([p for _, p in trainable_parameters(student)], coordinates=coordinate_maps(student),
                           **kwargs)


def test_all_arms_compute_the_warm_start_at_step_zero(teacher, token_batch):
    bases = compute_bases(teacher)
    batch = {"input_ids": token_batch, "loss_mask": torch.ones_like(token_batch, dtype=torch.bool)}
    ref_logits, ref_terms = None, None
    for arm in ARMS + tuple(f"{a}:parametrized" for a in ("core", "coreortho", "randcomp")):
        name, _, impl = arm.partition(":")
        student = arm_student(teacher, name, bases, core_impl=impl or "optimizer")
        logits = student(input_ids=token_batch).logits
        with torch.no_grad():
            _, terms = CloneObjective(teacher, student, RecipeArgs()).loss(batch)
        if ref_logits is None:
            ref_logits, ref_terms = logits, terms
            continue
        assert (logits - ref_logits).abs().max().item() <= 1e-5, arm
        for name, value in terms.items():
            torch.testing.assert_close(value, ref_terms[name], rtol=1e-5, atol=1e-6, msg=f"{arm} {name}")


def mlp_trainable_counts(student):
    counts = {}
    for name, p in trainable_parameters(student):
        if "layers.0.mlp." in name:
            counts[name.split(".")[4]] = p.numel()
    return counts


@pytest.mark.parametrize("core_impl", CORE_IMPLS)
@pytest.mark.parametrize("arm", ARMS)
def test_trainable_numbers_per_mlp_matrix(arm, core_impl):
    teacher = make_teacher("llama-untied")
    student = arm_student(teacher, arm, compute_bases(teacher), core_impl=core_impl)
    want = H * R if arm == "slice" else D_FF * R
    assert mlp_trainable_counts(student) == {"gate_proj": want, "up_proj": want, "down_proj": want}
    # attention, embedding and norms are plain LRC in every arm
    assert sum(p.numel() for n, p in trainable_parameters(student) if "self_attn" in n) == 2 * (4 * H * R)


def outside_teacher_space(student, teacher, bases):
    """Largest relative energy of an MLP weight outside the teacher's column (row) space."""
    worst = 0.0
    for i, layer in enumerate(student.model.layers):
        for kind in ("gate", "up", "down"):
            w = getattr(layer.mlp, f"{kind}_proj").weight.detach().double()
            w = w.T if kind == "down" else w
            u = bases.basis(i, kind).double()
            rest = w - u @ (u.T @ w)
            worst = max(worst, (rest.norm() / w.norm()).item() ** 2)
    return worst


@pytest.mark.parametrize("core_impl", CORE_IMPLS)
def test_reachability_after_training(token_batch, core_impl):
    teacher = make_teacher("qwen2-untied")
    bases = compute_bases(teacher)
    batch = {"input_ids": token_batch}
    for arm in ARMS:
        student = arm_student(teacher, arm, bases, core_impl=core_impl)
        objective = CloneObjective(teacher, student, RecipeArgs())
        opt = adamw(student, lr=1e-2)
        for _ in range(3):
            total, _ = objective.loss(batch)
            opt.zero_grad()
            total.backward()
            opt.step()
        outside = outside_teacher_space(student, teacher, bases)
        if arm in ("slice", "confined"):
            assert outside <= 1e-6, (arm, outside)
        else:
            assert outside > 1e-4, (arm, outside)


@pytest.mark.parametrize("core_impl", CORE_IMPLS)
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_coreortho_is_dense_in_rotated_coordinates(opt_name, token_batch, core_impl):
    teacher = make_teacher("llama-tied")
    bases = compute_bases(teacher)
    batch = {"input_ids": token_batch}
    weights = {}
    for arm in ("dense", "coreortho"):
        student = arm_student(teacher, arm, bases, core_impl=core_impl)
        objective = CloneObjective(teacher, student, RecipeArgs())
        if opt_name == "sgd":
            opt = torch.optim.SGD([p for _, p in trainable_parameters(student)], lr=20.0, momentum=0.0)
        else:
            opt = adamw(student, lr=1e-2, weight_decay=0.0)
        total, _ = objective.loss(batch)
        opt.zero_grad()
        total.backward()
        opt.step()
        weights[arm] = torch.cat([getattr(l.mlp, f"{k}_proj").weight.detach().flatten() for l in student.model.layers
                                  for k in ("gate", "up", "down")])
        start = torch.cat([getattr(l.mlp, f"{k}_proj").weight.detach().flatten()
                           for l in arm_student(teacher, arm, bases).model.layers for k in ("gate", "up", "down")])
        assert (weights[arm] - start).abs().max() > 1e-3  # the step did move the weights
    diff = (weights["dense"] - weights["coreortho"]).abs().max().item()
    if opt_name == "sgd":
        assert diff <= 1e-5  # orthogonal change of coordinates: same gradient step
    else:
        assert diff > 1e-3  # AdamW is not rotation invariant


@pytest.mark.parametrize("core_impl", ["optimizer", "parametrized"])
def test_randcomp_basis_is_seeded_and_differs_from_core(token_batch, core_impl):
    teacher = make_teacher("llama-untied")
    bases = compute_bases(teacher)

    def trained(arm, seed):
        student = build_student(teacher, R)
        apply_arm(student, teacher, arm, bases=bases, seed=seed, core_impl=core_impl)
        opt = adamw(student, lr=1e-2)
        total, _ = CloneObjective(teacher, student, RecipeArgs()).loss({"input_ids": token_batch})
        total.backward()
        opt.step()
        return student.model.layers[0].mlp.gate_proj.weight.detach()

    a, b, c, core = trained("randcomp", 1), trained("randcomp", 1), trained("randcomp", 2), trained("core", 1)
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-4 and (a - core).abs().max() > 1e-4


def test_bases_are_deterministic_and_orthonormal():
    teacher = make_teacher("qwen2-tied")
    a, b = compute_bases(teacher), compute_bases(teacher)
    for key in a.U:
        assert torch.equal(a.U[key], b.U[key])
    u = a.basis(1, "down").double()
    torch.testing.assert_close(u.T @ u, torch.eye(H, dtype=torch.float64), atol=1e-6, rtol=0)
    t = mlp_teacher_matrix(teacher, 1, "down").double()
    torch.testing.assert_close(u @ (u.T @ t), t, atol=1e-5, rtol=0)


def test_bad_arm_and_double_apply():
    teacher = make_teacher("llama-tied")
    student = build_student(teacher, R)
    with pytest.raises(LRCError, match="'wide'"):
        apply_arm(student, teacher, "wide")
    apply_arm(student, teacher, "dense")
    with pytest.raises(LRCError, match="dense"):
        apply_arm(student, teacher, "core")
