"""Teacher spectral bases: the math of the `teacher SVD` stage (the command is :mod:`lrc.commands.svd`).

For every layer's gate/up/down projection we store the teacher weight's singular basis
on the side the reachability gap lives on, always as a *column-oriented* matrix
``U [d_ff, H]`` with orthonormal columns:

* gate/up (``T [d_ff, H]``): the left singular vectors of T (its column space);
* down (``T [H, d_ff]``): the right singular vectors of T (its row space), i.e. the left
  singular vectors of Tᵀ.

Also stored: the singular values, and the right singular vectors of the embedding matrix
``E [V, H]`` (``embed.V [H, H]``, columns by decreasing singular value), which the
spectral factor init (:mod:`lrc.method.student`) uses as its shared projection. Not stored (it
needs data, not just weights): :func:`activation_basis`, the principal directions of the
teacher's residual stream on calibration tokens, the ``activations`` init's projection.

Precision and determinism: the SVDs run in float64 on the CPU and are stored as float32
safetensors. Each singular vector's sign is fixed so that its largest-magnitude entry is
positive, so the bases are a function of the teacher weights alone.

Complement basis: ``U_perp`` (``d_ff - H`` columns) is NOT the full SVD's; it is the
Householder QR completion of ``U``: with ``U = Q R`` (``torch.geqrf``, float64), Q is the
product of H Householder reflectors, ``Q[:, :H] = U · diag(±1)`` and ``Q[:, H:]`` is an
orthonormal basis of the orthogonal complement. It is deterministic for a given U and is
never materialised (`core`/`randcomp` apply it once per optimiser step by default,
:mod:`lrc.training.optim`): ``U_perp · C`` is computed with ``torch.ormqr`` on ``[0; C]``, which
costs O(d_ff · H · r) per product and stores only the ``[d_ff, H]`` reflectors (same size
as U). At Llama-3.1-8B scale a materialised ``d_ff × d_ff`` basis would be 0.8 GB fp32 per
matrix (×96 matrices); the reflectors are 0.23 GB per matrix, and are rebuilt from U on
load rather than stored.

Measured cost here (one CPU thread): the float64 SVD of one 8192 × 3072 matrix
(Llama-3.2-3B gate) takes 55 s, so `lrc svd` on that teacher is ~77 CPU-minutes (84
matrices; give the rule many threads, or use ``lrc svd --device cuda``); its Householder QR
7 s; one fp32 ``ormqr`` product
with a ``[8192, 1536]`` coordinate block 3.8 s, about twice the matching plain matmul.

Teacher fingerprint: the bases record :func:`teacher_fingerprint`, a SHA-256 of the
weights they are computed from (the embedding and every gate/up/down, as float32 bytes,
with names and shapes; so a bf16 and an fp32 load of one checkpoint agree), and
:func:`load_bases` given the teacher in use refuses bases whose fingerprint differs, naming
the bases file and the teacher they were made from: bases of another teacher with the same
shapes would otherwise be accepted, and `confined` would no longer start from the warm
start. Cost: one pass over those weights at ~1.2 GB/s (measured here), ~8 s at
Llama-3.2-3B scale (10 GB in float32), against ~77 CPU-minutes for the SVDs.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lrc.errors import LRCError
from lrc.io.atomic import atomic_file, write_json_atomic
from lrc.io.checks import check_finite, check_float_dtypes, check_orthonormal, read_headers
from lrc.io.hf import check_safetensors, read_json_object
from lrc.names import MLP_KINDS

BASES_FILE = "bases.safetensors"
BASES_META = "bases.json"


@dataclass
class TeacherBases:
    """Orthonormal bases of a teacher's MLP weights (column-oriented, see module doc)."""

    U: dict[str, torch.Tensor]  # "{layer}.{kind}" -> [d_ff, H]
    S: dict[str, torch.Tensor]  # "{layer}.{kind}" -> [H]
    embed_V: torch.Tensor  # [H, H], right singular vectors of the embedding
    embed_S: torch.Tensor  # [H]
    meta: dict = field(default_factory=dict)
    source: str = "teacher bases"  # how errors name them: the bases file, once loaded
    _reflectors: dict = field(default_factory=dict, repr=False)

    def basis(self, layer: int, kind: str) -> torch.Tensor:
        key = f"{layer}.{kind}"
        if key not in self.U:
            raise LRCError(f"teacher bases have no entry for layer {layer} {kind}_proj")
        return self.U[key]

    def complement(self, layer: int, kind: str, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Householder reflectors and tau (float32, on ``device``) whose Q[:, H:] spans the
        complement of U; the QR runs in float64 on ``device`` (cached per device)."""
        key = (layer, kind, str(device))
        if key not in self._reflectors:
            refl, tau = torch.geqrf(self.basis(layer, kind).to(device, torch.float64))
            self._reflectors[key] = (refl.float(), tau.float())
        return self._reflectors[key]

    def drop_reflector_cache(self) -> None:
        """Forget the cached reflectors (:meth:`complement` recomputes them, the same, when asked)."""
        self._reflectors.clear()

    def check_matches(self, teacher) -> None:
        """Raise when these bases cannot belong to ``teacher`` (layer count or shapes)."""
        cfg = teacher.config
        want = (cfg.intermediate_size, cfg.hidden_size)
        for i in range(cfg.num_hidden_layers):
            for kind in MLP_KINDS:
                u = self.U.get(f"{i}.{kind}")
                if u is None or tuple(u.shape) != want:
                    got = None if u is None else tuple(u.shape)
                    raise LRCError(f"{self.source} do not match the teacher: layer {i} {kind}_proj basis shape "
                                   f"{got}, expected {want}")

    def check_fingerprint(self, teacher) -> None:
        """Raise when these bases were computed from another teacher (see module doc)."""
        recorded = self.meta.get("teacher_fingerprint")
        if recorded is None:
            print(f"warning: {self.source} record no teacher fingerprint (written before fingerprints were recorded): "
                  "cannot check that they belong to this teacher; rerun `lrc svd` to record one", file=sys.stderr)
            return
        actual = teacher_fingerprint(teacher)
        if actual != recorded:
            made_from = self.meta.get("teacher", "a teacher directory not recorded")
            raise LRCError(f"{self.source} were computed from another teacher ({made_from}, weights "
                           f"fingerprint {recorded}) than the teacher in use (fingerprint {actual}); "
                           "rerun `lrc svd` on this teacher")


def _fix_signs(vectors: torch.Tensor) -> torch.Tensor:
    """Flip each column so that its largest-magnitude entry is positive."""
    idx = vectors.abs().argmax(dim=0)
    signs = torch.sign(vectors[idx, torch.arange(vectors.shape[1])])
    signs[signs == 0] = 1
    return vectors * signs


def column_basis(matrix: torch.Tensor, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Left singular vectors (thin, sign-fixed, float64, on the CPU) and singular values."""
    u, s, _ = torch.linalg.svd(matrix.detach().to(device, torch.float64), full_matrices=False)
    return _fix_signs(u).cpu(), s.cpu()


def mlp_teacher_matrix(teacher, layer: int, kind: str) -> torch.Tensor:
    """The teacher's ``kind`` weight, column-oriented: ``[d_ff, H]`` (down is transposed)."""
    w = getattr(teacher.model.layers[layer].mlp, f"{kind}_proj").weight
    return w.T if kind == "down" else w


def embedding_right_basis(teacher, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Right singular vectors [H, H] (sign-fixed, by decreasing value) and values of E."""
    e = teacher.model.embed_tokens.weight.detach().to(device, torch.float64)
    evals, evecs = torch.linalg.eigh(e.T @ e)  # cheaper than the SVD of a [V, H] matrix
    order = torch.argsort(evals, descending=True)
    return _fix_signs(evecs[:, order]).cpu(), evals[order].clamp_min(0).sqrt().cpu()


ACTIVATION_STATISTICS = ("normed", "gained", "stream")


def _stream_readers(teacher) -> list:
    """Every RMSNorm that reads the residual stream: both of each layer's and the final one."""
    layers = teacher.model.layers
    return ([n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
            + [teacher.model.norm])


@torch.no_grad()
def activation_basis(teacher, input_ids: torch.Tensor, *, statistic: str = "normed",
                     batch_size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Principal directions ``[H, H]`` (sign-fixed, by decreasing value) and RMS values of
    the teacher's residual stream where its RMSNorms read it, on ``input_ids [N, L]``.

    The second moment is uncentred (the student projects the stream itself, not its
    deviation from a mean) and pooled over every norm input of every layer. ``normed``
    (default) divides each token's vector by its RMS first, as the norm the stream feeds
    does: each token and layer then weighs the same, and the few massive activations of a
    pretrained model (one dimension at 10⁴ on a few tokens) do not take the top directions.
    ``gained`` also multiplies by each norm's gain (what the projections after it read);
    ``stream`` uses the raw vectors. float64 sums in a fixed order: a function of the
    teacher and the tokens alone.
    """
    if statistic not in ACTIVATION_STATISTICS:
        raise LRCError(f"activation statistic {statistic!r}: choose one of {', '.join(ACTIVATION_STATISTICS)}")
    if input_ids.dim() != 2 or input_ids.numel() == 0:
        raise LRCError("calibration tokens must be a non-empty [rows, seq_len] tensor, got shape "
                       f"{tuple(input_ids.shape)}")
    H = teacher.config.hidden_size
    device = teacher.model.embed_tokens.weight.device
    moment = torch.zeros(H, H, dtype=torch.float64, device=device)
    count = 0

    def accumulate(module, args):
        nonlocal count
        x = args[0].detach().reshape(-1, H).to(torch.float64)
        if statistic != "stream":
            x = x / x.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30)
        if statistic == "gained":
            x = x * module.weight.detach().to(torch.float64)
        moment.add_(x.T @ x)
        count += x.shape[0]

    hooks = [n.register_forward_pre_hook(accumulate) for n in _stream_readers(teacher)]
    try:
        for chunk in input_ids.split(batch_size):
            teacher.model(input_ids=chunk.to(device), use_cache=False)  # the stream only: no head
    finally:
        for h in hooks:
            h.remove()
    evals, evecs = torch.linalg.eigh((moment / count).cpu())
    order = torch.argsort(evals, descending=True)
    return _fix_signs(evecs[:, order]), evals[order].clamp_min(0).sqrt()


def _fingerprinted_weights(teacher):
    yield "embed_tokens", teacher.model.embed_tokens.weight
    for i, layer in enumerate(teacher.model.layers):
        for kind in MLP_KINDS:
            yield f"{i}.{kind}", getattr(layer.mlp, f"{kind}_proj").weight


def teacher_fingerprint(teacher) -> str:
    """SHA-256 of the weights the bases are computed from (float32 bytes, names, shapes)."""
    h = hashlib.sha256()
    for name, w in _fingerprinted_weights(teacher):
        t = w.detach().to("cpu", torch.float32).contiguous()
        h.update(f"{name}:{list(t.shape)};".encode())
        h.update(t.numpy())
    return "sha256:" + h.hexdigest()


def compute_bases(teacher, device="cpu") -> TeacherBases:
    """All MLP bases of ``teacher``; float64 on ``device`` (CPU by default: LAPACK)."""
    U, S = {}, {}
    for i in range(teacher.config.num_hidden_layers):
        for kind in MLP_KINDS:
            u, s = column_basis(mlp_teacher_matrix(teacher, i, kind), device)
            U[f"{i}.{kind}"], S[f"{i}.{kind}"] = u.float().contiguous(), s.float()
    v, s = embedding_right_basis(teacher, device)
    meta = {
        "model_type": teacher.config.model_type,
        "hidden_size": teacher.config.hidden_size,
        "intermediate_size": teacher.config.intermediate_size,
        "num_hidden_layers": teacher.config.num_hidden_layers,
        "teacher_fingerprint": teacher_fingerprint(teacher),
        "precision": f"svd in float64 on {torch.device(device).type}, stored float32",
        "sign_convention": "largest-magnitude entry of each singular vector positive",
        "orientation": "column-oriented [d_ff, H]: gate/up left singular vectors, down right singular vectors",
        "complement": "Householder QR completion of U (torch.geqrf), applied with torch.ormqr",
    }
    return TeacherBases(U=U, S=S, embed_V=v.float().contiguous(), embed_S=s.float(), meta=meta)


def save_bases(bases: TeacherBases, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {f"layers.{k}.U": v for k, v in bases.U.items()}
    tensors |= {f"layers.{k}.S": v for k, v in bases.S.items()}
    tensors |= {"embed.V": bases.embed_V, "embed.S": bases.embed_S}
    with atomic_file(out / BASES_FILE) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    write_json_atomic(out / BASES_META, bases.meta)
    return out


def _read_bases_meta(path: Path) -> dict:
    if not path.is_file():
        return {}
    return read_json_object(path, "teacher bases metadata")


def _check_bases_tensors(tensors: dict, U: dict, S: dict, path: Path, meta: dict) -> None:
    """Every layer's U and S, at one shape ([d_ff, H] and [H], embed [H, H] and [H]), finite, U and
    embed.V orthonormal (:func:`lrc.io.checks.check_orthonormal`); each refusal names the file and matrix."""
    layers = meta.get("num_hidden_layers")
    want = {f"{i}.{kind}" for i in range(layers) for kind in MLP_KINDS} if isinstance(layers, int) else set(U)
    for what, have in (("U", U), ("S", S)):
        if set(have) != want:
            odd = sorted(f"layers.{k}.{what}" for k in set(have) ^ want)
            raise LRCError(f"teacher bases file {path}: missing or unexpected bases {odd[:5]} "
                           f"(for {len(want) // len(MLP_KINDS)} layers)")
    H = tensors["embed.V"].shape[-1]
    d_ff = meta.get("intermediate_size") or U[min(U)].shape[0]
    shapes = {f"layers.{k}.U": (d_ff, H) for k in U} | {f"layers.{k}.S": (H,) for k in S}
    shapes |= {"embed.V": (meta.get("hidden_size") or H, H), "embed.S": (H,)}
    for name, shape in shapes.items():
        if tuple(tensors[name].shape) != shape:
            raise LRCError(f"teacher bases file {path}: {name} has shape {list(tensors[name].shape)}, "
                           f"expected {list(shape)}")
    check_finite(tensors.items(), {}, "teacher bases", path)
    for name in [f"layers.{k}.U" for k in sorted(U)] + ["embed.V"]:
        check_orthonormal(tensors[name], name, path)


def load_bases(directory: str | Path, teacher=None) -> TeacherBases:
    """The bases saved in ``directory``; checked against ``teacher`` (shapes and
    fingerprint) when it is given. Truncated or corrupt files are LRCErrors naming them, and so are
    tensors not floating point, missing, misshapen, not finite or not orthonormal (:mod:`lrc.io.checks`)."""
    d = Path(directory)
    path = d / BASES_FILE
    if not path.is_file():
        raise LRCError(f"no teacher bases in {d} (missing {BASES_FILE}; run `lrc svd`)")
    headers = read_headers([check_safetensors(path, "teacher bases")])
    check_float_dtypes(headers, "teacher bases")
    tensors = load_file(str(path))
    meta = _read_bases_meta(d / BASES_META)
    U = {k[len("layers."):-len(".U")]: v for k, v in tensors.items() if k.startswith("layers.") and k.endswith(".U")}
    S = {k[len("layers."):-len(".S")]: v for k, v in tensors.items() if k.startswith("layers.") and k.endswith(".S")}
    missing = [k for k in ("embed.V", "embed.S") if k not in tensors]
    if missing or not U:
        raise LRCError(f"teacher bases file {path} lacks {missing or 'the layer bases'}: not written by `lrc svd`")
    _check_bases_tensors(tensors, U, S, path, meta)
    bases = TeacherBases(U=U, S=S, embed_V=tensors["embed.V"], embed_S=tensors["embed.S"], meta=meta,
                         source=f"teacher bases {path}")
    if teacher is not None:
        bases.check_matches(teacher)
        bases.check_fingerprint(teacher)
    return bases
