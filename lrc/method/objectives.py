"""Training objectives that need no LRC machinery: language modelling and plain KD.

An objective maps a batch ``{"input_ids": [B, L] long, "loss_mask": [B, L] bool}`` and the
model as the training loop wraps it to ``(total, terms)``; ``terms`` are detached scalars
logged by name. The loss at position t predicts token t+1 and counts where
``loss_mask[t+1]`` is true (docs/architecture.md), so for chat data only answer tokens count.
The LRC recipes live in :class:`lrc.method.clone.CloneObjective`.
"""

from __future__ import annotations

import torch

from lrc.errors import LRCError
from lrc.io.hf import freeze_teacher
from lrc.method.fused_loss import LOSS_IMPLS, fused_ce_kl, head_weight, hidden_and_head
from lrc.method.losses import kl_divergence, kl_position_mask, next_token_ce
from lrc.names import KL_REDUCTIONS
from lrc.options import check_choice


def masked_ce(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy (fp32) over the counted positions of the batch."""
    return next_token_ce(logits, batch["input_ids"], batch.get("loss_mask"))


class LMObjective:
    """Next-token cross-entropy on the counted tokens: pretraining (all tokens) and SFT (answers)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def loss(self, batch, model=None):
        model = model if model is not None else self.model
        logits = model(input_ids=batch["input_ids"]).logits
        ce = masked_ce(logits, batch)
        return ce, {"ce": ce.detach()}


class KDObjective:
    """Plain knowledge distillation: a standard student trained only on the teacher's logits.

    The baseline of `lrc bench` (and usable as a recipe of its own). The frozen teacher runs
    under ``torch.inference_mode``; ``teacher`` is public so the training loop places it.
    ``loss_impl="fused"`` (default): the KL from hidden states and head weights, chunked
    (:mod:`lrc.method.fused_loss`, no ``[B, L, V]`` logits); ``"reference"``: on the logits (the tests' oracle).
    """

    def __init__(self, teacher: torch.nn.Module, student: torch.nn.Module, *, temperature: float = 40.0,
                 kl_reduction: str = "batchmean", loss_impl: str = "fused"):
        if kl_reduction not in KL_REDUCTIONS:
            raise LRCError(f"unknown kl_reduction {kl_reduction!r}; choose one of: {', '.join(KL_REDUCTIONS)}")
        if temperature <= 0:
            raise LRCError(f"temperature must be > 0, got {temperature}")
        self.teacher = freeze_teacher(teacher)  # no LRC student here to have frozen it (lrc.io.hf)
        self.student = student
        check_choice("loss_impl", loss_impl, LOSS_IMPLS)
        self.temperature, self.kl_reduction, self.loss_impl = temperature, kl_reduction, loss_impl

    def loss(self, batch, model=None):
        model = model if model is not None else self.student
        if self.loss_impl == "fused":
            return self._fused_loss(batch, model)
        with torch.inference_mode():
            teacher_logits = self.teacher(input_ids=batch["input_ids"]).logits[:, :-1]
        # inference tensors cannot enter autograd; a plain clone can (and is cheap next to the forward).
        teacher_logits = teacher_logits.clone()
        student_logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
        ids = batch["input_ids"]
        mask = batch.get("loss_mask")
        counted = kl_position_mask(torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool(), "next")
        kl = kl_divergence(teacher_logits, student_logits, self.temperature, counted, self.kl_reduction)
        return kl, {"kl": kl.detach()}

    def _fused_loss(self, batch, model):
        ids = batch["input_ids"]
        with torch.inference_mode():  # the body only: no teacher logits; read under no_grad by the fused loss
            t_hidden = self.teacher.model(input_ids=ids, use_cache=False).last_hidden_state
        mask = batch.get("loss_mask")
        total, _, kl = fused_ce_kl(
            *hidden_and_head(model, ids), t_hidden, head_weight(self.teacher), ids,
            None if mask is None else mask.bool(), temperature=self.temperature, kl_positions="next",
            kl_reduction=self.kl_reduction, ce_weight=0.0, kl_weight=1.0,
        )
        return total, {"kl": kl}  # total = 1·KL + 0·CE: the KL, with its gradient
