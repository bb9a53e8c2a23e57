"""The parameterisations of METHOD.md §1 and §3, as ``torch.nn.utils.parametrize`` modules.

Each module maps the trainable tensor stored in ``parametrizations.weight.original`` to
the deployed weight of a real transformers ``nn.Linear`` / ``nn.Embedding``. The teacher
weights are read from the teacher module itself (:class:`lrc.method.teacher_tensor.TeacherTensor`: no copy, the
teacher's dtype); the bases are *non-persistent* buffers. Neither is ever trained or
written into an LRC state (they are the teacher's, and rebuilt from its bases).

Plain LRC factors (every weight of the `slice` student):

* :class:`TeacherTimesFactor`  ``W = T · A``   (q/k/v, ``A [H, r]``)
* :class:`FactorTimesTeacher`  ``W = B · T``   (o, down, ``B [r, H]``)
* :class:`TeacherTimesFactorT` ``W = T · Pᵀ``  (gate/up, embedding, head, ``P [r, H]``)

The arms change only gate/up/down. Their trainable tensors are stored column-oriented,
``[d_ff, r]``; for down_proj (deployed ``[r, d_ff]``) the module returns the transpose,
so the bases used are the teacher's right singular vectors (row space):

* `dense`: no parametrisation, a plain trainable ``nn.Parameter`` = merged warm start.
* `core` (:class:`lrc.method.complement_path.ComplementPath`, docs/method.md §3 reading (a)):
  ``W = T·F + U_perp·C``, LRC's own factor F kept (trainable, from the warm start) and a
  zero-initialised path in the teacher-SVD complement U_perp (the Householder completion of
  the teacher basis, see :mod:`lrc.method.spectral`).
* `randcomp`: as `core` with ``U_perp · O``, O a seeded Haar-random orthogonal
  ``(d_ff-H)²`` matrix (materialised: 105 MB fp32 per matrix at Llama-3.2-3B scale).
* `coreortho` (:class:`SpectralCoordinates`, reading (b)): ``W = U_r·A + U_perp·C`` in orthonormal
  coordinates, ``A = U_rᵀ W0``, ``C = 0``: the dense function class with AdamW run on ``[A; C]``.

Where core/coreortho/randcomp's basis change runs (``core_impl`` of :func:`apply_arm`, recorded
in ``lrc.json``):

* ``"optimizer"`` (default): the training model holds the deployed W as a plain trainable
  weight (the dense arm's forward and backward, nothing rebuilt) with the
  arm's map attached as its coordinate map (:data:`lrc.names.COORDINATES_ATTR`);
  :class:`lrc.training.optim.CoordinateAdamW` maps the gradient to the coordinates (the map's
  adjoint, ``coordinates``), keeps AdamW's moments and the coordinates there and writes W back,
  once per optimiser step: two ``ormqr`` products per matrix and step instead of two per
  micro-batch. Same trajectory as the parametrised arm (tests/training/test_coordinates.py,
  tests/method/test_complement_path.py).
* ``"parametrized"``: the reference: ``[A; C]`` is the stored tensor of a parametrisation,
  W rebuilt in every forward (and its transpose product in every backward).

The Householder QR of each basis and randcomp's rotations are computed (float64) on the
student's device when the arm is applied, also on every :func:`lrc.method.student.load_lrc_state`:
on a GPU this is seconds; on one CPU thread at Llama-3.2-3B scale about 7 s per matrix
for the QR (84 matrices), more for the 5120² rotations. Results agree across devices up to
float rounding, not bitwise.
* `confined` (:class:`ConfinedToTeacherSpace`): ``W = U_r U_rᵀ C``, ``C = W0``.

In the full-reach arms (dense/core/coreortho/randcomp, and confined, whose C is no longer a factor
P_down either) the warm start's P_down is kept, frozen, as the persistent buffer
``mlp.lrc_down_factor`` [r, H]: the map that builds the mlp-out clone target
(METHOD.md §3). Trainable numbers per MLP matrix: H·r (slice), d_ff·r (all others).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

from lrc.errors import LRCError
from lrc.method.complement_path import ComplementPath
from lrc.method.spectral import compute_bases
from lrc.method.teacher_tensor import ReadsTeacher, teacher_operand
from lrc.names import ARMS, COORDINATES_ATTR, MLP_KINDS
from lrc.options import check_choice

DOWN_FACTOR_BUFFER = "lrc_down_factor"
# The arms built on the teacher bases (the full-reach arms: lrc.names.FULL_REACH_ARMS).
BASIS_ARMS = ("core", "coreortho", "confined", "randcomp")
# The arms trained in other coordinates of the dense function class, whose basis change runs in
# the optimiser step or as a parametrisation (``core_impl``, see the module doc).
COORDINATE_ARMS = ("core", "coreortho", "randcomp")
# LRC's factor kept, the teacher's complement added (lrc.method.complement_path): docs/method.md
# §3 reading (a). `coreortho` is reading (b), the orthonormal coordinates (SpectralCoordinates).
COMPLEMENT_ARMS = ("core", "randcomp")
CORE_IMPLS = ("optimizer", "parametrized")


class TeacherTimesFactor(ReadsTeacher):
    """``W = T · A`` with T the teacher's frozen weight (q/k/v projections).

    ``rows(factor, start, stop)`` is ``forward(factor)[start:stop]`` from that block of the operand
    that holds W's rows (here T's), and ``num_rows`` W's row count: a process of a data-parallel
    run builds its block only (:mod:`lrc.training.weight_build`). Likewise in the two classes below."""

    def forward(self, factor: torch.Tensor) -> torch.Tensor:
        return teacher_operand(self.teacher_tensor, factor) @ factor

    def rows(self, factor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return teacher_operand(self.teacher_tensor, factor)[start:stop] @ factor

    def num_rows(self, factor: torch.Tensor) -> int:
        return self.frozen.shape[0]


class FactorTimesTeacher(ReadsTeacher):
    """``W = B · T`` with T the teacher's frozen weight (o and down projections)."""

    def forward(self, factor: torch.Tensor) -> torch.Tensor:
        return factor @ teacher_operand(self.teacher_tensor, factor)

    def rows(self, factor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return factor[start:stop] @ teacher_operand(self.teacher_tensor, factor)

    def num_rows(self, factor: torch.Tensor) -> int:
        return factor.shape[0]


class TeacherTimesFactorT(TeacherTimesFactor):
    """``W = T · Pᵀ`` with T the teacher's frozen weight (gate/up projections, embedding, head)."""

    def forward(self, factor: torch.Tensor) -> torch.Tensor:
        return teacher_operand(self.teacher_tensor, factor) @ factor.T

    def rows(self, factor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return teacher_operand(self.teacher_tensor, factor)[start:stop] @ factor.T


class SpectralCoordinates(nn.Module):
    """``W = U_r·A + U_perp·C`` on the stored ``[A; C]`` ([d_ff, r]); `coreortho`.

    ``U_perp`` is ``Q[:, H:]`` of the Householder reflectors ``(reflectors, tau)`` of U_r,
    never materialised: applied with ``torch.ormqr``. ``rotation`` (O) is None for `core`.
    """

    orthogonal = True  # CoordinateAdamW: the adjoint is the inverse, and clipping sees the same norm

    def __init__(self, basis, reflectors, tau, rotation=None, transpose=False):
        super().__init__()
        self.register_buffer("basis", basis, persistent=False)
        self.register_buffer("reflectors", reflectors, persistent=False)
        self.register_buffer("tau", tau, persistent=False)
        self.register_buffer("rotation", rotation, persistent=False)
        self.transpose = transpose
        self.h = basis.shape[1]
        self.released = False

    def release(self) -> None:
        """Drop every basis tensor: this process never applies the map (another one owns its
        basis changes, :class:`lrc.training.optim.CoordinateAdamW`); it is then refused."""
        self.basis = self.reflectors = self.tau = self.rotation = None
        self.released = True

    def coordinates_shape(self, weight_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of ``[A; C]`` for a weight of ``weight_shape`` (the weight's, transposed for down)."""
        return tuple(reversed(weight_shape)) if self.transpose else tuple(weight_shape)

    def _check_held(self) -> None:
        if getattr(self, "released", False):
            raise LRCError("SpectralCoordinates: this map was released (another process owns its basis changes)")

    def _complement(self, c: torch.Tensor) -> torch.Tensor:
        """``U_perp · C`` = ``Q · [0; C]`` (ormqr)."""
        h = self.h
        padded = torch.cat([c.new_zeros(h, c.shape[1]), c], dim=0)
        return torch.ormqr(self.reflectors, self.tau, padded)

    def forward(self, coords: torch.Tensor) -> torch.Tensor:
        self._check_held()
        h = self.h
        a, c = coords[:h], coords[h:]
        if self.rotation is not None:
            c = self.rotation @ c
        w = self.basis @ a + self._complement(c)
        return w.T if self.transpose else w

    @torch.no_grad()
    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        w = weight.T if self.transpose else weight
        a = self.basis.T @ w
        c = torch.zeros(w.shape[0] - a.shape[0], w.shape[1], dtype=w.dtype, device=w.device)
        return torch.cat([a, c], dim=0)

    @torch.no_grad()
    def coordinates(self, tensor: torch.Tensor) -> torch.Tensor:
        """The adjoint (= inverse) of :meth:`forward`: a weight-shaped tensor to ``[A; C]``.

        For a gradient it is what autograd computes through :meth:`forward`
        (``basisᵀ·g`` and, through ``ormqr``'s backward, ``Oᵀ·(Qᵀ·g)[H:]``), in one pass.
        """
        self._check_held()
        g = tensor.T if self.transpose else tensor
        h = self.h
        a = self.basis.T @ g
        c = torch.ormqr(self.reflectors, self.tau, g, left=True, transpose=True)[h:]
        if self.rotation is not None:
            c = self.rotation.T @ c
        return torch.cat([a, c], dim=0)


    def inverse(self, weight: torch.Tensor) -> torch.Tensor:
        """The coordinates of ``weight``: the adjoint, the map being orthogonal."""
        return self.coordinates(weight)


class ConfinedToTeacherSpace(nn.Module):
    """``W = U_r U_rᵀ C`` on the stored C [d_ff, r] (`confined`)."""

    def __init__(self, basis, transpose=False):
        super().__init__()
        self.register_buffer("basis", basis, persistent=False)
        self.transpose = transpose

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        w = self.basis @ (self.basis.T @ c)
        return w.T if self.transpose else w

    @torch.no_grad()
    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        return (weight.T if self.transpose else weight).clone()


def random_rotation(size: int, seed: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """A Haar-random orthogonal ``[size, size]`` matrix: seeded CPU Gaussian, float64 QR on ``device``."""
    g = torch.Generator().manual_seed(seed)
    gauss = torch.randn(size, size, generator=g, dtype=torch.float64).to(device)
    q, r = torch.linalg.qr(gauss)
    return (q * torch.sign(torch.diagonal(r))).to(dtype)


def arm_of(student) -> str:
    info = getattr(student, "lrc_info", None)
    if info is None:
        raise LRCError("not an LRC student (built by lrc.method.student.build_student)")
    return info["arm"]


def down_clone_map(mlp) -> torch.Tensor:
    """P_down [r, H]: the map from teacher to student width used by the mlp-out clone target.

    The live factor in the `slice` arm (so it gets gradient from the target too), the
    frozen warm-start copy in every other arm.
    """
    frozen = getattr(mlp, DOWN_FACTOR_BUFFER, None)
    if frozen is not None:
        return frozen
    return mlp.down_proj.parametrizations.weight.original


def _arm_module(arm, bases, teacher, layer, k, kind, w0, seed, start=None):
    """The parametrisation module of one MLP matrix for ``arm`` (a basis arm); ``start``: a
    complement path's step-0 ``[F; 0]``."""
    device = w0.device
    transpose = kind == "down"
    if arm == "confined":
        return ConfinedToTeacherSpace(bases.basis(layer, kind).to(device, w0.dtype), transpose=transpose)
    refl, tau = (t.to(w0.dtype) for t in bases.complement(layer, kind, device))
    rotation = None
    if arm == "randcomp":
        size = refl.shape[0] - refl.shape[1]
        rotation = random_rotation(size, seed * 1000 + 3 * layer + k, w0.dtype, device)
    if arm in COMPLEMENT_ARMS:
        teacher_proj = getattr(teacher.model.layers[layer].mlp, f"{kind}_proj")
        return ComplementPath(teacher_proj, refl, tau, rotation, transpose, start=start)
    basis = bases.basis(layer, kind).to(device, w0.dtype)
    return SpectralCoordinates(basis, refl, tau, rotation, transpose)


def apply_arm(student, teacher, arm: str, *, bases=None, seed: int = 0, core_impl: str = "optimizer") -> None:
    """Re-parameterise the MLP matrices of a `slice` student as ``arm``, in place.

    The deployed weights (hence the function) are those of the warm start (the complement
    arms and dense exactly; the others up to float rounding in the basis products). ``bases``
    (:class:`lrc.method.spectral.TeacherBases`) is needed for the basis arms and is computed from
    the teacher when omitted. ``seed`` chooses randcomp's random complement basis (layer l,
    matrix k uses ``seed * 1000 + 3 * l + k``).

    ``core_impl`` (core/coreortho/randcomp only): ``"parametrized"`` registers the arm's map
    as the weight's parametrisation (trainable coordinates, W rebuilt in every forward);
    ``"optimizer"`` (default) keeps W as a plain trainable weight and attaches the map as its
    coordinate map (:data:`lrc.names.COORDINATES_ATTR`), so :class:`lrc.training.optim.CoordinateAdamW`
    runs AdamW in the coordinates once per step: the same trajectory, at dense forward cost.
    """
    check_choice("arm", arm, ARMS)
    check_choice("core_impl", core_impl, CORE_IMPLS)
    current = arm_of(student)
    if current != "slice":
        raise LRCError(f"apply_arm needs a slice student, this one is already arm {current!r}")
    if arm == "slice":
        return
    if arm in BASIS_ARMS:
        if bases is None:
            bases = compute_bases(teacher)
        bases.check_matches(teacher)
    in_optimizer = arm in COORDINATE_ARMS and core_impl == "optimizer"
    for i, layer in enumerate(student.model.layers):
        mlp = layer.mlp
        p_down = mlp.down_proj.parametrizations.weight.original.detach().clone()
        for k, kind in enumerate(MLP_KINDS):
            proj = getattr(mlp, f"{kind}_proj")
            w0 = proj.weight.detach().clone()
            factor = proj.parametrizations.weight.original.detach()  # P [r, H] (gate/up), B [r, H] (down)
            start = None
            if arm in COMPLEMENT_ARMS:  # [F; 0], F = the factor, column-oriented
                start = torch.cat([factor.T, factor.new_zeros(w0.numel() // factor.shape[0] - factor.shape[1],
                                                              factor.shape[0])]).contiguous()
            parametrize.remove_parametrizations(proj, "weight", leave_parametrized=False)
            if arm == "dense":
                proj.weight = nn.Parameter(w0, requires_grad=True)
                continue
            module = _arm_module(arm, bases, teacher, i, k, kind, w0, seed, start=start)
            if in_optimizer:
                w = w0  # the complement path at [F; 0] is the warm start's weight itself
                if arm not in COMPLEMENT_ARMS:
                    with torch.no_grad():  # exactly the parametrised arm's step-0 weight
                        w = module(module.right_inverse(w0)).contiguous()
                proj.weight = nn.Parameter(w, requires_grad=True)
                setattr(proj, COORDINATES_ATTR, module)  # a submodule: moves with .to(), never saved
                continue
            proj.weight = nn.Parameter(w0, requires_grad=True)
            parametrize.register_parametrization(proj, "weight", module, unsafe=True)
        mlp.register_buffer(DOWN_FACTOR_BUFFER, p_down.requires_grad_(False), persistent=True)
    student.lrc_info["arm"] = arm
    student.lrc_info["arm_seed"] = seed
    if arm in COORDINATE_ARMS:
        student.lrc_info["core_impl"] = core_impl
