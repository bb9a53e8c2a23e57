"""FSDP2 for the training loop: on CPU processes too, tied factors kept tied, undone at the end.

:mod:`lrc.training.loop` hands the student to accelerate's FSDP plugin (``fsdp_version: 2``,
``fully_shard`` per decoder layer, then the embedding/head units and the root). Three things
accelerate 1.15 does not do for an LRC student, done here:

- **CPU processes.** accelerate turns FSDP on only for accelerator devices; CPU processes
  under ``ACCELERATE_USE_CPU=1`` stay DDP (``MULTI_CPU``) even when launched with an FSDP
  config. :func:`enable_cpu_fsdp` switches such a run to FSDP2 over gloo, with the plugin
  the launcher described in the environment, so the GPU code path is the one tested here
  (``config/accelerate/fsdp-cpu2.yaml``).
- **Precision.** Parameters are gathered and gradients reduced in fp32 (an empty
  ``MixedPrecisionPolicy``), bf16 compute comes from autocast, as under DDP: the same
  numerics as DDP, at twice the all-gather bytes of accelerate's bf16 ``param_dtype``, which
  would give the parametrisations bf16 factors to multiply with the teacher's weights outside
  autocast (and CUDA's ``ormqr`` has no bf16 kernel). Revisit with a GPU measurement if the gathers dominate.
- **Contiguous parameters.** ``fully_shard`` refuses a strided parameter (`confined` stores
  its down projection's C transposed); :func:`before_prepare` makes them contiguous.
- **Tied factors.** A tied student shares one factor Parameter between ``embed_tokens`` and
  ``lm_head`` through two parametrisations, so accelerate's tie test (``input.weight is
  output.weight``) sees two computed tensors and shards the two modules in separate groups:
  each gets its own copy of the factor and the tie silently breaks (the head and the
  embedding then train apart). :func:`shard_shared_factors` puts them in one group first,
  before the optimiser is built, so the optimiser holds the one sharded factor, and
  :func:`embeddings_hidden` keeps accelerate from looking at them again while it prepares
  (it would compute the parametrised weight of an already sharded factor).
- **What FSDP2 shards.** Parameters only: the trainable factors and norm weights, and the
  frozen parameters (Qwen2's q/k/v biases), as ``DTensor`` shards (``Shard(0)``) across the
  ranks. Not sharded: the teacher weights an LRC parametrisation reads are the objective's
  teacher module's own tensors (:class:`lrc.method.teacher_tensor.TeacherTensor`, neither buffers nor
  parameters), and core's buffers (``basis``, ``reflectors``, ``tau``, ``rotation``,
  ``lrc_down_factor``) are plain tensors, a full replica on every rank. The objective's teacher is not given to
  accelerate at all (:func:`lrc.training.loop.place_teacher`): a full replica on every rank.
- **The end of a run.** :func:`unshard` gathers every sharded parameter into a full plain
  tensor on every rank, removes FSDP's hooks and restores the module classes, so the
  command gets back an ordinary model holding the final weights (what ``train`` promises).
"""

from __future__ import annotations

import contextlib
import os

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from torch import nn

from lrc.errors import LRCError


def enable_cpu_fsdp(accelerator) -> None:
    """Switch CPU processes launched with an FSDP config from DDP to FSDP2 (see module doc)."""
    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return
    plugin = FullyShardedDataParallelPlugin()  # from the FSDP_* variables the launcher set
    if plugin.fsdp_version != 2:
        raise LRCError("FSDP on CPU processes runs FSDP2 only: set fsdp_version: 2 in the accelerate config "
                       f"(got {plugin.fsdp_version})")
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # as AcceleratorState does on GPUs


def _fsdp_kwargs(accelerator) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    plugin = accelerator.state.fsdp_plugin
    mesh = getattr(accelerator, "torch_device_mesh", None)
    return {
        "offload_policy": plugin.cpu_offload,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
        "mesh": mesh[tuple(accelerator.parallelism_config.fsdp_dim_names)] if mesh is not None else None,
    }


def before_prepare(model: nn.Module, accelerator) -> bool:
    """What FSDP2 needs before the optimiser is built: contiguous parameters (``fully_shard``
    refuses a strided one, e.g. the transposed ``C`` of `confined`'s down projection; same
    values, same Parameter), and the shared factor in one group. True if the student is tied."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    with torch.no_grad():
        for p in model.parameters():
            if not p.is_contiguous():
                p.data = p.data.contiguous()
    # fp32 parameters and gradient reductions; bf16 compute comes from autocast, as under DDP.
    # (accelerate's bf16 param_dtype would hand the parametrisations bf16 factors, and
    # torch.ormqr has no bf16 kernel on CUDA.)
    accelerator.state.fsdp_plugin.mixed_precision_policy = MixedPrecisionPolicy()
    return shard_shared_factors(model, accelerator)


def shard_shared_factors(model: nn.Module, accelerator) -> bool:
    """One FSDP2 group for the embedding and the head when they share a parameter; True if so.

    Call before the optimiser is built and before ``accelerator.prepare`` (which then skips
    the two modules, already sharded, and shards the rest as usual).
    """
    from torch.distributed.fsdp import fully_shard

    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    embed, head = (get_in() if get_in else None), (get_out() if get_out else None)
    if embed is None or head is None:
        return False
    shared = {id(p) for p in embed.parameters()} & {id(p) for p in head.parameters()}
    if not shared:
        return False
    fully_shard([embed, head], reshard_after_forward=False, **_fsdp_kwargs(accelerator))
    return True


@contextlib.contextmanager
def embeddings_hidden(model: nn.Module, hide: bool):
    """While preparing: ``get_input/output_embeddings`` return None (the modules are sharded already)."""
    if not hide:
        yield
        return
    model.get_input_embeddings = model.get_output_embeddings = lambda: None  # instance attributes shadow the methods
    try:
        yield
    finally:
        del model.get_input_embeddings, model.get_output_embeddings


def is_sharded(p: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(p, DTensor)


def full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: ``t`` itself, or the whole value of a DTensor (FSDP2's gradient norm is one)."""
    return t.full_tensor() if is_sharded(t) else t


def unshard(model: nn.Module) -> None:
    """Turn an FSDP2-sharded model back into a plain one with full parameters (every rank).

    A collective: every rank calls it, and the parameters are gathered in the same order.
    A shared parameter stays shared.
    """
    from torch.distributed.fsdp import FSDPModule

    full: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if not is_sharded(p):
                continue
            if id(p) not in full:
                full[id(p)] = nn.Parameter(p.full_tensor().detach().clone(), requires_grad=p.requires_grad)
            module._parameters[name] = full[id(p)]
    for module in model.modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            for handle in {id(h): h for h in (state._pre_forward_hook_handle, state._post_forward_hook_handle)
                           if h is not None}.values():
                handle.remove()
            module.__class__ = next(c for c in type(module).__bases__ if c is not FSDPModule)
