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
  copy in the other arms, :func:`lrc.reach.down_clone_map`). The target is computed in a hook
  on the student's MLP, inside the layer's forward, where FSDP2 has gathered the factor.

KL and CE are :mod:`lrc.losses`' (forward KL at temperature T, no T² factor,
``batchmean`` by default as the reference; fp32 next-token CE). The KL counts all L
positions (``positions="all"``, the reference's), the CE the L-1 that have a target.
``loss_impl="fused"`` (default) computes the same two from the final hidden states and head
weights chunk by chunk (:mod:`lrc.fused_loss`; the teacher runs its body only), so no
``[B, L, V]`` logits exist; ``"reference"`` is the dense path on the logits.

The teacher runs under ``torch.inference_mode``; its captured tensors are cloned out of
inference mode before they meet autograd.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from lrc.errors import LRCError
from lrc.fused_loss import LOSS_IMPLS, fused_ce_kl, head_weight, hidden_and_head
from lrc.losses import kl_divergence, kl_position_mask, next_token_ce
from lrc.names import KL_REDUCTIONS, RECIPES
from lrc.options import check_choice
from lrc.reach import down_clone_map

CLONE_TERMS = ("q", "k", "v", "attn_out", "gate", "up", "mlp_out")


@dataclass(kw_only=True)
class RecipeArgs:
    """Loss recipe. ``kl``: logit KL only (ce_weight 0, no clone terms) unless overridden."""

    recipe: Literal["lrc", "kl"] = field(default="lrc", metadata={"help": "lrc = CE + KL + alpha * clone MSE; kl = logit KL only"})
    alpha: float = field(default=0.2, metadata={"help": "weight of the summed clone MSE terms"})
    temperature: float = field(default=40.0, metadata={"help": "KL temperature (no T^2 factor)"})
    kl_reduction: Literal["batchmean", "token"] = field(default="batchmean", metadata={"help": "batchmean: sum / sequences (reference); token: per-token mean"})
    ce_weight: float | None = field(default=None, metadata={"help": "weight of CE (default: 1 for lrc, 0 for kl)"})
    kl_weight: float = field(default=1.0, metadata={"help": "weight of the KL term"})
    clone_terms: list[str] | None = field(default=None, metadata={"help": f"clone terms to use (default: all for lrc, none for kl); any of {', '.join(CLONE_TERMS)}"})
    clone_layers: list[int] | None = field(default=None, metadata={"help": "layers whose clone terms count (default: all)"})

    def __post_init__(self):
        check_choice("recipe", self.recipe, RECIPES)
        check_choice("kl_reduction", self.kl_reduction, KL_REDUCTIONS)
        if not self.temperature > 0:
            raise LRCError(f"temperature must be positive, got {self.temperature!r}")
        if self.ce_weight is None:
            self.ce_weight = 1.0 if self.recipe == "lrc" else 0.0
        if self.clone_terms is None:
            self.clone_terms = list(CLONE_TERMS) if self.recipe == "lrc" else []
        bad = [t for t in self.clone_terms if t not in CLONE_TERMS]
        if bad:
            raise LRCError(f"unknown clone term(s) {bad}; choose from: {', '.join(CLONE_TERMS)}")


class _Capture:
    """Forward hooks that record module inputs/outputs into a dict while active."""

    def __init__(self):
        self.store: dict[tuple[int, str], torch.Tensor] = {}
        self.active = False
        self.handles = []

    def output(self, module, key):
        def hook(_mod, _args, out):
            if self.active:
                self.store[key] = out[0] if isinstance(out, tuple) else out

        self.handles.append(module.register_forward_hook(hook))

    def input(self, module, key):
        def hook(_mod, args):
            if self.active:
                self.store[key] = args[0]

        self.handles.append(module.register_forward_pre_hook(hook))

    def mlp_out(self, mlp, key, teacher_acts):
        """The student MLP's output, and its target ``P_down · (teacher MLP output)`` computed here,
        inside the layer's forward: under FSDP2 the layer's parameters are gathered only then,
        and P_down is the live (sharded) factor in `slice`. Same operation as after the forward."""
        def hook(_mod, _args, out):
            if self.active:
                self.store[key] = out
                p_down = down_clone_map(mlp)
                self.store[key + ("target",)] = F.linear(teacher_acts[key].to(p_down.dtype), p_down)

        self.handles.append(mlp.register_forward_hook(hook))

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles.clear()


def _hook_model(cap: _Capture, model, layers, terms, student: bool, teacher_acts: dict | None = None) -> None:
    for i in layers:
        layer = model.model.layers[i]
        attn, mlp = layer.self_attn, layer.mlp
        for t in ("q", "k", "v"):
            if t in terms:
                cap.output(getattr(attn, f"{t}_proj"), (i, t))
        if "attn_out" in terms:
            (cap.input if student else cap.output)(attn.o_proj, (i, "attn_out"))
        for t in ("gate", "up"):
            if t in terms:
                cap.output(getattr(mlp, f"{t}_proj"), (i, t))
        if "mlp_out" in terms and student:
            cap.mlp_out(mlp, (i, "mlp_out"), teacher_acts)
        elif "mlp_out" in terms:
            cap.output(mlp, (i, "mlp_out"))


class CloneObjective:
    """``loss(batch, model=None) -> (total, terms)`` for a teacher/student pair and a recipe."""

    def __init__(self, teacher, student, recipe: RecipeArgs, *, loss_impl: str = "fused"):
        if not isinstance(recipe, RecipeArgs):
            raise LRCError("CloneObjective needs a lrc.clone.RecipeArgs")
        check_choice("loss_impl", loss_impl, LOSS_IMPLS)
        self.loss_impl = loss_impl  # CE + KL: "fused" (chunked, lrc.fused_loss) or "reference" (lrc.losses on logits)
        # The teacher arrives frozen: the student was built on it (lrc.hf, "Where the teacher is frozen").
        self.teacher, self.student, self.recipe = teacher, student, recipe
        n_layers = teacher.config.num_hidden_layers
        layers = list(range(n_layers)) if recipe.clone_layers is None else list(recipe.clone_layers)
        bad = [i for i in layers if not 0 <= i < n_layers]
        if bad:
            raise LRCError(f"clone_layers {bad} out of range for a {n_layers}-layer teacher")
        self.layers = layers
        self.terms = list(recipe.clone_terms)
        self._t, self._s = _Capture(), _Capture()
        self._t_acts: dict = {}  # the teacher's activations of the current batch (the student's mlp_out hook reads them)
        if self.terms:
            _hook_model(self._t, teacher, layers, self.terms, student=False)
            _hook_model(self._s, student, layers, self.terms, student=True, teacher_acts=self._t_acts)

    def close(self) -> None:
        """Remove the hooks (the objective is unusable afterwards)."""
        self._t.remove()
        self._s.remove()

    def _teacher_forward(self, input_ids):
        """The teacher's logits (reference) or final hidden states (fused: the body only, no
        head; the fused loss reads them under no_grad, so they stay inference tensors)."""
        self._t.store.clear()
        self._t.active = True
        try:
            with torch.inference_mode():
                if self.loss_impl == "fused":
                    out = self.teacher.model(input_ids=input_ids, use_cache=False).last_hidden_state
                else:
                    out = self.teacher(input_ids=input_ids, use_cache=False).logits
        finally:
            self._t.active = False
        # Out of inference mode, so these may be used by autograd (saved for backward).
        acts = {k: v.clone() for k, v in self._t.store.items()}
        self._t.store.clear()
        return (out.clone() if self.loss_impl == "reference" else out), acts

    def _student_forward(self, model, input_ids):
        """The student's logits (reference) or final hidden states (fused), through ``model``."""
        self._s.store.clear()
        self._s.active = True
        try:
            if self.loss_impl == "fused":
                out = hidden_and_head(model, input_ids)  # (hidden states, head weight)
            else:
                out = model(input_ids=input_ids, use_cache=False).logits
        finally:
            self._s.active = False
        acts = dict(self._s.store)
        self._s.store.clear()
        return out, acts

    def _ce_kl(self, model, t_out, s_out, input_ids, loss_mask):
        """(ce_weight·CE + kl_weight·KL, CE, KL) from logits or, fused, hidden states + heads."""
        r = self.recipe
        if self.loss_impl == "fused":
            return fused_ce_kl(
                *s_out, t_out, head_weight(self.teacher), input_ids, loss_mask,
                temperature=r.temperature, kl_positions="all", kl_reduction=r.kl_reduction, ce_weight=r.ce_weight, kl_weight=r.kl_weight,
            )
        ce = next_token_ce(s_out, input_ids, loss_mask)
        kl = kl_divergence(t_out, s_out, r.temperature, None if loss_mask is None else kl_position_mask(loss_mask, "all"), r.kl_reduction)
        return r.ce_weight * ce + r.kl_weight * kl, ce, kl

    def _clone_term(self, name, layer, s_act, t_act):
        if name == "attn_out":
            w_o = self.teacher.model.layers[layer].self_attn.o_proj.weight
            s_act = F.linear(s_act, w_o.to(s_act.dtype))
        return F.mse_loss(s_act.float(), t_act.float())

    def loss(self, batch, model=None):
        model = self.student if model is None else model
        input_ids = batch["input_ids"]
        loss_mask = batch.get("loss_mask")
        if loss_mask is not None:
            loss_mask = loss_mask.to(device=input_ids.device, dtype=torch.bool)
        r = self.recipe
        t_out, t_acts = self._teacher_forward(input_ids)
        self._t_acts.clear()
        self._t_acts.update(t_acts)
        try:
            s_out, s_acts = self._student_forward(model, input_ids)
        finally:
            self._t_acts.clear()
        t_acts |= {(i, "mlp_out"): s_acts.pop((i, "mlp_out", "target")) for i in self.layers if "mlp_out" in self.terms}
        total, ce, kl = self._ce_kl(model, t_out, s_out, input_ids, loss_mask)
        terms = {"ce": ce.detach(), "kl": kl.detach()}
        clone_sum = None
        for name in self.terms:
            per_term = sum(self._clone_term(name, i, s_acts[(i, name)], t_acts[(i, name)]) for i in self.layers)
            terms[name] = per_term.detach()
            clone_sum = per_term if clone_sum is None else clone_sum + per_term
        if clone_sum is not None:
            total = total + r.alpha * clone_sum
        return total, terms
