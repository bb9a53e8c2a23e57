"""The distillation objective: the `lrc` recipe (CE + KL + α·clone MSE) and the `kl` recipe.

METHOD.md §1 "Loss". Activations are captured by forward hooks on the real modules of
teacher and student (no copy of modeling code); teacher and student run on their own
residual streams, in lockstep. Per layer l (summed over layers, each an element mean):

* ``q``, ``k``, ``v``: q/k/v_proj outputs (with Qwen2's bias, before RoPE), teacher width.
* ``attn_out``: the teacher's o_proj weight applied to the student's o_proj *input* (its
  attention heads output) vs the teacher's o_proj output, width H.
* ``gate``, ``up``: pre-activation outputs, width d_ff.
* ``mlp_out``: the student's MLP output vs ``P_down · (teacher MLP output)``, width r. The
  target is not detached through P_down (the live factor in `slice`; a frozen warm-start
  copy in the other arms, :func:`lrc.method.reach.down_clone_map`). The target is computed in a hook
  on the student's MLP, inside the layer's forward, where FSDP2 has gathered the factor.

KL and CE are :mod:`lrc.method.losses`' (forward KL at temperature T, no T² factor,
``batchmean`` by default as the reference; fp32 next-token CE). The KL counts all L
positions (``positions="all"``, the reference's), the CE the L-1 that have a target.
They are computed from the final hidden states and head weights chunk by chunk
(:mod:`lrc.method.fused_loss`; the teacher runs its body only), so no ``[B, L, V]`` logits exist.
The dense path on the logits stays as the tests' oracle only: ``CloneObjective(..., loss_impl="reference")``
(not a recipe field nor a command-line option).

Streamed terms: the teacher runs first (under ``torch.inference_mode``) and its captures
wait in a dict; each term of a layer is computed in a hook on the student as soon as the
student's side exists, and the teacher's capture is dropped then. A term saves one tensor
for backward, ``s - t`` in the compute dtype (its sum of squares is accumulated in fp32),
not fp32 copies of both sides (``F.mse_loss(s.float(), t.float())``); the mlp_out target
also keeps the teacher MLP output when P_down trains (`slice`).
Under activation checkpointing (:mod:`lrc.training.recompute`), by default, a term is computed in the
layer's original forward only (the hooks are off when backward reruns the layer) and keeps that
tensor outside the checkpoint (:func:`saved_as_is`): added once, and no teacher capture
waits for the backward. Those tensors and the captures waiting for the student together
hold every term's width per token and layer (40,288 values at Llama-3.1-8B's widths and
r 1376, about 15 GiB at micro-batch 3, docs/planner.md). ``--recompute-teacher`` (a train
option, with checkpointing) keeps instead the teacher layers' inputs (width H: their calls,
recorded by pre-hooks in the teacher's forward), and the first term of a student layer
reruns the teacher's layer on its input; the terms are then computed inside the
checkpoint, so the recompute reruns the teacher's layer and the terms too (the call's last
use), and their saved tensors live one layer at a time. The values are bitwise the same;
the cost is two more forwards of the teacher's layers per micro-batch. One graph at a time:
a second loss before the first's backward (or a second backward of one graph) makes the
checkpoint's recompute find other saved tensors and raise ``CheckpointError``.

``clone_norm: teacher_ms`` divides each layer's MSE by its target's mean square (detached):
on a real teacher the raw terms span orders of magnitude across terms and layers (massive
activations), docs/method.md "Clone-term scale". The default ``none`` is the reference's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from lrc.errors import LRCError
from lrc.method.fused_loss import LOSS_IMPLS, fused_ce_kl, head_weight, hidden_and_head
from lrc.method.losses import kl_divergence, kl_position_mask, next_token_ce
from lrc.method.reach import down_clone_map
from lrc.names import KL_REDUCTIONS, RECIPES
from lrc.options import check_choice

CLONE_TERMS = ("q", "k", "v", "attn_out", "gate", "up", "mlp_out")
CLONE_NORMS = ("none", "teacher_ms")


@dataclass(kw_only=True)
class RecipeArgs:
    """Loss recipe. ``kl``: logit KL only (ce_weight 0, no clone terms) unless overridden."""

    recipe: Literal["lrc", "kl"] = field(default="lrc", metadata={
        "help": "lrc = CE + KL + alpha * clone MSE; kl = logit KL only"})
    alpha: float = field(default=0.2, metadata={"help": "weight of the summed clone MSE terms"})
    temperature: float = field(default=40.0, metadata={"help": "KL temperature (no T^2 factor)"})
    kl_reduction: Literal["batchmean", "token"] = field(default="batchmean", metadata={
        "help": "batchmean: sum / sequences (reference); token: per-token mean"})
    ce_weight: float | None = field(default=None, metadata={"help": "weight of CE (default: 1 for lrc, 0 for kl)"})
    kl_weight: float = field(default=1.0, metadata={"help": "weight of the KL term"})
    clone_terms: list[str] | None = field(default=None, metadata={
        "help": f"clone terms to use (default: all for lrc, none for kl); any of {', '.join(CLONE_TERMS)}"})
    clone_layers: list[int] | None = field(default=None, metadata={
        "help": "layers whose clone terms count (default: all)"})
    clone_norm: Literal["none", "teacher_ms"] = field(default="none", metadata={
        "help": "none: each clone term is the plain MSE (the reference); teacher_ms: each layer's MSE divided by its "
                "target's mean square (detached): a relative error per layer and term, whatever its activation scale "
                "(massive activations)"})

    def __post_init__(self):
        check_choice("recipe", self.recipe, RECIPES)
        check_choice("kl_reduction", self.kl_reduction, KL_REDUCTIONS)
        check_choice("clone_norm", self.clone_norm, CLONE_NORMS)
        if not self.temperature > 0:
            raise LRCError(f"temperature must be positive, got {self.temperature!r}")
        if self.ce_weight is None:
            self.ce_weight = 1.0 if self.recipe == "lrc" else 0.0
        if self.clone_terms is None:
            self.clone_terms = list(CLONE_TERMS) if self.recipe == "lrc" else []
        bad = [t for t in self.clone_terms if t not in CLONE_TERMS]
        if bad:
            raise LRCError(f"unknown clone term(s) {bad}; choose from: {', '.join(CLONE_TERMS)}")


def _taken(d: dict) -> dict:
    """``d``'s items, moved out (``d`` left empty)."""
    items = dict(d)
    d.clear()
    return items


class _Capture:
    """Forward hooks on the teacher that record module outputs into a dict while ``active``,
    and (``recompute_teacher``) each clone layer's call, its inputs, while ``keep_calls``."""

    def __init__(self):
        self.store: dict[tuple[int, str], torch.Tensor] = {}
        self.calls: dict[int, tuple] = {}
        self.active = self.keep_calls = False
        self.handles = []

    def call(self, layer, i):
        def hook(_mod, args, kwargs):
            if self.keep_calls:
                self.calls[i] = (args, kwargs)

        self.handles.append(layer.register_forward_pre_hook(hook, with_kwargs=True))

    def output(self, module, key):
        def hook(_mod, _args, out):
            if self.active:
                self.store[key] = out[0] if isinstance(out, tuple) else out

        self.handles.append(module.register_forward_hook(hook))

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles.clear()


def _hook_teacher(cap: _Capture, model, layers, terms) -> None:
    """The teacher's side of each term: the module outputs (o_proj's for attn_out)."""
    for i in layers:
        attn, mlp = model.model.layers[i].self_attn, model.model.layers[i].mlp
        modules = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj, "attn_out": attn.o_proj,
                   "gate": mlp.gate_proj, "up": mlp.up_proj, "mlp_out": mlp}
        for t in terms:
            cap.output(modules[t], (i, t))
        cap.call(model.model.layers[i], i)


class _SquaredErrorSum(torch.autograd.Function):
    """``sum((s - t)²)`` accumulated in fp32, saving only ``s - t`` (in ``s``'s dtype) for backward.

    ``F.mse_loss(s.float(), t.float())`` would save fp32 copies of both sides; the teacher
    side need not be kept at all (an inference tensor may enter: it is never saved)."""

    @staticmethod
    def forward(ctx, s, t):
        diff = s - t.to(s.dtype)
        ctx.save_for_backward(diff)
        ctx.t_dtype = t.dtype
        return diff.float().square().sum()

    @staticmethod
    def backward(ctx, grad):
        (diff,) = ctx.saved_tensors
        g = diff * (2 * grad).to(diff.dtype)
        g_t = -g.to(ctx.t_dtype) if ctx.needs_input_grad[1] else None
        return (g if ctx.needs_input_grad[0] else None), g_t


def _as_is(t):
    return t


def saved_as_is():
    """Tensors autograd saves in this context are kept as they are, whatever saved-tensor
    hooks are active around it. Under activation checkpointing (:mod:`lrc.training.recompute`) the
    checkpoint's hooks would drop what a clone term saves and rerun the layer to get it
    back; by default the term is computed once, in the original forward (the hooks are off
    in the recompute), so its one saved tensor is kept instead: the same memory as without
    checkpointing, no teacher activation needed in backward, nothing added twice."""
    return torch.autograd.graph.saved_tensors_hooks(_as_is, _as_is)


def _runs_checkpointed(layer) -> bool:
    """transformers' condition for a decoder layer's checkpoint: ``gradient_checkpointing``
    set (by :mod:`lrc.training.recompute`), training, gradients on."""
    return bool(getattr(layer, "gradient_checkpointing", False) and layer.training and torch.is_grad_enabled())


def _kept_outside_checkpoint(layer):
    """:func:`saved_as_is` while ``layer`` runs checkpointed, else nothing to change."""
    return saved_as_is() if _runs_checkpointed(layer) else contextlib.nullcontext()


class _StudentTerms:
    """Hooks on the student that compute each clone term of a layer as soon as its student side
    exists, against the teacher's capture (popped from ``teacher_acts``, so freed once used).

    ``values[(layer, term)]``: the term as it enters the loss (the MSE, divided by the target's
    detached mean square under ``clone_norm: teacher_ms``); ``raw`` and ``target_ms``: the
    plain MSE and the target's mean square, detached (diagnostics)."""

    def __init__(self, teacher, norm: str, rerun_teacher_layer):
        self.teacher, self.norm = teacher, norm
        self.teacher_acts: dict = {}
        # recompute_teacher: each teacher layer's call, kept from the teacher's forward until the
        # student layer's recompute, and the function that reruns it (-> that layer's captures)
        self.interleaved = False
        self.calls: dict = {}
        self.rerun_teacher_layer = rerun_teacher_layer
        self.values: dict = {}
        self.raw: dict = {}
        self.target_ms: dict = {}
        self.active = False
        self.handles = []
        self.layers = None  # the student's decoder layers (is one checkpointed?)

    def _kept(self, key):
        # recompute_teacher: what a term saves is dropped by the checkpoint and recomputed with the layer
        return contextlib.nullcontext() if self.interleaved else _kept_outside_checkpoint(self.layers[key[0]])

    def _live(self, key):
        """In the student's forward, or (recompute_teacher) in the recompute of a layer whose terms
        were computed in it: the recompute reruns a term's ops to rebuild what its backward saved."""
        return self.active or key[0] in self.calls or key in self.teacher_acts

    def _target(self, key):
        """The teacher's side of ``key``, popped. Under recompute_teacher the teacher's layer
        runs here, at the first term of the student's layer, in its forward and its recompute
        (the last use of the layer's call)."""
        if key not in self.teacher_acts and key[0] in self.calls:
            call = self.calls[key[0]] if self.active else self.calls.pop(key[0])
            self.teacher_acts.update(self.rerun_teacher_layer(key[0], call))
        return self.teacher_acts.pop(key)

    def clear(self):
        for d in (self.teacher_acts, self.calls, self.values, self.raw, self.target_ms):
            d.clear()

    def _record(self, key, s, t):
        mse = _SquaredErrorSum.apply(s, t) / s.numel()
        ms = t.detach().float().square().mean()
        # teacher_ms: a relative error, whatever the layer's activation scale (docs/method.md, "Clone-term scale")
        value = mse / ms.clamp_min(torch.finfo(torch.float32).tiny) if self.norm == "teacher_ms" else mse
        if self.active:  # a recompute only rebuilds what backward saved
            self.raw[key], self.target_ms[key], self.values[key] = mse.detach(), ms, value

    def output(self, module, key):
        def hook(_mod, _args, out):
            if self._live(key):
                with self._kept(key):
                    self._record(key, out, self._target(key))

        self.handles.append(module.register_forward_hook(hook))

    def attn_out(self, o_proj, key):
        """The teacher's o_proj weight applied to the student's o_proj input (its heads output)."""
        w_o = self.teacher.model.layers[key[0]].self_attn.o_proj.weight

        def hook(_mod, args):
            if self._live(key):
                with self._kept(key):
                    self._record(key, F.linear(args[0], w_o.to(args[0].dtype)), self._target(key))

        self.handles.append(o_proj.register_forward_pre_hook(hook))

    def mlp_out(self, mlp, key):
        """The student MLP's output vs ``P_down · (teacher MLP output)``, computed here, inside the
        layer's forward: under FSDP2 the layer's parameters are gathered only then, and P_down
        is the live (sharded) factor in `slice`."""
        def hook(_mod, _args, out):
            if self._live(key):
                p_down = down_clone_map(mlp)
                t = self._target(key).to(p_down.dtype)
                # F.linear saves its input when P_down trains; an inference tensor cannot be saved.
                t = t.clone() if p_down.requires_grad and t.is_inference() else t
                with self._kept(key):
                    self._record(key, out, F.linear(t, p_down))

        self.handles.append(mlp.register_forward_hook(hook))

    def hook(self, model, layers, terms) -> None:
        self.layers = model.model.layers
        for i in layers:
            attn, mlp = model.model.layers[i].self_attn, model.model.layers[i].mlp
            for t in ("q", "k", "v"):
                if t in terms:
                    self.output(getattr(attn, f"{t}_proj"), (i, t))
            if "attn_out" in terms:
                self.attn_out(attn.o_proj, (i, "attn_out"))
            for t in ("gate", "up"):
                if t in terms:
                    self.output(getattr(mlp, f"{t}_proj"), (i, t))
            if "mlp_out" in terms:
                self.mlp_out(mlp, (i, "mlp_out"))

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles.clear()


class CloneObjective:
    """``loss(batch, model=None) -> (total, terms)`` for a teacher/student pair and a recipe."""

    def __init__(self, teacher, student, recipe: RecipeArgs, *, loss_impl: str = "fused",
                 recompute_teacher: bool = False):
        if not isinstance(recipe, RecipeArgs):
            raise LRCError("CloneObjective needs a lrc.method.clone.RecipeArgs")
        check_choice("loss_impl", loss_impl, LOSS_IMPLS)
        # CE + KL: "fused" (chunked, lrc.method.fused_loss); "reference" (lrc.method.losses on the logits)
        # is the tests' oracle, reached only through this keyword
        self.loss_impl = loss_impl
        # --recompute-teacher: rerun the teacher's layers inside the student's, when those run checkpointed (module doc)
        self.recompute_teacher = recompute_teacher
        # The teacher arrives frozen: the student was built on it (lrc.io.hf, "Where the teacher is frozen").
        self.teacher, self.student, self.recipe = teacher, student, recipe
        n_layers = teacher.config.num_hidden_layers
        layers = list(range(n_layers)) if recipe.clone_layers is None else list(recipe.clone_layers)
        bad = [i for i in layers if not 0 <= i < n_layers]
        if bad:
            raise LRCError(f"clone_layers {bad} out of range for a {n_layers}-layer teacher")
        if recipe.clone_terms and not layers:
            raise LRCError("clone_layers is empty while clone_terms are set; for no clone terms set clone_terms: []")
        self.layers = layers
        self.terms = list(recipe.clone_terms)
        self._t = _Capture()
        self._s = _StudentTerms(teacher, recipe.clone_norm, self._teacher_layer)
        if self.terms:
            _hook_teacher(self._t, teacher, layers, self.terms)
            self._s.hook(student, layers, self.terms)

    def close(self) -> None:
        """Remove the hooks (the objective is unusable afterwards)."""
        self._t.remove()
        self._s.remove()

    def layer_terms(self) -> dict[str, dict[tuple[int, str], torch.Tensor]]:
        """The last batch's clone terms per (layer, term), detached: ``value`` (as in the loss),
        ``mse`` (unnormalised) and ``target_ms`` (the target's mean square)."""
        return {"value": {k: v.detach() for k, v in self._s.values.items()}, "mse": dict(self._s.raw),
                "target_ms": dict(self._s.target_ms)}

    def _teacher_forward(self, input_ids, keep_calls: bool = False):
        """The teacher's logits (reference) or final hidden states (fused: the body only, no
        head; the fused loss reads them under no_grad, so they stay inference tensors), with
        its captures, or (``keep_calls``, recompute_teacher) its clone layers' calls instead."""
        self._t.store.clear()
        self._t.calls.clear()
        self._t.active, self._t.keep_calls = not keep_calls, keep_calls
        try:
            with torch.inference_mode():
                if self.loss_impl == "fused":
                    out = self.teacher.model(input_ids=input_ids, use_cache=False).last_hidden_state
                else:
                    out = self.teacher(input_ids=input_ids, use_cache=False).logits
        finally:
            self._t.active = self._t.keep_calls = False
        # Kept as inference tensors: the clone terms never save them (_SquaredErrorSum), and
        # the one that may (mlp_out's target in `slice`) clones its own.
        return (out.clone() if self.loss_impl == "reference" else out), _taken(self._t.store), _taken(self._t.calls)

    def _teacher_layer(self, i, call):
        """recompute_teacher: teacher layer ``i`` run again on its kept call -> its captures."""
        args, kwargs = call
        self._t.active = True
        try:
            with torch.inference_mode():
                self.teacher.model.layers[i](*args, **kwargs)
        finally:
            self._t.active = False
        return _taken(self._t.store)

    def _student_forward(self, model, input_ids):
        """The student's logits (reference) or final hidden states (fused), through ``model``."""
        self._s.active = True
        try:
            if self.loss_impl == "fused":
                out = hidden_and_head(model, input_ids)  # (hidden states, head weight)
            else:
                out = model(input_ids=input_ids, use_cache=False).logits
        finally:
            self._s.active = False
        return out

    def _ce_kl(self, model, t_out, s_out, input_ids, loss_mask):
        """(ce_weight·CE + kl_weight·KL, CE, KL) from logits or, fused, hidden states + heads."""
        r = self.recipe
        if self.loss_impl == "fused":
            return fused_ce_kl(
                *s_out, t_out, head_weight(self.teacher), input_ids, loss_mask,
                temperature=r.temperature, kl_positions="all", kl_reduction=r.kl_reduction,
                ce_weight=r.ce_weight, kl_weight=r.kl_weight,
            )
        ce = next_token_ce(s_out, input_ids, loss_mask)
        kl = kl_divergence(t_out, s_out, r.temperature,
                           None if loss_mask is None else kl_position_mask(loss_mask, "all"), r.kl_reduction)
        return r.ce_weight * ce + r.kl_weight * kl, ce, kl

    def loss(self, batch, model=None):
        model = self.student if model is None else model
        input_ids = batch["input_ids"]
        loss_mask = batch.get("loss_mask")
        if loss_mask is not None:
            loss_mask = loss_mask.to(device=input_ids.device, dtype=torch.bool)
        r = self.recipe
        rerun = (self.recompute_teacher and bool(self.terms)
                 and _runs_checkpointed(self.student.model.layers[self.layers[0]]))
        # first: what a loss without backward left (its teacher calls) is not alive in this teacher forward
        self._s.clear()
        t_out, t_acts, calls = self._teacher_forward(input_ids, keep_calls=rerun)
        self._s.interleaved = rerun
        self._s.teacher_acts.update(t_acts)
        self._s.calls.update(calls)
        del t_acts, calls  # each capture is freed once its term is computed, in the student's forward
        try:
            s_out = self._student_forward(model, input_ids)
        finally:
            self._s.teacher_acts.clear()
        total, ce, kl = self._ce_kl(model, t_out, s_out, input_ids, loss_mask)
        terms = {"ce": ce.detach(), "kl": kl.detach()}
        clone_sum = None
        for name in self.terms:
            per_term = sum(self._s.values[(i, name)] for i in self.layers)
            terms[name] = per_term.detach()
            clone_sum = per_term if clone_sum is None else clone_sum + per_term
        self._s.values = {k: v.detach() for k, v in self._s.values.items()}  # the graph is the loss's alone
        if clone_sum is not None:
            total = total + r.alpha * clone_sum
        return total, terms
