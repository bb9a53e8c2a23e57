"""The loss: KL and CE by hand, recipes, switchable terms, hooks on real modules."""

from __future__ import annotations

import math

import pytest
import torch

from lrc.errors import LRCError
from lrc.method.clone import CLONE_TERMS, CloneObjective, RecipeArgs
from lrc.method.losses import kl_divergence, next_token_ce
from lrc.method.reach import apply_arm, down_clone_map
from lrc.method.student import build_student, trainable_parameters
from tests.helpers import make_teacher


def hand_kl(t_logits, s_logits, temp, positions):
    total = 0.0
    for b, l in positions:
        zt = [x / temp for x in t_logits[b][l]]
        zs = [x / temp for x in s_logits[b][l]]
        lt = math.log(sum(math.exp(x) for x in zt))
        ls = math.log(sum(math.exp(x) for x in zs))
        for a, c in zip(zt, zs):
            p = math.exp(a - lt)
            total += p * ((a - lt) - (c - ls))
    return total


def test_kl_matches_a_hand_computation_with_both_reductions():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(2, 3, 5, generator=g, dtype=torch.float64) * 3
    s = torch.randn(2, 3, 5, generator=g, dtype=torch.float64) * 3
    tl, sl = t.tolist(), s.tolist()
    everywhere = [(b, l) for b in range(2) for l in range(3)]
    summed = hand_kl(tl, sl, 2.0, everywhere)
    assert kl_divergence(t, s, 2.0).item() == pytest.approx(summed / 2, rel=1e-6)  # / sequences
    assert kl_divergence(t, s, 2.0, reduction="token").item() == pytest.approx(summed / 6, rel=1e-6)
    mask = torch.tensor([[True, False, True], [False, False, True]])
    kept = [(0, 0), (0, 2), (1, 2)]
    assert kl_divergence(t, s, 2.0, mask).item() == pytest.approx(hand_kl(tl, sl, 2.0, kept) / 2, rel=1e-6)
    assert kl_divergence(t, s, 2.0, mask, "token").item() == pytest.approx(hand_kl(tl, sl, 2.0, kept) / 3, rel=1e-6)
    assert kl_divergence(t, t, 40.0).item() == pytest.approx(0.0, abs=1e-12)


def test_ce_counts_targets_where_the_mask_is_true():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 4, 7, generator=g)
    ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.tensor([[True, False, True, True]])  # targets 3 (pos 1->2) and 4 (pos 2->3) count
    logp = torch.log_softmax(logits, -1)
    want = -(logp[0, 1, 3] + logp[0, 2, 4]) / 2
    torch.testing.assert_close(next_token_ce(logits, ids, mask), want)
    want_all = -(logp[0, 0, 2] + logp[0, 1, 3] + logp[0, 2, 4]) / 3
    torch.testing.assert_close(next_token_ce(logits, ids), want_all)


def test_objective_total_is_the_weighted_sum_of_its_terms(token_batch):
    teacher = make_teacher("qwen2-untied")
    student = build_student(teacher, 16)
    recipe = RecipeArgs(alpha=0.5, temperature=3.0)
    total, terms = CloneObjective(teacher, student, recipe).loss({"input_ids": token_batch})
    assert set(terms) == {"ce", "kl", *CLONE_TERMS}
    assert all(not v.requires_grad for v in terms.values())
    want = terms["ce"] + terms["kl"] + 0.5 * sum(terms[n] for n in CLONE_TERMS)
    torch.testing.assert_close(total.detach(), want)
    # the KL term is the logit KL of the two models' forwards
    with torch.no_grad():
        kl = kl_divergence(teacher(input_ids=token_batch).logits, student(input_ids=token_batch).logits, 3.0)
    torch.testing.assert_close(terms["kl"], kl)


def test_clone_terms_are_the_definitions(token_batch):
    teacher = make_teacher("llama-untied")
    student = build_student(teacher, 16, seed=2)
    _, terms = CloneObjective(teacher, student, RecipeArgs(clone_layers=[1])).loss({"input_ids": token_batch})
    caps = {}

    def keep(name, fn):
        return lambda mod, args, out: caps.__setitem__(name, fn(args, out))

    hs = [
        teacher.model.layers[1].mlp.register_forward_hook(keep("t_mlp", lambda a, o: o)),
        student.model.layers[1].mlp.register_forward_hook(keep("s_mlp", lambda a, o: o)),
        teacher.model.layers[1].self_attn.o_proj.register_forward_hook(keep("t_o", lambda a, o: o)),
        student.model.layers[1].self_attn.o_proj.register_forward_hook(keep("s_heads", lambda a, o: a[0])),
    ]
    with torch.no_grad():
        teacher(input_ids=token_batch)
        student(input_ids=token_batch)
    for h in hs:
        h.remove()
    p_down = student.model.layers[1].mlp.down_proj.parametrizations.weight.original
    torch.testing.assert_close(terms["mlp_out"], ((caps["s_mlp"] - caps["t_mlp"] @ p_down.T) ** 2).mean().detach())
    w_o = teacher.model.layers[1].self_attn.o_proj.weight
    torch.testing.assert_close(terms["attn_out"], ((caps["s_heads"] @ w_o.T - caps["t_o"]) ** 2).mean())


def test_mlp_out_target_is_not_detached_through_p_down(token_batch):
    teacher = make_teacher("llama-tied")
    student = build_student(teacher, 16)
    recipe = RecipeArgs(clone_terms=["mlp_out"], ce_weight=0.0, kl_weight=0.0)
    total, terms = CloneObjective(teacher, student, recipe).loss({"input_ids": token_batch})
    assert set(terms) == {"ce", "kl", "mlp_out"}
    total.backward()
    p_down = student.model.layers[1].mlp.down_proj.parametrizations.weight.original
    # gradient through both the student output (B·T) and the target P_down·t
    assert p_down.grad is not None and p_down.grad.abs().sum() > 0
    assert student.model.layers[0].self_attn.q_proj.parametrizations.weight.original.grad.abs().sum() > 0


def test_kl_recipe_is_logit_kl_only(token_batch):
    teacher = make_teacher("llama-tied")
    student = build_student(teacher, 16)
    recipe = RecipeArgs(recipe="kl")
    total, terms = CloneObjective(teacher, student, recipe).loss({"input_ids": token_batch})
    assert set(terms) == {"ce", "kl"}
    torch.testing.assert_close(total.detach(), terms["kl"])


def test_gradients_reach_only_trainable_tensors_and_not_the_teacher(token_batch):
    teacher = make_teacher("qwen2-tied")
    student = build_student(teacher, 16)
    total, _ = CloneObjective(teacher, student, RecipeArgs()).loss({"input_ids": token_batch})
    total.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is not None for _, p in trainable_parameters(student))


def test_bad_recipe_values():
    with pytest.raises(LRCError, match="'sft'"):
        RecipeArgs(recipe="sft")
    with pytest.raises(LRCError, match="'mean'"):
        RecipeArgs(kl_reduction="mean")
    with pytest.raises(LRCError, match="'o'"):
        RecipeArgs(clone_terms=["q", "o"])
    teacher = make_teacher("llama-tied")
    with pytest.raises(LRCError, match="clone_layers"):
        CloneObjective(teacher, build_student(teacher, 16), RecipeArgs(clone_layers=[5]))
    with pytest.raises(LRCError, match="clone_layers is empty"):  # not a sum over no layers
        CloneObjective(teacher, build_student(teacher, 16), RecipeArgs(clone_layers=[]))
    CloneObjective(teacher, build_student(teacher, 16), RecipeArgs(clone_layers=[], clone_terms=[]))


def reference_clone_terms(teacher, student, ids, layers):
    """The clone terms as first written: every capture held to the end, then
    ``F.mse_loss(s.float(), t.float())`` per layer and term (the streamed terms' reference)."""
    caps, hooks = {}, []

    def out(mod, key):
        hooks.append(mod.register_forward_hook(lambda m, a, o: caps.__setitem__(key, o)))

    for i in layers:
        for side, model in (("t", teacher), ("s", student)):
            attn, mlp = model.model.layers[i].self_attn, model.model.layers[i].mlp
            for name in ("q", "k", "v", "gate", "up"):
                out(getattr(attn, f"{name}_proj", None) or getattr(mlp, f"{name}_proj"), (side, i, name))
            out(mlp, (side, i, "mlp_out"))
        out(teacher.model.layers[i].self_attn.o_proj, ("t", i, "attn_out"))
        hooks.append(student.model.layers[i].self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, i=i: caps.__setitem__(("s", i, "attn_out"), a[0])))
    with torch.no_grad():
        teacher(input_ids=ids)
    student(input_ids=ids)
    for h in hooks:
        h.remove()
    terms = {}
    for name in CLONE_TERMS:
        per_layer = []
        for i in layers:
            s, t = caps[("s", i, name)], caps[("t", i, name)]
            if name == "attn_out":
                s = torch.nn.functional.linear(s, teacher.model.layers[i].self_attn.o_proj.weight)
            if name == "mlp_out":
                t = torch.nn.functional.linear(t, down_clone_map(student.model.layers[i].mlp))
            per_layer.append(torch.nn.functional.mse_loss(s.float(), t.float()))
        terms[name] = sum(per_layer)
    return terms


def _grads(student, loss):
    params = [p for _, p in trainable_parameters(student)]
    return torch.autograd.grad(loss, params, allow_unused=True)


@pytest.mark.parametrize("kind,arm", [("llama-tied", "slice"), ("qwen2-untied", "slice"), ("llama-untied", "dense")])
def test_streamed_clone_terms_match_the_captured_ones_values_and_gradients(token_batch, kind, arm):
    teacher = make_teacher(kind)
    student = build_student(teacher, 16, seed=3)
    if arm != "slice":
        apply_arm(student, teacher, arm)
    with torch.no_grad():  # a student away from its init, so that every term is non-trivial
        for _, p in trainable_parameters(student):
            p.add_(torch.randn_like(p) * 0.05)
    recipe = RecipeArgs(ce_weight=0.0, kl_weight=0.0, alpha=1.0)
    total, terms = CloneObjective(teacher, student, recipe).loss({"input_ids": token_batch})
    ref = reference_clone_terms(teacher, student, token_batch, [0, 1])
    for name in CLONE_TERMS:
        torch.testing.assert_close(terms[name], ref[name].detach(), rtol=1e-5, atol=1e-7)
    got, want = _grads(student, total), _grads(student, sum(ref.values()))
    assert sum(w is not None for w in want) > 0
    for g, w in zip(got, want):  # (the 0-weighted CE and KL give zero, not absent, gradients)
        g = torch.zeros_like(w if w is not None else g) if g is None else g
        torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w, rtol=1e-5, atol=1e-8)


def test_teacher_ms_divides_each_layers_mse_by_its_targets_mean_square(token_batch):
    teacher = make_teacher("llama-tied")
    student = build_student(teacher, 16, seed=3)
    objective = CloneObjective(teacher, student,
                               RecipeArgs(clone_norm="teacher_ms", ce_weight=0.0, kl_weight=0.0, alpha=1.0))
    total, terms = objective.loss({"input_ids": token_batch})
    per_layer = objective.layer_terms()
    for name in CLONE_TERMS:
        want = sum(per_layer["mse"][(i, name)] / per_layer["target_ms"][(i, name)] for i in (0, 1))
        torch.testing.assert_close(terms[name], want)
    # the target's mean square, by hand, for one term; and the scale is detached in the gradient
    caps = {}
    h = teacher.model.layers[1].mlp.gate_proj.register_forward_hook(lambda m, a, o: caps.__setitem__("gate", o))
    with torch.no_grad():
        teacher(input_ids=token_batch)
    h.remove()
    torch.testing.assert_close(per_layer["target_ms"][(1, "gate")], caps["gate"].square().mean())
    raw = CloneObjective(teacher, student,
                         RecipeArgs(ce_weight=0.0, kl_weight=0.0, alpha=1.0, clone_terms=["gate"], clone_layers=[1]))
    raw_total, _ = raw.loss({"input_ids": token_batch})
    g_raw = student.model.layers[1].mlp.gate_proj.parametrizations.weight.original
    only_gate = CloneObjective(teacher, student, RecipeArgs(clone_norm="teacher_ms", ce_weight=0.0, kl_weight=0.0,
                                                            alpha=1.0, clone_terms=["gate"], clone_layers=[1]))
    norm_total, _ = only_gate.loss({"input_ids": token_batch})
    (a,) = torch.autograd.grad(raw_total, g_raw)
    (b,) = torch.autograd.grad(norm_total, g_raw)
    torch.testing.assert_close(b, a / per_layer["target_ms"][(1, "gate")])
    with pytest.raises(LRCError, match="clone_norm"):
        RecipeArgs(clone_norm="layer")


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``fn`` runs."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_streamed_terms_save_one_tensor_per_term(dtype):
    teacher = make_teacher("llama-tied")
    student = build_student(teacher, 16, seed=3)
    ids = torch.randint(0, 97, (2, 32), generator=torch.Generator().manual_seed(0))

    def cost(with_terms, without_terms):  # what the clone terms add to what the step saves
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            return _saved_bytes(with_terms) - _saved_bytes(without_terms)

    streamed = cost(lambda: CloneObjective(teacher, student, RecipeArgs()).loss({"input_ids": ids}),
                    lambda: CloneObjective(teacher, student, RecipeArgs(clone_terms=[])).loss({"input_ids": ids}))
    captured = cost(lambda: reference_clone_terms(teacher, student, ids, [0, 1]), lambda: student(input_ids=ids))
    # one s - t per term and layer, in the compute dtype, plus the teacher MLP output P_down's gradient needs
    elem = torch.finfo(dtype).bits // 8
    widths = 2 * (32 + 16 + 16 + 32 + 96 + 96 + 16) + 2 * 32
    assert streamed <= 2 * 32 * widths * elem + 2 * 32 * 2 * 32 * 4, (streamed, captured)
    assert streamed < (0.5 if dtype == torch.bfloat16 else 1.0) * captured, (streamed, captured)
