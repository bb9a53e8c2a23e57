"""The capacity probe: how much of each teacher MLP a student of width r can reach, and whether
training the whole deployed matrix reaches more (docs/method.md §10; `lrc probe`).

Per decoder layer, from the teacher's own MLP inputs X and outputs Y = MLP(X) on calibration
tokens:

- **energy**: the share of X's second moment in its top-r directions, ``Σ_{i≤r} λ_i / Σ λ_i`` of
  XᵀX. Near 1, a width-r student loses little of what the MLP reads.
- **slice error**: the held-out relative error ``‖Y − Ŷ‖² / ‖Y‖²`` of the best *slice-constrained*
  width-r MLP: the student state ``s = A·x`` (A: r × H), the teacher's weights read through
  trainable projections (gate ``W_g·P_g``, up ``W_u·P_u``, down ``P_dᵀ·W_d``; LRC's MLP) and
  written back by ``B`` (H × r). Every gate/up column lies in the teacher's column space.
- **free error**: the same with gate, up and down free d_ff × r matrices (the dense arm's
  reach), started from the fitted slice.
- **stranded**: ``(slice − free) / slice``, the share of the slice's residual that the free
  matrix removes: the capacity that the slice leaves stranded and that matters for this map.

Both fits start from the PCA truncation (A, P_g, P_u: X's top-r directions; B, P_d: Y's) and run
full-batch Adam, warmed up, then cosine; ``plateau`` is the relative drop of the fitting loss over
the last tenth of the steps (small: it has flattened). A fit, not an optimum: more steps can
only lower both errors. A learning rate that suits one teacher can diverge on another (0.01 did
on SmolLM2-135M's layer 15: the fitting loss rose from 0.13 to 10⁵ within 50 steps), so a step
whose loss is more than twice the best so far is undone: the best weights come back, Adam starts
afresh and the peak rate halves (``*_halvings`` counts them). The fits' own errors on the fitted
positions (``*_fit_error``) stand beside the held-out ones, so a fit that failed is told apart
from one that does not transfer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from lrc.errors import LRCError

PROBE_COLUMNS = ("layer", "energy", "slice_error", "free_error", "stranded", "slice_fit_error", "free_fit_error",
                 "slice_plateau", "free_plateau", "slice_halvings", "free_halvings", "train_rows", "heldout_rows")


@dataclass(frozen=True)
class LayerCapacity:
    layer: int
    energy: float
    slice_error: float
    free_error: float
    stranded: float
    slice_fit_error: float
    free_fit_error: float
    slice_plateau: float
    free_plateau: float
    slice_halvings: int
    free_halvings: int
    train_rows: int
    heldout_rows: int

    def row(self) -> dict:
        return asdict(self)


def decoder_layers(teacher: nn.Module) -> nn.ModuleList:
    layers = getattr(getattr(teacher, "model", None), "layers", None)
    if layers is None:
        raise LRCError(f"{type(teacher).__name__} has no model.layers: the probe reads Llama/Qwen-style decoders")
    return layers


@torch.no_grad()
def mlp_samples(teacher: nn.Module, rows: torch.Tensor, layers: list[int], batch: int = 8
                ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """layer -> (X, Y): the inputs and outputs of its MLP on token ``rows`` [n, seq_len], one row
    per token position, float32 on the CPU."""
    blocks = decoder_layers(teacher)
    seen: dict[int, tuple[list, list]] = {i: ([], []) for i in layers}

    def keep(i):
        def hook(module, inputs, output):
            seen[i][0].append(inputs[0].reshape(-1, inputs[0].shape[-1]).float().cpu())
            seen[i][1].append(output.reshape(-1, output.shape[-1]).float().cpu())
        return hook

    handles = [blocks[i].mlp.register_forward_hook(keep(i)) for i in layers]
    try:
        device = next(teacher.parameters()).device
        for start in range(0, len(rows), batch):
            teacher(input_ids=rows[start:start + batch].to(device))
    finally:
        for h in handles:
            h.remove()
    return {i: (torch.cat(xs), torch.cat(ys)) for i, (xs, ys) in seen.items()}


def top_directions(z: torch.Tensor, r: int) -> tuple[torch.Tensor, float]:
    """The top-r eigenvectors [H, r] of zᵀz and the share of its trace they hold."""
    values, vectors = torch.linalg.eigh(z.double().T @ z.double())  # ascending
    share = float(values[-r:].sum() / values.sum().clamp_min(torch.finfo(torch.float64).tiny))
    return vectors[:, -r:].flip(-1).float(), share


class ProbeMLP(nn.Module):
    """A width-r MLP in the teacher's coordinates: ``x -> B·down(act(gate(A·x)) * up(A·x))``."""

    def __init__(self, mlp: nn.Module, read: torch.Tensor, write: torch.Tensor):
        super().__init__()
        self.act = mlp.act_fn
        self.register_buffer("w_gate", mlp.gate_proj.weight.detach().float().clone())
        self.register_buffer("w_up", mlp.up_proj.weight.detach().float().clone())
        self.register_buffer("w_down", mlp.down_proj.weight.detach().float().clone())
        self.read = nn.Parameter(read.T.clone())  # A [r, H]
        self.write = nn.Parameter(write.clone())  # B [H, r]
        self.p_gate, self.p_up = nn.Parameter(read.clone()), nn.Parameter(read.clone())  # [H, r]
        self.p_down = nn.Parameter(write.clone())
        self.free: nn.ParameterList | None = None

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """gate [d_ff, r], up [d_ff, r], down [r, d_ff] of the width-r MLP."""
        if self.free is not None:
            return tuple(self.free)
        return self.w_gate @ self.p_gate, self.w_up @ self.p_up, self.p_down.T @ self.w_down

    def make_free(self) -> None:
        """From here on gate, up and down are free matrices, starting at the slice's."""
        with torch.no_grad():
            self.free = nn.ParameterList([nn.Parameter(w.detach().clone()) for w in self.weights()])
        for p in (self.p_gate, self.p_up, self.p_down):
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = self.weights()
        s = x @ self.read.T
        return (self.act(s @ gate.T) * (s @ up.T)) @ down.T @ self.write.T


def relative_error(model: ProbeMLP, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(((model(x) - y) ** 2).sum() / (y ** 2).sum().clamp_min(torch.finfo(y.dtype).tiny))


@dataclass(frozen=True)
class Fit:
    error: float  # relative error on the fitted positions, at the best weights
    plateau: float
    halvings: int


@torch.no_grad()
def _copy(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    for target, source in zip(targets, sources):
        target.copy_(source)


def fit(model: ProbeMLP, x: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float, blowup: float = 2.0) -> Fit:
    """Full-batch Adam on the relative error, a linear warm-up over the first tenth of the steps
    (Adam's first steps are full-size whatever the gradient: without it the free fit leaves the
    slice's optimum it starts from), then cosine to 0. A loss above ``blowup`` times the best so
    far (plus 1e-6, so a fit at rounding level is left alone) restores the best weights, restarts
    Adam (warm-up included) and halves the peak rate; the model ends at its best weights."""
    params = [p for p in model.parameters() if p.requires_grad]
    scale = (y ** 2).sum().clamp_min(torch.finfo(y.dtype).tiny)
    tail, losses = max(1, steps // 10), []
    opt, since, halvings = torch.optim.Adam(params, lr=lr), 0, 0
    best, best_loss = [p.detach().clone() for p in params], math.inf
    for step in range(steps):
        loss = ((model(x) - y) ** 2).sum() / scale  # relative_error's, with its gradient
        value = float(loss.detach())
        losses.append(value)
        if value < best_loss:
            best_loss = value
            _copy(best, params)
        elif not value <= blowup * best_loss + 1e-6:  # a NaN too; below 1e-6 of ‖Y‖², rounding
            _copy(params, best)
            opt, since, halvings = torch.optim.Adam(params, lr=lr), 0, halvings + 1
            continue
        for group in opt.param_groups:
            warm = min(1.0, (since + 1) / tail)
            group["lr"] = lr / 2 ** halvings * warm * 0.5 * (1 + math.cos(math.pi * step / steps))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        since += 1
    _copy(params, best)
    error = best_loss if losses else relative_error(model, x, y)  # --steps 0: the PCA start's
    if len(losses) <= tail:
        return Fit(error, float("nan"), halvings)
    before = losses[-tail - 1]
    return Fit(error, (before - losses[-1]) / before if before > 0 else 0.0, halvings)


def probe_layer(mlp: nn.Module, x: torch.Tensor, y: torch.Tensor, r: int, *, layer: int, steps: int, lr: float,
                heldout: float = 0.25) -> LayerCapacity:
    """The probe's row for one MLP from its samples (the last ``heldout`` share held out)."""
    n = len(x)
    n_test = max(1, int(round(n * heldout)))
    if n - n_test < 2 * r:
        raise LRCError(f"layer {layer}: {n} calibration positions are too few to fit a width-{r} MLP "
                       f"(need at least {2 * r + n_test}); give more --rows")
    x_fit, y_fit, x_test, y_test = x[:-n_test], y[:-n_test], x[-n_test:], y[-n_test:]
    read, energy = top_directions(x_fit, r)
    write, _ = top_directions(y_fit, r)
    model = ProbeMLP(mlp, read, write)
    sliced = fit(model, x_fit, y_fit, steps=steps, lr=lr)
    slice_error = relative_error(model, x_test, y_test)
    model.make_free()
    free = fit(model, x_fit, y_fit, steps=steps, lr=lr)
    free_error = relative_error(model, x_test, y_test)
    stranded = (slice_error - free_error) / slice_error if slice_error > 0 else float("nan")
    return LayerCapacity(layer, energy, slice_error, free_error, stranded, sliced.error, free.error, sliced.plateau,
                         free.plateau, sliced.halvings, free.halvings, len(x_fit), n_test)
