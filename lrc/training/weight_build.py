"""The student's parametrised weights built once per optimiser step (``--weight-build``).

An LRC student's weights are products with the frozen teacher's (``W = T·A``, ``E_t·Pᵀ``, ...,
:mod:`lrc.method.student`), rebuilt by ``torch.nn.utils.parametrize`` at every access: in every
forward of every micro-batch, and differentiated again in every backward. That work does not
depend on the tokens, so with gradient accumulation it is paid once per micro-batch for nothing.

``step`` builds each weight once at the start of the step, under the step's autocast, and hands
the micro-batches a detached view of it (a leaf, no copy) through parametrize's own cache, so every
forward reads the same tensor and every backward adds its gradient into the leaf's ``.grad``; a
bf16 weight (mixed precision) moves each micro-batch's gradient into an fp32 sum instead. A tied
student's head is the embedding's product, built once for both. After the last micro-batch,
:meth:`StepWeights.backward` sends the summed gradients through the factor products once.
The math is the same as building per micro-batch (the gradient of a sum); only the order of the
additions differs (tests/training/test_weight_build.py: within 1e-5 over 20 AdamW steps).

Under DDP the micro-batches run without DDP's own all-reduce (its hooks would fire before the
factors have gradients); :func:`average_gradients` averages the step's gradients after the backward.
With ``divide_weight_build`` the construction is also divided: each process builds one row block of
each weight (the products of :mod:`lrc.method.reach` build any rows from that block of their
operand), the blocks are all-gathered into the leaf, and after the micro-batches each process takes
its rows of the leaf's gradient summed over the processes (a reduce-scatter) through its block's
product; the average then also completes the factor gradients the blocks gave as partial sums. The
weight-side compute per process falls as 1/N, at the price of those two collectives per weight and
step: on two CPU processes it measured no faster, so it is opt-in. One process and two agree to
float32 rounding either way (tests/training/test_multiprocess.py; divided, in float64, to 2e-13).

FSDP2 gathers and frees each layer's factors around its own forward, so a weight built before the
step would hold every layer at once: under FSDP2 the weights are built per micro-batch (``auto``),
and ``step`` is refused.
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
    micro-batch to share them and the model is not FSDP-sharded. The price is each weight held
    through the step and its gradient's fp32 sum (at Llama-3.2-3B widths on one GPU, 0.1 to 5.0 GiB
    more per arm, ``lrc plan --weight-build step``)."""
    if choice == "step" and fsdp:
        raise LRCError("--weight-build step (train.weight_build) does not run under FSDP2, which gathers each "
                       "layer's factors only around its forward; use auto or micro_batch")
    if choice not in WEIGHT_BUILDS:
        raise LRCError(f"unknown --weight-build {choice!r}; choose one of: {', '.join(WEIGHT_BUILDS)}")
    return choice == "step" or (choice == "auto" and accum > 1 and not fsdp)


def not_divided(choice: str, accum: int, fsdp: bool) -> str:
    """Why ``--divide-weight-build`` has nothing to divide: the run builds per micro-batch."""
    why = ("FSDP2 builds each layer's weights in its own forward" if fsdp
           else f"--weight-build {choice} with {accum} micro-batch{'es' if accum > 1 else ''} per step"
           " builds them in every micro-batch's forward")
    return (f"--divide-weight-build (train.divide_weight_build) divides the once-per-step build of the weights, "
            f"but this run does not build them once: {why}; add --weight-build step (train.weight_build) "
            "or drop --divide-weight-build")


class StepWeights:
    """The weights of one step: built (with the graph to their factors) and the leaves the
    micro-batches read. With ``num_processes`` > 1 (DDP, divided) each process builds one row block of each
    weight whose parametrisation can build rows (``rows``/``num_rows``, :mod:`lrc.method.reach`),
    and the blocks are gathered into the leaf."""

    def __init__(self, model: torch.nn.Module, process_index: int = 0, num_processes: int = 1):
        self.rank, self.world = process_index, num_processes
        self.keys, self.built, self.leaves, self.blocks, self.sums = [], [], [], [], []
        self.aliases: list[tuple[tuple[int, str], torch.Tensor]] = []
        seen: dict[tuple, torch.Tensor] = {}
        for module in model.modules():
            if parametrize.is_parametrized(module):
                for name, plist in module.parametrizations.items():
                    same = _product_key(plist)
                    if same is not None and same in seen:  # a tied head: the embedding's product, read twice
                        self.aliases.append(((id(module), name), seen[same]))
                        continue
                    weight, block = self._build(module, name, plist)
                    # The leaf shares the built weight's memory (a block's: the gathered copy's).
                    leaf = (weight if block is None else self._gathered(weight, block)).detach()
                    self.keys.append((id(module), name))
                    self.built.append(weight)
                    self.blocks.append(block)
                    self.leaves.append(leaf.requires_grad_(weight.requires_grad))
                    self.sums.append(None)
                    if same is not None:
                        seen[same] = leaf
                    if weight.requires_grad and leaf.dtype.itemsize < 4:
                        # A low-precision weight (built under autocast) sums its micro-batches' gradients in
                        # fp32: one fp32 copy per weight, not a low-precision sum of the micro-batches.
                        leaf.register_post_accumulate_grad_hook(self._summer(len(self.sums) - 1))

    def _summer(self, i: int) -> Callable[[torch.Tensor], None]:
        def add(leaf: torch.Tensor) -> None:
            self.sums[i] = leaf.grad.float() if self.sums[i] is None else self.sums[i].add_(leaf.grad)
            leaf.grad = None
        return add

    def _build(self, module, name, plist) -> tuple[torch.Tensor, tuple[int, int, int, int] | None]:
        """The whole weight, or this process's rows of it: (block, (start, stop, rows per block, rows))."""
        param = plist[0] if len(plist) == 1 else None
        if self.world == 1 or not hasattr(param, "rows"):
            return getattr(module, name), None
        n = param.num_rows(plist.original)
        per = -(-n // self.world)
        start, stop = min(n, self.rank * per), min(n, (self.rank + 1) * per)
        return param.rows(plist.original, start, stop), (start, stop, per, n)

    @property
    def rows_share(self) -> float:
        """The share of the weights' rows this process built (1.0 unless divided)."""
        built = [leaf.shape[0] if b is None else b[1] - b[0] for leaf, b in zip(self.leaves, self.blocks)]
        return sum(built) / max(1, sum(leaf.shape[0] for leaf in self.leaves))

    def _gathered(self, block: torch.Tensor, where: tuple[int, int, int, int]) -> torch.Tensor:
        start, stop, per, n = where
        padded = block.new_zeros(per, *block.shape[1:])
        padded[: stop - start] = block.detach()
        whole = block.new_empty(self.world * per, *block.shape[1:])
        _collective("all_gather_single", "all_gather_into_tensor")(whole, padded)
        return whole[:n]

    def install(self) -> None:
        """Put the leaves where parametrize looks first (its cache, keyed ``(id(module), name)``;
        open only inside ``parametrize.cached()``)."""
        parametrize._cache.update(zip(self.keys, self.leaves))
        parametrize._cache.update(self.aliases)

    def backward(self) -> None:
        """The micro-batches' summed weight gradients, through the factor products, once. A row block's
        gradient is its rows summed over the processes, so the factor gradients it gives are partial
        sums of all processes' gradients: :func:`average_gradients` completes them."""
        pairs = []
        for w, leaf, block, summed in zip(self.built, self.leaves, self.blocks, self.sums):
            if not w.requires_grad:
                continue
            grad = summed if summed is not None else leaf.grad
            if block is None:  # whole: nothing to send where the micro-batches gave no gradient
                if grad is not None:
                    pairs.append((w, grad.to(w.dtype)))
            else:  # a block: every process takes part in the reduce-scatter, with zeros if need be
                grad = grad if grad is not None else torch.zeros_like(leaf, dtype=torch.float32)
                pairs.append((w, _summed_rows(grad, block, self.world).to(w.dtype)))
        if pairs:
            torch.autograd.backward([w for w, _ in pairs], [g for _, g in pairs])
        self.built, self.leaves, self.blocks, self.sums, self.aliases = [], [], [], [], []


def _product_key(plist) -> tuple | None:
    """What makes two parametrised weights the same product: the same map of the same teacher tensor
    on the same factor (a tied student's embedding and head); None for a map that reads no teacher."""
    param = plist[0] if len(plist) == 1 else None
    frozen = getattr(param, "frozen", None) if param is not None else None
    if frozen is None:
        return None
    return type(param), frozen.data_ptr(), tuple(frozen.shape), id(plist.original)


def _summed_rows(grad: torch.Tensor, where: tuple[int, int, int, int], world: int) -> torch.Tensor:
    """Rows ``start:stop`` of ``grad`` summed over the processes (a reduce-scatter)."""
    start, stop, per, _ = where
    padded = grad.new_zeros(world * per, *grad.shape[1:])
    padded[: grad.shape[0]] = grad
    mine = grad.new_empty(per, *grad.shape[1:])
    _collective("reduce_scatter_single", "reduce_scatter_tensor")(mine, padded)
    return mine[: stop - start]


def _collective(name: str, before: str):
    """``torch.distributed``'s single-tensor collective, under its older name on a torch without it."""
    import torch.distributed as dist

    return getattr(dist, name, None) or getattr(dist, before)


@contextlib.contextmanager
def built_once(model: torch.nn.Module, autocast: Callable[[], contextlib.AbstractContextManager],
               process_index: int = 0, num_processes: int = 1) -> Iterator[StepWeights]:
    """Inside: every access to a parametrised weight of ``model`` reads the step's leaf."""
    with parametrize.cached():
        with autocast():
            weights = StepWeights(model, process_index, num_processes)
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
