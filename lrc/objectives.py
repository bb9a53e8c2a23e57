"""Training objectives that need no LRC machinery: language modelling and plain KD.

An objective maps a batch ``{"input_ids": [B, L] long, "loss_mask": [B, L] bool}`` and the
model as the training loop wraps it to ``(total, terms)``; ``terms`` are detached scalars
logged by name. The loss at position t predicts token t+1 and counts where
``loss_mask[t+1]`` is true (docs/architecture.md), so for chat data only answer tokens count.
The LRC recipes live in :class:`lrc.clone.CloneObjective`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lrc.errors import LRCError
from lrc.names import KL_REDUCTIONS


def next_token_targets(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets ``[B, L-1]`` and the float weight of each position (1 where counted)."""
    ids = batch["input_ids"]
    mask = batch.get("loss_mask")
    weight = torch.ones_like(ids[:, 1:], dtype=torch.float32) if mask is None else mask[:, 1:].to(torch.float32)
    return ids[:, 1:], weight


def masked_ce(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy (fp32) over the counted positions of the batch."""
    targets, weight = next_token_targets(batch)
    ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    # clamp: a micro-batch with no counted token contributes 0, not NaN.
    return (ce * weight.reshape(-1)).sum() / weight.sum().clamp_min(1.0)


class LMObjective:
    """Next-token cross-entropy on the counted tokens: pretraining (all tokens) and SFT (answers)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def loss(self, batch, model=None):
        model = model if model is not None else self.model
        logits = model(input_ids=batch["input_ids"]).logits
        ce = masked_ce(logits, batch)
        return ce, {"ce": ce.detach()}


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor, weight: torch.Tensor, *, temperature: float, reduction: str) -> torch.Tensor:
    """Forward KL(p_T || p_S) of temperature-softened next-token distributions, fp32.

    ``batchmean``: summed over counted positions and vocabulary, divided by the number of
    sequences (the LRC reference); ``token``: divided by the number of counted positions.
    No T^2 factor (as in the reference).
    """
    log_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1)  # [B, L]
    total = (kl * weight).sum()
    if reduction == "batchmean":
        return total / kl.shape[0]
    return total / weight.sum().clamp_min(1.0)


class KDObjective:
    """Plain knowledge distillation: a standard student trained only on the teacher's logits.

    The baseline of `lrc bench` (and usable as a recipe of its own). The frozen teacher runs
    under ``torch.inference_mode``; ``teacher`` is public so the training loop places it.
    """

    def __init__(self, teacher: torch.nn.Module, student: torch.nn.Module, *, temperature: float = 40.0, kl_reduction: str = "batchmean"):
        if kl_reduction not in KL_REDUCTIONS:
            raise LRCError(f"unknown kl_reduction {kl_reduction!r}; choose one of: {', '.join(KL_REDUCTIONS)}")
        if temperature <= 0:
            raise LRCError(f"temperature must be > 0, got {temperature}")
        self.teacher = teacher.eval().requires_grad_(False)
        self.student = student
        self.temperature, self.kl_reduction = temperature, kl_reduction

    def loss(self, batch, model=None):
        model = model if model is not None else self.student
        with torch.inference_mode():
            teacher_logits = self.teacher(input_ids=batch["input_ids"]).logits[:, :-1]
        # inference tensors cannot enter autograd; a plain clone can (and is cheap next to the forward).
        teacher_logits = teacher_logits.clone()
        student_logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
        _, weight = next_token_targets(batch)
        kl = kl_to_teacher(student_logits, teacher_logits, weight, temperature=self.temperature, reduction=self.kl_reduction)
        return kl, {"kl": kl.detach()}
