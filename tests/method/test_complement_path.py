"""`core` and `randcomp` as a complement path, ``W = T·F + U_perp·C`` (lrc.method.complement_path).

At step 0 it is the warm start (its factor F is the slice's own, C = 0), its gradient on F is
plain LRC's, its map is linear, injective and not orthogonal, and the optimiser-step path
clips the coordinates' gradient as the parametrised reference does (the trajectory parity of
both paths over 50 AdamW steps: tests/training/test_coordinates.py).
"""

from __future__ import annotations

import pytest
import torch

from lrc.commands.merge import merge_student
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.method.complement_path import ComplementPath
from lrc.method.reach import apply_arm
from lrc.method.spectral import compute_bases
from lrc.method.student import build_student
from lrc.names import COORDINATES_ATTR, MLP_KINDS
from lrc.training.optim import CoordinateAdamW, coordinate_maps
from tests.helpers import make_teacher

R = 16
H, D_FF = 32, 96


def student_of(teacher, arm, core_impl="optimizer", bases=None):
    student = build_student(teacher, R, seed=1)
    apply_arm(student, teacher, arm, bases=bases or compute_bases(teacher), seed=3, core_impl=core_impl)
    return student


def mlp_weights(student) -> dict[str, torch.Tensor]:
    return {f"{i}.{kind}": getattr(layer.mlp, f"{kind}_proj").weight.detach().clone()
            for i, layer in enumerate(student.model.layers) for kind in MLP_KINDS}


@pytest.mark.parametrize("arm", ["core", "randcomp"])
def test_the_map_is_linear_injective_and_not_orthogonal(arm):
    teacher = make_teacher("llama-untied")
    student = student_of(teacher, arm)
    for kind in ("gate", "down"):
        proj = getattr(student.model.layers[1].mlp, f"{kind}_proj")
        cmap = getattr(proj, COORDINATES_ATTR)
        assert isinstance(cmap, ComplementPath) and not cmap.orthogonal
        q = torch.randn(D_FF, R, dtype=torch.float32, requires_grad=True)
        w = cmap(q)
        assert w.shape == proj.weight.shape
        torch.testing.assert_close(cmap.inverse(w.detach()), q.detach(), atol=1e-4, rtol=0)  # injective
        g = torch.randn_like(w)
        (w * g).sum().backward()
        torch.testing.assert_close(cmap.coordinates(g), q.grad, atol=1e-5, rtol=1e-5)  # the adjoint
        assert abs(cmap.coordinates(g).norm() / g.norm() - 1) > 0.05  # the norms differ: clip in coordinates


@pytest.mark.parametrize("core_impl", ["optimizer", "parametrized"])
@pytest.mark.parametrize("arm", ["core", "randcomp"])
def test_step_zero_is_the_warm_start_and_merges_to_the_deployed_weight(arm, core_impl, token_batch):
    teacher = make_teacher("qwen2-tied")
    warm = build_student(teacher, R, seed=1)
    student = student_of(teacher, arm, core_impl)
    ref, now = mlp_weights(warm), mlp_weights(student)
    for name in ref:
        if core_impl == "optimizer":
            assert torch.equal(now[name], ref[name]), name  # the warm start's weight itself
        else:
            torch.testing.assert_close(now[name], ref[name], rtol=1e-6, atol=1e-6, msg=name)
    merged = merge_student(student)
    for i, layer in enumerate(merged.model.layers):
        for kind in MLP_KINDS:
            assert torch.equal(getattr(layer.mlp, f"{kind}_proj").weight, now[f"{i}.{kind}"])  # bitwise
    torch.testing.assert_close(student(input_ids=token_batch).logits, warm(input_ids=token_batch).logits,
                               rtol=1e-5, atol=1e-5)


def test_the_factor_gets_plain_lrcs_gradient(token_batch):
    """Reading (a): the in-subspace coordinate is LRC's factor, with LRC's gradient (scaled by T's
    singular values), not the orthonormal coordinates' (docs/method.md §3)."""
    teacher = make_teacher("llama-untied")
    slice_student = build_student(teacher, R, seed=1)
    core = student_of(teacher, "core", "parametrized")
    for student in (slice_student, core):
        total, _ = CloneObjective(teacher, student, RecipeArgs()).loss({"input_ids": token_batch})
        total.backward()
    for kind in ("gate", "down"):
        factor = getattr(slice_student.model.layers[0].mlp, f"{kind}_proj").parametrizations.weight.original
        coords = getattr(core.model.layers[0].mlp, f"{kind}_proj").parametrizations.weight.original
        # (down: the slice's factor also feeds the mlp-out clone target; core's frozen copy does not)
        if kind == "gate":
            torch.testing.assert_close(coords.grad[:H], factor.grad.T, rtol=1e-4, atol=1e-7)
        assert coords.grad[H:].abs().max() > 0  # the complement learns from the first step


def test_clipping_sees_the_coordinates_gradient(token_batch):
    """One clipped AdamW step: the optimiser-step path clips ‖M*(g_W)‖, as the parametrised arm's
    clipping of its coordinates does (not ‖g_W‖), and both take the same step."""
    teacher = make_teacher("llama-untied")
    bases = compute_bases(teacher)
    norms, weights = {}, {}
    for impl in ("parametrized", "optimizer"):
        student = student_of(teacher, "core", impl, bases)
        params = [p for p in student.parameters() if p.requires_grad]
        opt = CoordinateAdamW(params, coordinates=coordinate_maps(student), lr=1e-2)
        total, _ = CloneObjective(teacher, student, RecipeArgs()).loss({"input_ids": token_batch})
        total.backward()
        if impl == "optimizer":
            assert opt.clips_in_coordinates
            plain_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
            norms[impl] = opt.clip_grad_norm_(params, 0.01)
            assert abs(norms[impl] / plain_norm - 1) > 1e-3  # not the weights' gradient norm
        else:
            norms[impl] = torch.nn.utils.clip_grad_norm_(params, 0.01)
        opt.step()
        weights[impl] = mlp_weights(merge_student(student))
    torch.testing.assert_close(norms["optimizer"], norms["parametrized"], rtol=1e-5, atol=0)
    assert norms["optimizer"] > 0.01  # the clip was active
    for name in weights["parametrized"]:
        torch.testing.assert_close(weights["optimizer"][name], weights["parametrized"][name], rtol=1e-4, atol=1e-6)
