"""AdamW in per-parameter coordinates: the basis change of an arm, once per optimiser step.

Some arms (`core`, `coreortho`, `randcomp`: docs/method.md §3) are the *dense* function class
trained in other coordinates: the deployed weight is ``W = M(q)`` for a fixed injective linear
map M (coreortho's ``W = [U_r U_perp]·q``, orthogonal; core's ``W = T·F + U_perp·C``, not), and
AdamW, which is not rotation invariant, runs on q. Instead
of rebuilding W from q in every forward and backward (a parametrisation), the training
model holds W itself, a plain weight, and :class:`CoordinateAdamW` moves to q and back
once per step:

* the gradient of W goes to coordinates, ``g_q = M*(g_W)`` (the adjoint; exactly what autograd
  computes through a parametrisation),
* AdamW's moments (``exp_avg``, ``exp_avg_sq``) and q itself live in coordinates, in the
  optimiser state (``state[W]["coordinates"]``, so a checkpoint restores q bitwise),
* torch's own AdamW step runs on q (the same kernels as on a parametrised tensor), and
* ``W = M(q)`` is written back.

Gradient clipping: for an orthogonal M (`coreortho`) it is unchanged, on g_W before the step,
whose norm is that of g_q (up to float rounding). A map that is not orthogonal (`core`,
`randcomp`: ``W = T·F + U_perp·C``) says so (``orthogonal = False``): the loop then clips with
:meth:`CoordinateAdamW.clip_grad_norm_`, on the norm of g_q, as the parametrised arm's clipping
does, and the first step's q is ``M⁻¹(W)`` (the map's ``inverse``) instead of the adjoint.
Decoupled weight decay shrinks q by ``1 - lr·wd``, i.e. W by the same factor: the parametrised
arm's decay.

The maps are found on the model (:func:`coordinate_maps`): a module whose attribute
:data:`lrc.names.COORDINATES_ATTR` is a map has its ``weight`` optimised in that map's coordinates.
A map is any object with ``coordinates(t)`` (``M*``: weight-shaped tensor to coordinates)
and ``__call__(q)`` (``M``: coordinates to a weight-shaped tensor). A plain optimiser
that ignores the maps trains such a weight as a dense one.

W is the truth between runs (it is what is saved and merged); between steps the optimiser
holds q = M*(W) up to rounding, initialised from W at the first step. Code that writes W
outside the optimiser mid-run (other than a checkpoint restore, which restores both)
would be undone at the next step.

Several processes (DDP) share the work: the weights are divided between them, balanced by
size (:func:`balanced_owners`; equal-sized matrices go round-robin, weight j to process
``j % P``), and a weight's basis changes run on its owner only, which broadcasts the mapped
gradient and then the new W (two broadcasts of the weight's size per step, like the
gradient all-reduce), and at the first step q itself; AdamW itself, cheap and elementwise,
runs everywhere, so every process holds the whole optimiser state and a checkpoint is the
same as with one process. The values are those every process would compute itself (same
kernels, same inputs). So a process never reads the maps of the weights it does not own:
the optimiser releases them when it is built (``cmap.release()``, where the map has one:
`core`'s U_r and reflectors, 16.9 GB fp32 per process at Llama-3.2-3B, r 1536, are then
held ~1/P per process); a map that can be released must also say its coordinates' shape
(``cmap.coordinates_shape(weight_shape)``).

``shard_states=True`` divides the optimiser state too (ZeRO stage 1, as the reference LRC
trainer's DeepSpeed ZeRO-2 does for its states): every trainable parameter gets an owner,
only the owner runs AdamW on it and keeps its moments (and, mapped, its coordinates q), and
then broadcasts the new weight (one broadcast of the weights' size per step, and no mapped
gradient to send). The states held per process fall to ~1/P; the values are again those one
process computes (same kernels on the same all-reduced, clipped gradients). A checkpoint is
still the one-process state: :meth:`state_dict` collects every state on process 0, whose
file accelerate writes, one parameter at a time (no full copy on any device), and
:meth:`load_state_dict` keeps each process's share of a full state.

:attr:`CoordinateAdamW.coordinate_share` says how the work is divided (the training
summary records it); :meth:`CoordinateAdamW.plan_share` makes a single process act as
rank 0 of P (no broadcasts), for the planner's memory trace.

Only `core`/`coreortho`/`randcomp` use it (decision, measured with ``lrc bench``, CPU time per step,
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
from lrc.names import COORDINATES_ATTR

STATE_KEY = "coordinates"


class CoordinateMap(Protocol):
    orthogonal: bool  # False: clipping must see the coordinates' gradient (clip_grad_norm_)

    def coordinates(self, tensor: torch.Tensor) -> torch.Tensor: ...  # the adjoint M*

    def inverse(self, weight: torch.Tensor) -> torch.Tensor: ...  # M⁻¹ (= M* when orthogonal)

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


def balanced_owners(tensors: list[torch.Tensor], processes: int) -> list[int]:
    """The process that owns each tensor: largest first, each to the least-loaded process
    (ties to the lowest rank), so equal-sized tensors go round-robin."""
    load, owners = [0] * processes, [0] * len(tensors)
    for j in sorted(range(len(tensors)), key=lambda j: -tensors[j].numel()):  # (stable)
        owners[j] = min(range(processes), key=lambda r: (load[r], r))
        load[owners[j]] += tensors[j].numel()
    return owners


class CoordinateAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` that optimises the parameters in ``coordinates`` through their maps,
    and with ``shard_states`` keeps each process's share of the states only.

    Every other parameter is handled exactly as by AdamW. See the module doc.
    """

    def __init__(self, params: Iterable[Any], coordinates: Mapping[torch.Tensor, CoordinateMap] | None = None,
                 shard_states: bool = False, **kwargs):
        super().__init__(params, **kwargs)
        # Keyed by id: tensors compare elementwise, so they are no safe dict keys of their own.
        self._maps = {id(p): (p, cmap) for p, cmap in (coordinates or {}).items()}
        self._mapped_grads: dict[int, torch.Tensor] = {}  # this step's M*(g), made by clip_grad_norm_
        self._shard_states = shard_states
        listed = {id(p) for p in self._params()}
        stray = [k for k in self._maps if k not in listed]
        if stray:
            raise LRCError(f"CoordinateAdamW: {len(stray)} parameter(s) with a coordinate map "
                           "are not among the optimised ones")
        for p in self._params() if shard_states else (p for p, _ in self._maps.values()):
            if type(p).__name__ == "DTensor" or type(p.data).__name__ == "DTensor":
                raise LRCError("CoordinateAdamW: a parameter with a coordinate map (or, with shard_states, any "
                               "parameter) is sharded (FSDP); the basis change needs the whole matrix: use the "
                               "parametrised implementation (--core-impl parametrized), and FSDP2 shards the states "
                               "itself")
        world, rank = _world()
        self._divide(world, rank, broadcast=world > 1)

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _divide(self, world: int, rank: int, broadcast: bool) -> None:
        """Give every divided tensor an owner; release the maps of the others (never read here)."""
        self._world, self._broadcast = (world, rank), broadcast
        divided = self._params() if self._shard_states else [p for p, _ in self._maps.values()]
        self._owner = {id(p): owner for p, owner in zip(divided, balanced_owners(divided, world))}
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
        """How the work is divided: mapped weights in all and this process's share (and, with
        sharded states, the parameters whose states this process keeps)."""
        world, rank = self._world
        share = {"maps": len(self._maps), "this_process": sum(1 for k in self._maps if self._owner[k] == rank),
                 "processes": world}
        if self._shard_states:
            share |= {"state_params": len(self._owner),
                      "state_params_this_process": sum(o == rank for o in self._owner.values())}
        return share

    def _enter(self):
        """Put each mapped parameter's coordinates (grad and state) in its place in the groups;
        with sharded states, hide the gradients of the parameters another process steps."""
        listed = {id(p) for p in self._params()}
        if any(k not in listed for k in self._maps):
            # e.g. accelerate's FSDP prepare swapped the parameters for sharded ones: the
            # mapped weights would silently train as dense ones.
            raise LRCError("CoordinateAdamW: the parameters with a coordinate map are no longer the optimised ones "
                           "(replaced after the optimiser was built, as FSDP does); use --core-impl parametrized")
        _, rank = self._world
        swapped, hidden, firsts, jobs = [], [], [], []
        for group in self.param_groups:
            params = group["params"]
            for i, p in enumerate(params):
                if p.grad is None:
                    continue
                if self._shard_states and self._owner[id(p)] != rank:
                    hidden.append((p, p.grad))  # AdamW skips a parameter without a gradient
                    p.grad = None
                    continue
                if id(p) not in self._maps:
                    continue
                cmap, owner = self._maps[id(p)][1], self._owner[id(p)]
                state = self.state.pop(p, {})
                q = state.pop(STATE_KEY, None)
                if q is None:  # first step: q = M⁻¹(W), made by the owner (W is the same everywhere)
                    q = cmap.inverse(p.detach()).contiguous() if owner == rank else \
                        p.new_empty(cmap.coordinates_shape(tuple(p.shape)))
                    firsts.append((q, owner))
                # Processes share the basis changes: the owner of a weight maps its (all-reduced,
                # identical everywhere) gradient and sends it; AdamW then runs everywhere.
                mapped = self._mapped_grads.pop(id(p), None) if owner == rank else None  # (clip_grad_norm_)
                if owner == rank and mapped is None:
                    mapped = cmap.coordinates(p.grad).contiguous()
                q.grad = mapped if owner == rank else torch.empty_like(q)
                jobs.append((q.grad, owner))
                self.state[q] = state
                params[i] = q
                swapped.append((group, i, p, q, cmap, owner))
        if not self._shard_states:  # (sharded, only the owner steps q: nothing to send)
            _share_from_owners(firsts + jobs, self._broadcast)
        return swapped, hidden

    def _leave(self, swapped, hidden) -> None:
        _, rank = self._world
        for group, i, p, q, cmap, owner in swapped:
            group["params"][i] = p
            state = self.state.pop(q)
            q.grad = None
            state[STATE_KEY] = q
            self.state[p] = state
            if owner == rank:
                p.copy_(cmap(q))
        for p, grad in hidden:
            p.grad = grad
        # (the same order on every process: the gradients exist on all of them alike)
        stepped = ([p for p in self._params() if p.grad is not None] if self._shard_states
                   else [p for _, _, p, _, _, _ in swapped])
        _share_from_owners([(p.data, self._owner[id(p)]) for p in stepped], self._broadcast)

    @property
    def clips_in_coordinates(self) -> bool:
        """Whether a map is not orthogonal, so the loop must clip with :meth:`clip_grad_norm_`."""
        return any(not getattr(cmap, "orthogonal", True) for _, cmap in self._maps.values())

    @torch.no_grad()
    def clip_grad_norm_(self, params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
        """Clip the gradients of ``params`` (all-reduced already) by their norm as the coordinates
        see it, as a parametrised arm's clipping does: ``‖M*(g_W)‖`` for a mapped weight, ``‖g‖``
        for the others. The mapped gradients are kept for :meth:`step`; one factor scales both
        (the maps are linear). Returns the total norm (the same on every process)."""
        _, rank = self._world
        plain, mapped = [], []
        for p in params:
            if p.grad is None:
                continue
            if id(p) not in self._maps:
                plain.append(p.grad)
            elif self._owner[id(p)] == rank:  # the owner maps it (the others hold no map)
                self._mapped_grads[id(p)] = self._maps[id(p)][1].coordinates(p.grad).contiguous()
                mapped.append(self._mapped_grads[id(p)])
        device = params[0].device
        squares = [torch.linalg.vector_norm(g.float()) ** 2 for g in mapped]
        mapped_sq = torch.stack(squares).sum() if squares else torch.zeros((), device=device)
        if self._broadcast:
            torch.distributed.all_reduce(mapped_sq)
        plain_sq = sum((torch.linalg.vector_norm(g.float()) ** 2 for g in plain), torch.zeros((), device=device))
        total = torch.sqrt(plain_sq + mapped_sq)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in [p.grad for p in params if p.grad is not None] + mapped:
            g.mul_(coef.to(g.dtype))
        return total

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        swapped, hidden = self._enter()
        try:
            super().step()
        finally:
            self._mapped_grads.clear()
            self._leave(swapped, hidden)
        return loss

    # ---- checkpoints: the one-process state, whatever the division ----------------------

    def state_dict(self) -> dict[str, Any]:
        """With sharded states and a process group: process 0 returns every parameter's state
        (each sent by its owner, one at a time, to CPU); the others return their own share.
        Every process must call it (accelerate's ``save_state`` does)."""
        saved = super().state_dict()
        if not (self._shard_states and self._broadcast):
            return saved
        _, rank = self._world
        for index, p in enumerate(self._params()):
            owner = self._owner[id(p)]
            box = [{k: v.cpu() if torch.is_tensor(v) else v for k, v in saved["state"][index].items()}
                   if owner == rank and index in saved["state"] else None]
            torch.distributed.broadcast_object_list(box, src=owner)
            if rank == 0 and box[0] is not None:
                saved["state"][index] = box[0]
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a (one-process) state; with sharded states keep only this process's share."""
        if self._shard_states:
            _, rank = self._world
            owners = [self._owner[id(p)] for p in self._params()]
            state_dict = {**state_dict,
                          "state": {i: s for i, s in state_dict["state"].items() if owners[int(i)] == rank}}
        super().load_state_dict(state_dict)
