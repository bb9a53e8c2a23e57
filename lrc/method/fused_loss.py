"""Next-token CE + forward KL fused with the head, chunked over positions: no ``[B, L, V]``.

The same losses as :mod:`lrc.method.losses` (the reference, kept as the tests' oracle: the
objectives' ``loss_impl="reference"``), computed from the final hidden states and the head
weights of student and teacher (their hidden sizes differ) a chunk of positions at a time.
Each chunk's logits, log-softmaxes and gradient live only while that chunk is processed, so
the largest vocabulary-sized tensor is ``[chunk_rows, V]``; the dense path holds several
``[B, L, V]`` (teacher and student logits, the teacher's clone, the fp32 log-softmaxes and
their gradients).

How the gradient is computed: a ``torch.autograd.Function`` whose forward also computes the
gradient of the weighted total with respect to the student's hidden states and head weight,
chunk by chunk, in closed form (``softmax - onehot`` for CE, ``(softmax(z/T) - p_T)/T`` for
KL); backward only scales them by the incoming gradient. The alternative, checkpointing
each chunk, runs the two vocabulary products of a chunk twice (forward and recompute) and
keeps an autograd graph per chunk; the closed form runs the four products of the dense path
(student and teacher logits, ``dL/dh``, ``dL/dW``) once. Cost: ``dL/dW`` ([V, r], fp32) is
held from the forward to the backward, the size of one head weight.

The normalisation is the recipe's (:mod:`lrc.method.losses`' position convention): CE is the mean
over the targets ``loss_mask[t+1]`` counts; KL is summed over the positions
``kl_position_mask(mask, "all" | "next")`` counts and divided by the number of sequences
(``batchmean``) or of counted positions (``token``); the total is ``ce_weight·CE +
kl_weight·KL``. Only the total carries a gradient; CE and KL come back detached (logged).

Why not Liger-Kernel's ``liger_kernel.chunked_loss`` (on the package index, 0.8.5;
``LigerFusedLinearJSDLoss`` with beta 0 is this forward KL, takes different student and
teacher hidden sizes, and runs on the CPU: checked from its wheel, with and without
``torch.compile``, it equals this module's ``"next"``/``token`` KL): its normalisation is
not the recipe's. One ``ignore_index`` target mask serves both losses and both are divided
by the number of valid targets. The `lrc` recipe counts the KL at all L positions (the last
has no target) and divides it by the number of sequences (``batchmean``, the reference's):
with Liger that is a per-batch weight ``kl_weight · n_valid / B`` (a host sync, a new loss
object per step) plus the last position's KL computed outside it. It also declares
``triton`` a hard dependency
(a large wheel of no use on CPU machines), and takes each chunk's gradient by
``torch.func`` where the closed form above is two products. This is the small equivalent.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.utils import parametrize

from lrc.errors import LRCError
from lrc.method.losses import kl_position_mask
from lrc.names import KL_REDUCTIONS
from lrc.options import check_choice

LOSS_IMPLS = ("fused", "reference")
# A [chunk_rows, V] fp32 tensor of about this many bytes (about five are alive per chunk):
# 523 positions at V = 128256. Each chunk reads both head weights again, so smaller chunks
# are slower (one CPU thread, L 512: 11.2 s at 130 rows, 8.7 s at 512, the dense path 8.7 s).
CHUNK_BYTES = 256 * 2**20


def default_chunk_rows(vocab_size: int) -> int:
    return max(1, CHUNK_BYTES // (4 * vocab_size))


def _chunk_grad_and_terms(hs, ht, s_weight, t_weight, target, ce_coef, kl_coef, temperature, want_grad):
    """One chunk: per-row CE and KL [n], and dTotal/dlogits [n, V] (None unless ``want_grad``).

    ``ce_coef``/``kl_coef`` [n, 1] are each row's weight in the total (mask · loss weight /
    denominator); ``ce_coef`` None when CE weighs 0."""
    zs = F.linear(hs, s_weight).float()
    with torch.no_grad():
        log_t = F.log_softmax(F.linear(ht, t_weight).float() / temperature, dim=-1)
    log_s = F.log_softmax(zs / temperature, dim=-1)
    p_t = log_t.exp()
    kl_row = (p_t * (log_t - log_s)).sum(-1)
    del log_t
    lse = torch.logsumexp(zs, dim=-1, keepdim=True)
    ce_row = (lse - zs.gather(1, target[:, None])).squeeze(1)
    if not want_grad:
        return ce_row, kl_row, None
    # d KL_row / d zs = (softmax(zs/T) - p_T) / T;  d CE_row / d zs = softmax(zs) - onehot.
    grad = log_s.exp_().sub_(p_t).mul_(kl_coef / temperature)
    del p_t
    if ce_coef is not None:  # None: CE weighs 0 (the `kl` recipe); its value is logged, no gradient
        ce_grad = zs.sub_(lse).exp_()
        ce_grad.scatter_add_(1, target[:, None], torch.full_like(lse, -1.0))
        grad.add_(ce_grad.mul_(ce_coef))
    return ce_row, kl_row, grad


class _FusedCEKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s_hidden, s_weight, t_hidden, t_weight, targets, ce_row_w, kl_row_w, temperature, ce_weight,
                kl_weight, chunk_rows):
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        want_grad = need_h or need_w
        grad_h = torch.empty_like(s_hidden) if need_h else None
        grad_w = torch.zeros(s_weight.shape, dtype=torch.float32, device=s_weight.device) if need_w else None
        ce = torch.zeros((), dtype=torch.float32, device=s_hidden.device)
        kl = torch.zeros_like(ce)
        for start in range(0, s_hidden.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            ce_w, kl_w = ce_row_w[rows, None], kl_row_w[rows, None]
            hs = s_hidden[rows]
            ce_row, kl_row, grad = _chunk_grad_and_terms(
                hs, t_hidden[rows], s_weight, t_weight, targets[rows], ce_w * ce_weight if ce_weight else None,
                kl_w * kl_weight, temperature, want_grad
            )
            ce += (ce_row * ce_w.squeeze(1)).sum()
            kl += (kl_row * kl_w.squeeze(1)).sum()
            if need_h:
                grad_h[rows] = (grad @ s_weight.to(grad.dtype)).to(grad_h.dtype)
            if need_w:
                grad_w += grad.T @ hs.to(grad.dtype)
            del grad
        ctx.save_for_backward(grad_h, None if grad_w is None else grad_w.to(s_weight.dtype))
        ctx.mark_non_differentiable(ce, kl)
        return ce_weight * ce + kl_weight * kl, ce, kl

    @staticmethod
    def backward(ctx, grad_total, _grad_ce, _grad_kl):
        grad_h, grad_w = ctx.saved_tensors
        # Always scaled (out of place): testing for the usual 1 would read the value, a device
        # sync on a GPU and impossible under the planner's fake tensors; gradient accumulation
        # scales the loss anyway.
        grad_h = None if grad_h is None else grad_h * grad_total.to(grad_h.dtype)
        grad_w = None if grad_w is None else grad_w * grad_total.to(grad_w.dtype)
        return grad_h, grad_w, *([None] * 9)


def position_weights(input_ids, loss_mask, kl_positions, kl_reduction):
    """Per-position weights [B, L] of CE and KL in their normalised sums, and the targets.

    CE: position t counts where ``loss_mask[t+1]`` (never the last), / number counted.
    KL: :func:`lrc.method.losses.kl_position_mask` over L positions (``"next"``: the last never
    counts), / B (``batchmean``) or / number counted (``token``)."""
    check_choice("kl_reduction", kl_reduction, KL_REDUCTIONS)
    B = input_ids.shape[0]
    mask = torch.ones_like(input_ids, dtype=torch.float32) if loss_mask is None else loss_mask.to(torch.float32)
    none = torch.zeros_like(mask[:, :1])
    ce_m = torch.cat([mask[:, 1:], none], dim=1)
    kl_m = kl_position_mask(mask, kl_positions)
    if kl_positions == "next":
        kl_m = torch.cat([kl_m, none], dim=1)
    kl_denom = torch.tensor(float(B), device=mask.device) if kl_reduction == "batchmean" else kl_m.sum().clamp_min(1)
    targets = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)  # the last column: any id, weight 0
    return targets, ce_m / ce_m.sum().clamp_min(1), kl_m / kl_denom


def fused_ce_kl(
    s_hidden, s_weight, t_hidden, t_weight, input_ids, loss_mask=None, *,
    temperature: float, kl_positions: str, kl_reduction: str = "batchmean",
    ce_weight: float = 1.0, kl_weight: float = 1.0, chunk_rows: int | None = None,
):
    """``(total, ce, kl)`` from final hidden states ``[B, L, r]`` / ``[B, L, H]`` and head
    weights ``[V, r]`` / ``[V, H]``; ``total = ce_weight·ce + kl_weight·kl`` (the only one
    with a gradient). Same values as ``next_token_ce`` and ``kl_divergence`` on the logits."""
    B, L = input_ids.shape
    if s_hidden.shape[:2] != (B, L) or t_hidden.shape[:2] != (B, L):
        raise LRCError(f"fused loss: hidden states {tuple(s_hidden.shape)} (student), {tuple(t_hidden.shape)} "
                       f"(teacher) do not match input_ids {tuple(input_ids.shape)}")
    if (s_weight.shape[0] != t_weight.shape[0] or s_weight.shape[1] != s_hidden.shape[-1]
            or t_weight.shape[1] != t_hidden.shape[-1]):
        raise LRCError(f"fused loss: head weights {tuple(s_weight.shape)} (student), {tuple(t_weight.shape)} (teacher) "
                       f"do not fit hidden sizes {s_hidden.shape[-1]}, {t_hidden.shape[-1]} and one vocabulary")
    if not temperature > 0:
        raise LRCError(f"temperature must be positive, got {temperature!r}")
    chunk_rows = default_chunk_rows(s_weight.shape[0]) if chunk_rows is None else int(chunk_rows)
    if chunk_rows < 1:
        raise LRCError(f"chunk_rows must be >= 1, got {chunk_rows}")
    targets, ce_w, kl_w = position_weights(input_ids, loss_mask, kl_positions, kl_reduction)
    return _FusedCEKL.apply(
        s_hidden.reshape(B * L, -1), s_weight, t_hidden.reshape(B * L, -1), t_weight,
        targets.reshape(-1), ce_w.reshape(-1), kl_w.reshape(-1),
        float(temperature), float(ce_weight), float(kl_weight), chunk_rows,
    )


def head_weight(model) -> torch.Tensor:
    """The output head's weight ``[V, hidden]`` (the parametrised one of an LRC student) of
    ``model`` or of the module a DDP wrapper holds."""
    return getattr(model, "module", model).get_output_embeddings().weight


def hidden_and_head(model, input_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """The final (normed) hidden states ``[B, L, H]`` of a Hugging Face causal LM and its head
    weight, called through ``model`` as given (a DDP/FSDP wrapper runs its hooks) with no
    logits computed. Under ``parametrize.cached`` the head's parametrised weight, computed
    once by the head's (empty) forward, is the one returned: not rebuilt ([V, H] x [H, r])."""
    none = torch.zeros(0, dtype=torch.long, device=input_ids.device)
    with parametrize.cached():
        out = model(input_ids=input_ids, use_cache=False, logits_to_keep=none, output_hidden_states=True)
        return out.hidden_states[-1], head_weight(model)
