"""The fused, chunked CE + KL (lrc.method.fused_loss) against the dense reference (lrc.method.losses).

Parity ≤ 1e-5 (fp32) on the total, CE and KL and on the gradients (hidden states, head
weight, every trainable student parameter), for both recipes and plain KD, with and without
loss masks, tied and untied heads; and no [B, L, V] tensor saved for backward.
"""

from __future__ import annotations

import pytest
import torch

from lrc.errors import LRCError
from lrc.method import fused_loss
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.method.fused_loss import fused_ce_kl
from lrc.method.losses import kl_divergence, kl_position_mask, next_token_ce
from lrc.method.objectives import KDObjective
from lrc.method.student import build_student, trainable_parameters
from tests.helpers import TEACHER_KINDS, make_teacher

TOL = {"rtol": 1e-5, "atol": 1e-5}
B, L, R, H, V = 3, 11, 8, 12, 53


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    hs = (torch.randn(B, L, R, generator=g) * 2).requires_grad_()
    w = torch.randn(V, R, generator=g).requires_grad_()
    ht, tw = torch.randn(B, L, H, generator=g) * 2, torch.randn(V, H, generator=g)
    ids = torch.randint(0, V, (B, L), generator=g)
    mask = torch.rand(B, L, generator=g) > 0.4
    return hs, w, ht, tw, ids, mask


def _reference(hs, w, ht, tw, ids, mask, temperature, positions, reduction, ce_weight, kl_weight):
    zs, zt = hs @ w.T, ht @ tw.T
    ce = next_token_ce(zs, ids, mask)
    if positions == "all":
        kl = kl_divergence(zt, zs, temperature, None if mask is None else kl_position_mask(mask, "all"), reduction)
    else:  # the KD objective's convention: logits [:, :-1], counted where loss_mask[t+1]
        counted = kl_position_mask(torch.ones_like(ids, dtype=torch.bool) if mask is None else mask, "next")
        kl = kl_divergence(zt[:, :-1], zs[:, :-1], temperature, counted, reduction)
    return ce_weight * ce + kl_weight * kl, ce, kl


@pytest.mark.parametrize("positions", ["all", "next"])
@pytest.mark.parametrize("reduction", ["batchmean", "token"])
@pytest.mark.parametrize("masked", ["none", "random", "empty"])
@pytest.mark.parametrize("chunk_rows", [1, 7, 1000])
def test_values_and_gradients_match_the_dense_reference(positions, reduction, masked, chunk_rows):
    hs, w, ht, tw, ids, mask = _inputs()
    mask = {"none": None, "random": mask, "empty": torch.zeros_like(mask)}[masked]
    args = (4.0, positions, reduction, 0.7, 1.3)
    got = fused_ce_kl(hs, w, ht, tw, ids, mask, temperature=4.0, kl_positions=positions, kl_reduction=reduction,
                      ce_weight=0.7, kl_weight=1.3, chunk_rows=chunk_rows)
    want = _reference(hs, w, ht, tw, ids, mask, *args)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)
    assert not got[1].requires_grad and not got[2].requires_grad  # only the total carries a gradient
    g_got = torch.autograd.grad(got[0] * 2.5, (hs, w))  # a non-unit incoming gradient
    g_want = torch.autograd.grad(want[0] * 2.5, (hs, w))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, **TOL)


def test_zero_ce_weight_still_reports_ce_and_drops_its_gradient():
    hs, w, ht, tw, ids, mask = _inputs(1)
    total, ce, _ = fused_ce_kl(hs, w, ht, tw, ids, mask, temperature=2.0, kl_positions="all", ce_weight=0.0,
                               chunk_rows=5)
    want_total, want_ce, want_kl = _reference(hs, w, ht, tw, ids, mask, 2.0, "all", "batchmean", 0.0, 1.0)
    torch.testing.assert_close(ce, want_ce, **TOL)
    torch.testing.assert_close(total, want_kl, **TOL)
    for a, b in zip(torch.autograd.grad(total, (hs, w)), torch.autograd.grad(want_total, (hs, w))):
        torch.testing.assert_close(a, b, **TOL)


def test_bad_shapes_and_options_are_named():
    hs, w, ht, tw, ids, _ = _inputs()
    with pytest.raises(LRCError, match="head weights"):
        fused_ce_kl(hs, w[:-1], ht, tw, ids, temperature=1.0, kl_positions="all")
    with pytest.raises(LRCError, match="hidden states"):
        fused_ce_kl(hs[:, :-1], w, ht, tw, ids, temperature=1.0, kl_positions="all")
    with pytest.raises(LRCError, match="kl_reduction"):
        fused_ce_kl(hs, w, ht, tw, ids, temperature=1.0, kl_positions="all", kl_reduction="mean")
    with pytest.raises(LRCError, match="loss_impl"):
        CloneObjective(make_teacher("llama-tied"), build_student(make_teacher("llama-tied"), 16), RecipeArgs(),
                       loss_impl="dense")


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 5 positions at the test vocabulary (97), so the objectives cross chunk edges."""
    monkeypatch.setattr(fused_loss, "CHUNK_BYTES", 4 * 97 * 5)


def _batch(masked: bool, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (2, 16), generator=g)
    batch = {"input_ids": ids}
    if masked:
        batch["loss_mask"] = torch.rand(2, 16, generator=g) > 0.3
    return batch


def _loss_and_grads(objective, params, batch):
    for p in params:
        p.grad = None
    total, terms = objective.loss(batch)
    total.backward()
    return total.detach(), terms, [p.grad.clone() for p in params]


def _assert_same(fused, reference):
    (t1, terms1, g1), (t2, terms2, g2) = fused, reference
    torch.testing.assert_close(t1, t2, **TOL)
    assert set(terms1) == set(terms2)
    for name in terms1:
        torch.testing.assert_close(terms1[name], terms2[name], **TOL, msg=lambda m, n=name: f"term {n}: {m}")
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("kind", TEACHER_KINDS)
@pytest.mark.parametrize("recipe", ["lrc", "kl"])
@pytest.mark.parametrize("masked", [False, True])
def test_clone_objective_fused_equals_reference(small_chunks, kind, recipe, masked):
    teacher = make_teacher(kind)
    student = build_student(teacher, 16)
    params = [p for _, p in trainable_parameters(student)]
    r = RecipeArgs(recipe=recipe, temperature=3.0, kl_reduction="token" if masked else "batchmean")
    batch = _batch(masked)
    results = []
    for impl in ("fused", "reference"):
        objective = CloneObjective(teacher, student, r, loss_impl=impl)
        results.append(_loss_and_grads(objective, params, batch))
        objective.close()
    _assert_same(*results)


@pytest.mark.parametrize("kind", ["llama-tied", "qwen2-untied"])
@pytest.mark.parametrize("reduction", ["batchmean", "token"])
@pytest.mark.parametrize("masked", [False, True])
def test_kd_objective_fused_equals_reference(small_chunks, kind, reduction, masked):
    teacher, student = make_teacher(kind, seed=0), make_teacher(kind, seed=1).train()
    params = list(student.parameters())
    batch = _batch(masked)
    results = [_loss_and_grads(KDObjective(teacher, student, temperature=2.0, kl_reduction=reduction, loss_impl=impl),
                               params, batch)
               for impl in ("fused", "reference")]
    _assert_same(*results)


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_no_vocabulary_sized_activation_is_saved_for_backward(impl):
    teacher = make_teacher("llama-tied")
    objective = CloneObjective(teacher, build_student(teacher, 16), RecipeArgs(), loss_impl=impl)
    batch = _batch(False)
    n_pos = batch["input_ids"].numel()
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        objective.loss(batch)
    per_position_vocab = [s for s in saved if len(s) >= 2 and s[-1] == 97 and torch.Size(s).numel() >= n_pos * 97]
    assert bool(per_position_vocab) == (impl == "reference"), per_position_vocab


def test_the_fused_path_builds_each_parametrised_weight_once_per_forward():
    """The head's weight comes from the forward's cache: no second [V, H] x [H, r] product."""
    from torch.nn.utils import parametrize

    teacher = make_teacher("llama-untied")
    student = build_student(teacher, 16)
    calls = []
    for module in student.modules():
        if parametrize.is_parametrized(module):
            for plist in module.parametrizations.values():
                plist[0].register_forward_hook(lambda *_: calls.append(1))
    n_weights = sum(1 for m in student.modules() if parametrize.is_parametrized(m))
    for impl in ("reference", "fused"):
        calls.clear()
        CloneObjective(teacher, student, RecipeArgs(), loss_impl=impl).loss(_batch(False))
        assert len(calls) == n_weights, (impl, len(calls), n_weights)


@pytest.mark.parametrize("recipe", ["lrc", "kl"])
def test_training_with_the_fused_loss_follows_the_reference(tmp_path, recipe):
    """Ten optimiser steps of the real loop: the same logged losses and the same weights."""
    import json
    from pathlib import Path

    from lrc.training.loop import TrainArgs, train
    from tests.helpers import SEQ, RandomTokens

    runs = {}
    for impl in ("fused", "reference"):
        teacher = make_teacher("llama-tied")
        student = build_student(teacher, 16, seed=0)
        objective = CloneObjective(teacher, student, RecipeArgs(recipe=recipe, temperature=2.0), loss_impl=impl)
        args = TrainArgs(tokens=10 * 4 * SEQ, batch_size=4, micro_batch_size=2, lr=3e-3, warmup=0.1, log_every=1,
                         threads=1, progress=False, ckpt_dir=tmp_path / f"{impl}.ckpt")
        summary = train(objective, student, RandomTokens(rows=40), args, tmp_path / impl)
        losses = [json.loads(x)["loss"] for x in Path(summary["metrics"]).read_text().splitlines()]
        runs[impl] = losses, {n: p.detach().clone() for n, p in trainable_parameters(student)}
    (l1, w1), (l2, w2) = runs["fused"], runs["reference"]
    assert len(l1) == len(l2) == 10
    torch.testing.assert_close(torch.tensor(l1), torch.tensor(l2), **TOL)
    for name in w1:
        torch.testing.assert_close(w1[name], w2[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")
