"""Activation checkpointing of each decoder layer (``--activation-checkpointing``).

A checkpointed layer keeps only its inputs from the forward; backward runs the layer's
forward again (the *recompute*) to get the tensors its gradient needs. Memory: the saved
activations of every layer, the largest part of an LRC step's peak after the fused loss
(docs/planner.md), become one ``[B, L, width]`` input per layer; time: one more forward of
the student's layers per micro-batch.

How: transformers' own support (``PreTrainedModel.activation_checkpointing_enable``, non-
reentrant ``torch.utils.checkpoint``). It works unchanged with the parametrised student,
and it checkpoints each ``GradientCheckpointingLayer``'s ``forward``, not its ``__call__``,
so the layer's module hooks (FSDP2's unshard, and the one below) run once, outside the
recompute. Its input-embedding hook (``enable_input_require_grads``, needed by reentrant
checkpointing when the embedding is frozen) is removed: non-reentrant checkpointing does
not need it, and every student here trains its embedding.

The parametrised weights (``W = T·Aᵀ`` etc., :mod:`lrc.method.student`, :mod:`lrc.method.reach`) are built
once per micro-batch, not twice: a forward pre-hook on each checkpointed layer builds the
layer's parametrised weights *outside* the checkpoint, under ``parametrize.cached()``, and
:func:`micro_batch` keeps that cache open across the micro-batch's forward **and** backward
(the loop wraps both in it), so the recompute reads the same tensors instead of rebuilding
them. (``parametrize.cached()`` around the forward alone does not reach the recompute, which
runs in backward; built inside the checkpoint, a cached weight's own saved tensors would be
dropped and never recomputed.) Cost: every layer's built weights stay alive until the end of
the micro-batch's backward (without checkpointing the layers' ``F.linear`` keep them until
the layer's backward; the embedding's is dropped at the first layer, as there; the head's
stays to the end, past the loss that needs it); gain: the rebuild products
(``[out, H] x [H, r]`` per weight; at Llama-3.2-3B widths half
of what the slice layer's linears cost at micro-batch 3 and seq 2048) are not run again
(docs/planner.md, "Keep or rebuild the weights", measured).

The clone terms computed by the student's hooks (:mod:`lrc.method.clone`) are computed in the
original forward only and save their one tensor outside the checkpoint; the recompute
does not run them (see :func:`lrc.method.clone.saved_as_is`), unless the objective reruns the
teacher's layers (``--recompute-teacher``): then they run in the recompute too, with the
teacher's layer.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.utils import parametrize

from lrc.errors import LRCError

_KEEPER_ATTR = "_lrc_weight_keeper"


class _WeightKeeper:
    """The pre-hooks that build each checkpointed layer's parametrised weights outside the
    checkpoint, while :func:`micro_batch` holds the parametrisation cache open."""

    def __init__(self, layers: list[nn.Module]):
        self.open = 0
        self.handles = [layer.register_forward_pre_hook(self._build) for layer in layers]
        self.weights = {layer: [(m, name) for m in layer.modules() if parametrize.is_parametrized(m)
                                for name in m.parametrizations]
                        for layer in layers}
        # parametrize's cache key of each layer weight (torch.nn.utils.parametrize: (id(module), name))
        self.keys = {(id(m), name) for pairs in self.weights.values() for m, name in pairs}

    def _build(self, layer: nn.Module, _args) -> None:
        if not (self.open and layer.training and torch.is_grad_enabled()):
            return
        # Only the layers' weights outlive their use: the embedding's (built before the first
        # layer, not needed by its backward) is dropped, as it is without checkpointing.
        # parametrize offers no public eviction; its cache is a dict keyed (id(module), name). A leaf is
        # a weight built for the whole step (lrc.training.weight_build): kept.
        for key in [k for k, w in parametrize._cache.items() if k not in self.keys and not w.is_leaf]:
            del parametrize._cache[key]
        for module, name in self.weights[layer]:
            getattr(module, name)  # built now (cached), outside the checkpoint

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def _bare(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)  # a DDP wrapper's model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a Hugging Face causal LM (``model.model.layers``)."""
    # Imported here: the workflow's dry run imports the command modules for their options, and
    # transformers' modelling stack would cost it 2 s.
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = list(getattr(getattr(_bare(model), "model", None), "layers", None) or [])
    if not layers or not all(isinstance(layer, GradientCheckpointingLayer) for layer in layers):
        raise LRCError(f"--activation-checkpointing: {type(_bare(model)).__name__} has no transformers decoder layers "
                       "(model.model.layers of GradientCheckpointingLayer) to checkpoint")
    return layers


def enable(model: nn.Module) -> int:
    """Checkpoint every decoder layer of ``model`` (in place); returns how many."""
    model = _bare(model)
    layers = decoder_layers(model)
    if getattr(model, _KEEPER_ATTR, None) is None:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.disable_input_require_grads()  # see the module doc
        setattr(model, _KEEPER_ATTR, _WeightKeeper(layers))
    return len(layers)


def disable(model: nn.Module) -> None:
    """Undo :func:`enable` (a no-op on a model without it)."""
    model = _bare(model)
    keeper = getattr(model, _KEEPER_ATTR, None)
    if keeper is not None:
        keeper.remove()
        delattr(model, _KEEPER_ATTR)
        model.activation_checkpointing_disable()


def is_enabled(model: nn.Module) -> bool:
    return getattr(_bare(model), _KEEPER_ATTR, None) is not None


@contextlib.contextmanager
def micro_batch(model: nn.Module, keep_weights: bool = True):
    """Around one micro-batch's forward and backward: with checkpointing on, the weights the
    layers' forward built are the ones their recompute uses (``keep_weights=False``: the
    recompute builds them again; measured in docs/planner.md). A no-op without checkpointing."""
    keeper = getattr(_bare(model), _KEEPER_ATTR, None)
    if keeper is None or not keep_weights:
        yield
        return
    with parametrize.cached():
        keeper.open += 1
        try:
            yield
        finally:
            keeper.open -= 1
