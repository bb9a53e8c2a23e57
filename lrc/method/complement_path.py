"""`core` and `randcomp` as a complement path: LRC's own factor kept, the teacher's complement added.

One MLP matrix, column-oriented (``[d_ff, r]``; down_proj, deployed ``[r, d_ff]``, is the
transpose), with T the frozen teacher matrix in the same orientation (``[d_ff, H]``: the
teacher's gate/up weight, or the transpose of its down weight):

    ``W = T·F + U_perp·(O·C)``,   stored coordinates ``[F; C]`` (``[H + (d_ff-H), r]``)

F is the warm start's LRC factor (``Pᵀ`` of gate/up, ``Bᵀ`` of down: the slice arm's
``W = T·Pᵀ`` and ``W = B·T``), trainable; C starts at 0; U_perp is the Householder completion
of the teacher basis (:mod:`lrc.method.spectral`), O a seeded random rotation for `randcomp`
(None for `core`). So at step 0 the student is the warm start, and the gradient reaching F
is LRC's own, ``Tᵀ·g``, scaled by the teacher's singular values: the in-subspace steps are
those of plain LRC, the complement is what the slice could not reach (docs/method.md §3,
reading (a)). The map is linear and injective but not orthogonal, which the optimiser-step
path (:class:`lrc.training.optim.CoordinateAdamW`) must know: it starts from :meth:`inverse`
rather than the adjoint, and clips the coordinates' gradient (``orthogonal = False``).
"""

from __future__ import annotations

import torch
from torch import nn

from lrc.errors import LRCError
from lrc.method.teacher_tensor import ReadsTeacher, teacher_operand


class ComplementPath(ReadsTeacher):
    """``W = T·F + U_perp·(O·C)`` on the stored ``[F; C]`` (see the module doc)."""

    orthogonal = False  # CoordinateAdamW: start from inverse(), clip the coordinates' gradient

    def __init__(self, teacher_module: nn.Module, reflectors, tau, rotation=None, transpose=False, start=None):
        super().__init__(teacher_module, "weight")
        self._start = start  # the [F; 0] a parametrisation registers (right_inverse), then dropped
        self.register_buffer("reflectors", reflectors, persistent=False)
        self.register_buffer("tau", tau, persistent=False)
        self.register_buffer("rotation", rotation, persistent=False)
        self.transpose = transpose  # down_proj: T and W are the transposes of the deployed ones
        self.h = reflectors.shape[1]
        self.released = False

    def release(self) -> None:
        """Drop the complement (another process applies this map, CoordinateAdamW); it is then refused."""
        self.reflectors = self.tau = self.rotation = None
        self.released = True

    def coordinates_shape(self, weight_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(reversed(weight_shape)) if self.transpose else tuple(weight_shape)

    def _check_held(self) -> None:
        if self.released:
            raise LRCError("ComplementPath: this map was released (another process owns its basis changes)")

    def _teacher(self, like: torch.Tensor) -> torch.Tensor:
        return teacher_operand(self.teacher_tensor, like)

    def forward(self, coords: torch.Tensor) -> torch.Tensor:
        self._check_held()
        h = self.h
        f, c = coords[:h], coords[h:]
        if self.rotation is not None:
            c = self.rotation @ c
        padded = torch.cat([c.new_zeros(h, c.shape[1]), c], dim=0)
        complement = torch.ormqr(self.reflectors, self.tau, padded)  # U_perp·C = Q·[0; C]
        t = self._teacher(coords)
        if self.transpose:  # the slice's own product, B·T, in the deployed orientation
            return f.T @ t + complement.T
        return t @ f + complement

    @torch.no_grad()
    def coordinates(self, tensor: torch.Tensor) -> torch.Tensor:
        """The adjoint: a weight-shaped gradient to ``[F; C]`` (``[Tᵀ·g; Oᵀ·U_perpᵀ·g]``), as autograd
        computes it through :meth:`forward`."""
        self._check_held()
        g = tensor.T if self.transpose else tensor
        t = self._teacher(g)
        f = t @ g if self.transpose else t.T @ g
        c = torch.ormqr(self.reflectors, self.tau, g, left=True, transpose=True)[self.h:]
        if self.rotation is not None:
            c = self.rotation.T @ c
        return torch.cat([f, c], dim=0)

    @torch.no_grad()
    def inverse(self, weight: torch.Tensor) -> torch.Tensor:
        """The ``[F; C]`` whose weight is ``weight`` (float64 least squares for F, the teacher
        being full column rank; C exactly, U_perp being orthonormal and orthogonal to T)."""
        self._check_held()
        w = (weight.T if self.transpose else weight).double()
        t = self.teacher_tensor.get().to(w.device, torch.float64)
        t = t.T if self.transpose else t
        q, r = torch.linalg.qr(t)  # least squares by QR (lstsq has no fake-tensor kernel: lrc plan's trace)
        f = torch.linalg.solve_triangular(r, q.T @ w, upper=True)
        c = torch.ormqr(self.reflectors.double(), self.tau.double(), w, left=True, transpose=True)[self.h:]
        if self.rotation is not None:
            c = self.rotation.double().T @ c
        return torch.cat([f, c], dim=0).to(weight.dtype)

    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        """The warm start's exact ``[F; 0]`` when given (``start``), else :meth:`inverse`."""
        start, self._start = self._start, None
        return self.inverse(weight) if start is None else start
