"""AdamW in per-parameter coordinates: the basis change of an arm, once per optimiser step.

Some arms (`core`, `randcomp`: METHOD.md §3) are the *dense* function class trained in other
coordinates: the deployed weight is ``W = M(q)`` for a fixed orthogonal linear map M
(``W = [U_r U_perp] · q``), and AdamW, which is not rotation invariant, runs on q. Instead
of rebuilding W from q in every forward and backward (a parametrisation), the training
model holds W itself, a plain weight, and :class:`CoordinateAdamW` moves to q and back
once per step:

* the gradient of W goes to coordinates, ``g_q = M*(g_W)`` (the adjoint, = the inverse,
  since M is orthogonal; exactly what autograd computes through a parametrisation),
* AdamW's moments (``exp_avg``, ``exp_avg_sq``) and q itself live in coordinates, in the
  optimiser state (``state[W]["coordinates"]``, so a checkpoint restores q bitwise),
* torch's own AdamW step runs on q (the same kernels as on a parametrised tensor), and
* ``W = M(q)`` is written back.

Gradient clipping is unchanged: it runs on g_W before the step and M is orthogonal, so the
norm is that of g_q (up to float rounding). Decoupled weight decay shrinks q by
``1 - lr·wd``, i.e. W by the same factor: the parametrised arm's decay.

The maps are found on the model (:func:`coordinate_maps`): a module whose attribute
:data:`COORDINATES_ATTR` is a map has its ``weight`` optimised in that map's coordinates.
A map is any object with ``coordinates(t)`` (``M*``: weight-shaped tensor to coordinates)
and ``__call__(q)`` (``M``: coordinates to a weight-shaped tensor). A plain optimiser
that ignores the maps trains such a weight as a dense one.

W is the truth between runs (it is what is saved and merged); between steps the optimiser
holds q = M*(W) up to rounding, initialised from W at the first step. Code that writes W
outside the optimiser mid-run (other than a checkpoint restore, which restores both)
would be undone at the next step.

Several processes (DDP) share the work: weight j's basis changes run on process
``j % P`` only, which broadcasts the mapped gradient and then the new W (two broadcasts of
the weight's size per step, like the gradient all-reduce), and at the first step q itself;
AdamW itself, cheap and elementwise, runs everywhere, so every process holds the whole
optimiser state and a checkpoint is the same as with one process. The values are those
every process would compute itself (same kernels, same inputs). So a process never reads
the maps of the weights it does not own: the optimiser releases them when it is built
(``cmap.release()``, where the map has one: `core`'s U_r and reflectors, 16.9 GB fp32 per
process at Llama-3.2-3B, r 1536, are then held ~1/P per process); a map that can be
released must also say its coordinates' shape (``cmap.coordinates_shape(weight_shape)``).
:attr:`CoordinateAdamW.coordinate_share` says how the work is divided (the training
summary records it); :meth:`CoordinateAdamW.plan_share` makes a single process act as
rank 0 of P (no broadcasts), for the planner's memory trace.

Only `core`/`randcomp` use it (decision, measured with ``lrc bench``, CPU time per step,
H512 teacher, 4 micro-batches of 1,024 tokens: kd 2.45 s, dense 3.12 s, slice 3.40 s,
confined 3.65 s). `confined` (W = Π·C) and `slice` (W = T·Zᵀ, and every other LRC factor)
are linear in their coordinates too, but their maps are not orthogonal: the clipped norm
is that of the coordinates' gradient (‖Π·g‖, ‖g·T‖), not of g_W, so the loop's clipping
on g_W would change their trajectory; the optimiser would have to own clipping. `slice`
also has coordinates with gradient paths that do not go through W (the tied P_emb feeds
two weights, P_down the mlp-out clone target). What is at stake: confined's projection
costs 17 % of the dense step there and slice's MLP products 9 %; everything an LRC arm adds
to plain KD (dense over kd: 27 %: the attention/embedding/head factor products, once per
micro-batch, and the clone terms) holds the larger share, so the next candidate is those
factors, with the optimiser owning clipping and maps over several weights.

This module is generic numerics (no arm, no model type): the method layer supplies the
maps, the training loop builds the optimiser.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol

import torch

from lrc.errors import LRCError

COORDINATES_ATTR = "optimizer_coordinates"
STATE_KEY = "coordinates"


class CoordinateMap(Protocol):
    def coordinates(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def coordinates_shape(self, weight_shape: tuple[int, ...]) -> tuple[int, ...]: ...

    def __call__(self, coords: torch.Tensor) -> torch.Tensor: ...


def _world() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _share_from_owners(jobs, broadcast: bool) -> None:
    """Each ``(tensor, owner)``: broadcast the owner's values to every process (no-op alone)."""
    if not broadcast:
        return
    handles = [torch.distributed.broadcast(t, src=owner, async_op=True) for t, owner in jobs]
    for h in handles:
        h.wait()


def coordinate_maps(model: torch.nn.Module) -> dict[torch.nn.Parameter, CoordinateMap]:
    """``{weight: map}`` for every trainable module weight that carries a coordinate map."""
    found = {}
    for module in model.modules():
        cmap = getattr(module, COORDINATES_ATTR, None)
        if cmap is None:
            continue  # and never read a parametrised weight here: that would compute it
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.nn.Parameter) and weight.requires_grad:
            found[weight] = cmap
    return found


class CoordinateAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` that optimises the parameters in ``coordinates`` through their maps.

    Every other parameter is handled exactly as by AdamW. See the module doc.
    """

    def __init__(self, params: Iterable[Any], coordinates: Mapping[torch.Tensor, CoordinateMap] | None = None, **kwargs):
        super().__init__(params, **kwargs)
        # Keyed by id: tensors compare elementwise, so they are no safe dict keys of their own.
        self._maps = {id(p): (p, cmap) for p, cmap in (coordinates or {}).items()}
        listed = {id(p) for group in self.param_groups for p in group["params"]}
        stray = [k for k in self._maps if k not in listed]
        if stray:
            raise LRCError(f"CoordinateAdamW: {len(stray)} parameter(s) with a coordinate map are not among the optimised ones")
        for p, _ in self._maps.values():
            if type(p).__name__ == "DTensor" or type(p.data).__name__ == "DTensor":
                raise LRCError("CoordinateAdamW: a parameter with a coordinate map is sharded (FSDP); the basis change needs the "
                               "whole matrix: use the parametrised implementation (--core-impl parametrized)")
        world, rank = _world()
        self._divide(world, rank, broadcast=world > 1)

    def _divide(self, world: int, rank: int, broadcast: bool) -> None:
        """Own weight j iff ``j % world == rank``; release the maps of the others (never read here)."""
        self._world, self._broadcast = (world, rank), broadcast
        self._owner = {k: j % world for j, k in enumerate(self._maps)}
        for k, (p, cmap) in self._maps.items():
            if self._owner[k] != rank and hasattr(cmap, "release"):
                cmap.release()

    def plan_share(self, processes: int) -> None:
        """Act as rank 0 of ``processes`` without a process group: hold and rotate only its
        share (no broadcasts: the others' values are left unset). For a memory trace only."""
        if processes < 1:
            raise LRCError(f"plan_share: processes must be >= 1, got {processes}")
        self._divide(processes, 0, broadcast=False)

    @property
    def coordinate_share(self) -> dict[str, int]:
        """How the basis changes are divided: mapped weights in all, and this process's share."""
        world, rank = self._world
        return {"maps": len(self._maps), "this_process": sum(1 for o in self._owner.values() if o == rank),
                "processes": world}

    def _enter(self) -> list[tuple[dict, int, torch.Tensor, torch.Tensor, CoordinateMap]]:
        """Put each mapped parameter's coordinates (grad and state) in its place in the groups."""
        listed = {id(p) for group in self.param_groups for p in group["params"]}
        if any(k not in listed for k in self._maps):
            # e.g. accelerate's FSDP prepare swapped the parameters for sharded ones: the
            # mapped weights would silently train as dense ones.
            raise LRCError("CoordinateAdamW: the parameters with a coordinate map are no longer the optimised ones "
                           "(replaced after the optimiser was built, as FSDP does); use --core-impl parametrized")
        _, rank = self._world
        swapped, firsts, jobs = [], [], []
        for group in self.param_groups:
            params = group["params"]
            for i, p in enumerate(params):
                if id(p) not in self._maps or p.grad is None:
                    continue
                cmap, owner = self._maps[id(p)][1], self._owner[id(p)]
                state = self.state.pop(p, {})
                q = state.pop(STATE_KEY, None)
                if q is None:  # first step: q = M*(W), made by the owner (W is the same everywhere)
                    q = cmap.coordinates(p.detach()).contiguous() if owner == rank else \
                        p.new_empty(cmap.coordinates_shape(tuple(p.shape)))
                    firsts.append((q, owner))
                # Processes share the basis changes: the owner of a weight maps its (all-reduced,
                # identical everywhere) gradient and sends it; AdamW then runs everywhere.
                q.grad = cmap.coordinates(p.grad).contiguous() if owner == rank else torch.empty_like(q)
                jobs.append((q.grad, owner))
                self.state[q] = state
                params[i] = q
                swapped.append((group, i, p, q, cmap, owner))
        _share_from_owners(firsts + jobs, self._broadcast)
        return swapped

    def _leave(self, swapped) -> None:
        _, rank = self._world
        for group, i, p, q, cmap, owner in swapped:
            group["params"][i] = p
            state = self.state.pop(q)
            q.grad = None
            state[STATE_KEY] = q
            self.state[p] = state
            if owner == rank:
                p.copy_(cmap(q))
        _share_from_owners([(p.data, owner) for _, _, p, _, _, owner in swapped], self._broadcast)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        swapped = self._enter()
        try:
            super().step()
        finally:
            self._leave(swapped)
        return loss
