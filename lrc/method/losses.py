"""The losses, one implementation each: next-token cross-entropy and forward KL.

Training (the `lrc` and `kl` recipes, LM pretraining and SFT, the plain-KD baseline) and
evaluation use these. All are computed in fp32.

Position convention (explicit, since the callers differ): position t predicts token t+1.
CE counts position t where ``loss_mask[t+1]``. KL compares two next-token distributions
at the positions it is given; :func:`kl_position_mask` says which count:

* ``"all"`` — all L positions, the LRC reference's (its KL includes the last position,
  which has no target); the last counts where ``loss_mask[L-1]``. The `lrc`/`kl` recipes.
* ``"next"`` — the L-1 positions that predict a token, counted where ``loss_mask[t+1]``;
  the caller passes logits ``[:, :-1]``. The plain-KD baseline and evaluation.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from lrc.names import KL_REDUCTIONS
from lrc.options import check_choice


def kl_per_position(teacher_logits: torch.Tensor, student_logits: torch.Tensor,
                    temperature: float = 1.0) -> torch.Tensor:
    """Forward KL(p_T ‖ p_S) of the temperature-softened distributions at each position [...]."""
    log_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    log_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    return (log_t.exp() * (log_t - log_s)).sum(-1)


def kl_divergence(teacher_logits, student_logits, temperature: float, mask=None, reduction: str = "batchmean"):
    """Forward KL over [B, L, V] logits, no T² factor, summed over the positions ``mask``
    counts (bool or 0/1 float, [B, L]; all when None). ``batchmean`` (the reference's)
    divides by the number of sequences, ``token`` by the number of counted positions."""
    check_choice("kl_reduction", reduction, KL_REDUCTIONS)
    per_pos = kl_per_position(teacher_logits, student_logits, temperature)  # [B, L]
    if mask is None:
        mask = torch.ones_like(per_pos, dtype=torch.bool)
    total = (per_pos * mask).sum()
    if reduction == "batchmean":
        return total / per_pos.shape[0]
    return total / mask.sum().clamp_min(1)


def kl_position_mask(loss_mask: torch.Tensor, positions: Literal["all", "next"]) -> torch.Tensor:
    """Which KL positions count, from a token loss mask [B, L] (see the module doc)."""
    check_choice("KL positions", positions, ("all", "next"))
    if positions == "next":
        return loss_mask[:, 1:]
    return torch.cat([loss_mask[:, 1:], loss_mask[:, -1:]], dim=1)


def next_token_nll(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """fp32 negative log-likelihood of token t+1 at each position t: [B, L-1]."""
    pred = logits[:, :-1].float()
    target = input_ids[:, 1:]
    return F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1), reduction="none").view_as(target)


def next_token_ce(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy over the counted targets (``loss_mask[t+1]``); a batch
    with no counted target gives 0, not NaN."""
    per_tok = next_token_nll(logits, input_ids)
    if loss_mask is None:
        return per_tok.mean()
    m = loss_mask[:, 1:].to(per_tok.dtype)
    return (per_tok * m).sum() / m.sum().clamp_min(1)
