"""The student's parametrised weights built once per optimiser step (``--weight-build``).

An LRC student's weights are products with the frozen teacher's (``W = T·A``, ``E_t·Pᵀ``, ...,
:mod:`lrc.method.student`), rebuilt by ``torch.nn.utils.parametrize`` at every access: in every
forward of every micro-batch, and differentiated again in every backward. That work does not
depend on the tokens, so with gradient accumulation it is paid once per micro-batch for nothing.

``step`` builds each weight once at the start of the step, under the step's autocast, and hands
the micro-batches a detached copy (a leaf) through parametrize's own cache, so every forward reads
the same tensor and every backward adds its gradient into the leaf's ``.grad``. After the last
micro-batch, :meth:`StepWeights.backward` sends those gradients through the factor products once.
The math is the same as building per micro-batch (the gradient of a sum); only the order of the
additions differs (tests/training/test_weight_build.py: within 1e-5 over 20 AdamW steps).

Under DDP the micro-batches all run without DDP's all-reduce (its hooks would fire before the
factors have gradients) and the step's gradients are averaged afterwards, in one flat all-reduce
(:func:`average_gradients`). FSDP2 gathers and frees each layer's factors around its own forward,
so a weight built before the step would hold every layer at once: under FSDP2 the weights are
built per micro-batch (``auto``), and ``step`` is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.nn.utils import parametrize

from lrc.errors import LRCError

WEIGHT_BUILDS = ("auto", "step", "micro_batch")


def builds_once(choice: str, accum: int, fsdp: bool) -> bool:
    """Whether a step builds its weights once: ``auto`` does when there is more than one
    micro-batch to share them and the model is not FSDP-sharded."""
    if choice == "step" and fsdp:
        raise LRCError("--weight-build step (train.weight_build) does not run under FSDP2, which gathers each "
                       "layer's factors only around its forward; use auto or micro_batch")
    if choice not in WEIGHT_BUILDS:
        raise LRCError(f"unknown --weight-build {choice!r}; choose one of: {', '.join(WEIGHT_BUILDS)}")
    return choice == "step" or (choice == "auto" and accum > 1 and not fsdp)


class StepWeights:
    """The weights of one step: built (with the graph to their factors) and the leaves the
    micro-batches read."""

    def __init__(self, model: torch.nn.Module):
        self.keys, self.built, self.leaves = [], [], []
        for module in model.modules():
            if parametrize.is_parametrized(module):
                for name in module.parametrizations:
                    weight = getattr(module, name)  # built now, with its graph
                    # A low-precision weight (built under autocast) gathers its gradient in fp32.
                    leaf = weight.detach().to(torch.promote_types(weight.dtype, torch.float32))
                    self.keys.append((id(module), name))
                    self.built.append(weight)
                    self.leaves.append(leaf.requires_grad_(weight.requires_grad))

    def install(self) -> None:
        """Put the leaves where parametrize looks first (its cache, keyed ``(id(module), name)``;
        open only inside ``parametrize.cached()``)."""
        parametrize._cache.update(zip(self.keys, self.leaves))

    def backward(self) -> None:
        """The micro-batches' summed weight gradients, through the factor products, once."""
        pairs = [(w, leaf.grad.to(w.dtype)) for w, leaf in zip(self.built, self.leaves)
                 if w.requires_grad and leaf.grad is not None]
        if pairs:
            torch.autograd.backward([w for w, _ in pairs], [g for _, g in pairs])
        self.built, self.leaves = [], []


@contextlib.contextmanager
def built_once(model: torch.nn.Module, autocast: Callable[[], contextlib.AbstractContextManager]
               ) -> Iterator[StepWeights]:
    """Inside: every access to a parametrised weight of ``model`` reads the step's leaf."""
    with parametrize.cached():
        with autocast():
            weights = StepWeights(model)
        weights.install()
        yield weights


def average_gradients(params: list[torch.nn.Parameter], num_processes: int, bucket_numel: int = 2**25) -> None:
    """DDP's gradient average, done by hand once the step's gradients are complete: one all-reduce per
    flat bucket of about ``bucket_numel`` values (a parameter without a gradient counts as zero, as
    DDP counts it)."""
    if num_processes < 2:
        return
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    buckets, size = [[]], 0
    for p in params:
        if size >= bucket_numel:
            buckets, size = buckets + [[]], 0
        buckets[-1].append(p.grad)
        size += p.grad.numel()
    for bucket in buckets:
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat)
        flat /= num_processes
        for g, part in zip(bucket, flat.split([g.numel() for g in bucket])):
            g.copy_(part.view_as(g))


def parametrised(model: torch.nn.Module) -> bool:
    """Whether ``model`` has a parametrised weight to build (an LRC student; a plain model has none)."""
    return any(parametrize.is_parametrized(m) for m in model.modules())
