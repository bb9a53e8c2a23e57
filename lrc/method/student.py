"""Build the Low-Rank Clone student from a Hugging Face teacher, and save/load its state.

The student is a real ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` built from the teacher's
config with ``hidden_size = r``, ``head_dim`` written explicitly (= the teacher's) and
``rms_norm_eps`` = the eps it is trained with (default: the teacher's, so the deployed
eps is the trained one). Every weight except the norms is a parametrisation
(:mod:`lrc.method.reach`, ``unsafe=True``) whose stored tensor is the LRC factor of METHOD.md §1;
the parametrisation reads the teacher weight from the teacher module itself
(:class:`lrc.method.teacher_tensor.TeacherTensor`): no copy, in the teacher's dtype and on its device, so
the teacher must be where the student is (a bf16 teacher under bf16 autocast: each teacher
weight held once, nothing cast per forward).

* Tied teachers: the head gets its own Parameter before registering, then both
  parametrisations share one factor ``P_emb`` (DESIGN.md "Known traps").
* Untied teachers: the head has its own factor.
* Qwen2's q/k/v biases are copied from the teacher and frozen. Norms are fresh ones.
* Trainable (``requires_grad``): exactly the factors and the norm weights (plus, after
  :func:`lrc.method.reach.apply_arm`, the arm's MLP tensors).

Factor init: ``"normal"`` = the reference's N(0, init_std) for every factor (seeded);
``"spectral"`` and ``"activations"`` = one shared orthonormal projection ``V_r [H, r]``: the
student starts as the teacher with its residual stream projected onto r directions. They
differ only in the directions: ``spectral``, the top-r right singular vectors of the
teacher's embedding matrix (``bases.embed_V``, :mod:`lrc.method.spectral`); ``activations``, the
top-r principal directions of the teacher's RMS-normalised residual stream on calibration
tokens (:func:`lrc.method.spectral.activation_basis`, in the spirit of RED). Factors that write
into the residual stream (embedding, o, down) are ``V_rᵀ``; factors that read it through an
RMSNorm (q/k/v, gate/up, and an untied head) are ``diag(g)·V_r·sqrt(H/r)`` with g the
teacher's norm gain there (the student's own norms start at 1) and sqrt(H/r) the change of
an RMS over r instead of H coordinates when the stream's energy lies in the span.

A tied head shares ``V_rᵀ`` with the embedding, so the final norm gain g cannot go into a
factor; the student's final norm must carry it, and a norm gain is diagonal in the
student's coordinates while ``V_rᵀ·diag(g)·V_r`` is not. Only span(V_r) matters, though
(every other student norm starts at 1, which commutes with rotations), so for a tied
teacher V_r is rotated within its span to the eigenvectors W of ``V_rᵀ·diag(g)·V_r = W Λ
Wᵀ`` and the final norm starts at ``Λ·sqrt(H/r)``: the head then computes ``E·Π·diag(g)·Π``
(Π = V_r·V_rᵀ), the gain compressed to the span. At r = H this is the teacher exactly (up to
rotation), tied or untied.

LRC state directory: ``student.safetensors`` (trainable tensors, frozen biases, the
full-reach arms' P_down buffer; shared tensors stored once) and ``lrc.json`` (arm, r, eps,
seed and the caller's metadata); no teacher weight is ever written. For core/randcomp,
``lrc.json`` records ``core_impl``: ``optimizer`` states hold the deployed MLP weights
(``mlp.*_proj.weight``, what the run trained and merges bitwise), ``parametrized`` states
(and states without the key, written before it existed) hold ``[A; C]``
(``mlp.*_proj.parametrizations.weight.original``); :func:`load_lrc_state` rebuilds the one
recorded, and refuses (:mod:`lrc.io.checks`) a stored tensor that is not floating point, not the
rebuilt student's, of another shape, missing, or not finite.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from torch import nn
from torch.nn.utils import parametrize
from transformers.initialization import no_init_weights

from lrc.errors import LRCError
from lrc.io.atomic import atomic_file, write_text_atomic
from lrc.io.checks import check_against, check_finite, check_float_dtypes, read_headers
from lrc.io.hf import (
    SUPPORTED_MODEL_TYPES,
    check_safetensors,
    freeze_teacher,
    read_json_object,
    trainable_parameters,  # noqa: F401  (re-exported: the tests' import)
)
from lrc.method.reach import (
    ARMS,
    FactorTimesTeacher,
    TeacherTimesFactor,
    TeacherTimesFactorT,
    apply_arm,
)
from lrc.method.spectral import activation_basis, embedding_right_basis
from lrc.options import check_choice

INITS = ("normal", "spectral", "activations")
STATE_FILE = "student.safetensors"
STATE_META = "lrc.json"
FACTOR_DTYPE = torch.float32


def check_teacher(teacher) -> None:
    model_type = getattr(teacher.config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise LRCError(f"unsupported teacher model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    layer = teacher.model.layers[0]
    # LRC defines no student form for biases on the residual side (o_proj, down_proj).
    for name, mod in (("o_proj", layer.self_attn.o_proj), ("gate_proj", layer.mlp.gate_proj),
                      ("down_proj", layer.mlp.down_proj)):
        if mod.bias is not None:
            raise LRCError(f"teacher {name} has a bias (attention_bias/mlp_bias): not supported by LRC students")


def teacher_head_dim(config) -> int:
    head_dim = getattr(config, "head_dim", None)
    return int(head_dim) if head_dim else config.hidden_size // config.num_attention_heads


def student_config(teacher_config, hidden_size: int, norm_eps: float | None = None):
    """The teacher's config with hidden size r, explicit head_dim and the trained eps."""
    if not isinstance(hidden_size, int) or isinstance(hidden_size, bool) or hidden_size < 1:
        raise LRCError(f"student hidden size must be a positive integer, got {hidden_size!r}")
    H = teacher_config.hidden_size
    if hidden_size >= H:
        raise LRCError(f"student hidden size r={hidden_size} must be smaller than the teacher's hidden size {H}")
    if norm_eps is not None and not norm_eps > 0:
        raise LRCError(f"norm_eps must be positive, got {norm_eps!r}")
    cfg = copy.deepcopy(teacher_config)
    cfg.head_dim = teacher_head_dim(teacher_config)
    cfg.hidden_size = hidden_size
    if norm_eps is not None:
        cfg.rms_norm_eps = float(norm_eps)
    return cfg


def _frozen(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(FACTOR_DTYPE)


def _register(module: nn.Module, factor: torch.Tensor, param_module: nn.Module) -> None:
    module.weight = nn.Parameter(factor.contiguous(), requires_grad=True)
    parametrize.register_parametrization(module, "weight", param_module, unsafe=True)


def spectral_projection(teacher, r: int, bases=None) -> torch.Tensor:
    """``V_r [H, r]``: the top-r right singular vectors of the teacher's embedding matrix."""
    H = teacher.config.hidden_size
    if bases is not None:
        if tuple(bases.embed_V.shape) != (H, H):
            raise LRCError(f"spectral init: embedding basis has shape {tuple(bases.embed_V.shape)}, "
                           f"teacher hidden size is {H}")
        v = bases.embed_V
    else:
        v = embedding_right_basis(teacher)[0]
    return v[:, :r].to(FACTOR_DTYPE).contiguous()


def init_projection(teacher, r: int, init: str, bases=None, calibration=None) -> torch.Tensor:
    """``V_r [H, r]`` (orthonormal columns) of the ``spectral`` or ``activations`` init."""
    if init == "spectral":
        return spectral_projection(teacher, r, bases)
    if calibration is None:
        raise LRCError("activations init needs calibration tokens (build_student(..., calibration=input_ids))")
    return activation_basis(teacher, calibration)[0][:, :r].to(FACTOR_DTYPE).contiguous()


def fold_tied_head_gain(v: torch.Tensor, gain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(V_r·W, Λ)`` with ``V_rᵀ·diag(gain)·V_r = W·diag(Λ)·Wᵀ`` (float64 eigh, signs fixed):
    the same span in the basis where the final norm gain is diagonal (module doc)."""
    v64 = v.double()
    evals, w = torch.linalg.eigh(v64.T @ (gain.detach().to("cpu", torch.float64)[:, None] * v64))
    idx = w.abs().argmax(dim=0)  # sign convention of lrc.method.spectral: largest entry positive
    w = w * torch.sign(w[idx, torch.arange(w.shape[1])])
    return (v64 @ w).to(FACTOR_DTYPE).contiguous(), evals.to(FACTOR_DTYPE)


class _FactorInit:
    """Fresh factors: ``input_side(gain)`` ([H, r], read the residual stream through a norm)
    and ``output_side()`` ([r, H], write into it / embed); ``final_gain``: the student's
    final norm weight to start from (a tied projection init), else None (ones)."""

    def __init__(self, teacher, r, init, init_std, bases, seed, calibration=None):
        self.H, self.r, self.init, self.std = teacher.config.hidden_size, r, init, init_std
        self.g = torch.Generator().manual_seed(seed)
        self.v = self.final_gain = None
        if init != "normal":
            self.v = init_projection(teacher, r, init, bases, calibration)
            if getattr(teacher.config, "tie_word_embeddings", False):
                self.v, lam = fold_tied_head_gain(self.v, teacher.model.norm.weight)
                self.final_gain = lam * (self.H / r) ** 0.5

    def _normal(self, *shape):
        return torch.randn(*shape, generator=self.g, dtype=FACTOR_DTYPE) * self.std

    def input_side(self, gain: torch.Tensor | None) -> torch.Tensor:
        if self.v is None:
            return self._normal(self.H, self.r)
        # diag(g) V_r sqrt(H/r): the teacher's norm gain, and the RMS of an r-vector that
        # carries all of an H-vector's energy being sqrt(H/r) larger.
        g = torch.ones(self.H) if gain is None else gain.detach().to("cpu", FACTOR_DTYPE)
        return (g[:, None] * self.v) * (self.H / self.r) ** 0.5

    def output_side(self) -> torch.Tensor:
        return self._normal(self.r, self.H) if self.v is None else self.v.T.clone()

def build_student(teacher, hidden_size: int, *, init: str = "normal", init_std: float = 0.02, bases=None, seed: int = 0,
                  norm_eps: float | None = None, calibration: torch.Tensor | None = None):
    """The plain-LRC (`slice`) student of width ``hidden_size`` for ``teacher``.

    ``calibration``: token ids ``[N, L]`` the ``activations`` init runs the teacher on.

    Freezes ``teacher``: the student's parametrisations read its weights (the teacher's own
    tensors, :class:`lrc.method.teacher_tensor.TeacherTensor`), and this is where an LRC run's teacher is
    frozen, once (:mod:`lrc.io.hf`)."""
    check_teacher(teacher)
    check_choice("init", init, INITS)
    freeze_teacher(teacher)
    cfg = student_config(teacher.config, hidden_size, norm_eps)
    # Every weight is replaced below (factors, ones, the teacher's biases): skip HF's init.
    with no_init_weights():
        student = type(teacher)(cfg).to(FACTOR_DTYPE)
    device = teacher.model.embed_tokens.weight.device
    make = _FactorInit(teacher, hidden_size, init, init_std, bases, seed, calibration)

    for s_layer, t_layer in zip(student.model.layers, teacher.model.layers):
        s_attn, t_attn = s_layer.self_attn, t_layer.self_attn
        attn_gain, mlp_gain = t_layer.input_layernorm.weight, t_layer.post_attention_layernorm.weight
        for name in ("q_proj", "k_proj", "v_proj"):
            s_proj, t_proj = getattr(s_attn, name), getattr(t_attn, name)
            _register(s_proj, make.input_side(attn_gain), TeacherTimesFactor(t_proj))
            if t_proj.bias is not None:
                s_proj.bias = nn.Parameter(_frozen(t_proj.bias).clone(), requires_grad=False)
        _register(s_attn.o_proj, make.output_side(), FactorTimesTeacher(t_attn.o_proj))
        s_mlp, t_mlp = s_layer.mlp, t_layer.mlp
        _register(s_mlp.gate_proj, make.input_side(mlp_gain).T, TeacherTimesFactorT(t_mlp.gate_proj))
        _register(s_mlp.up_proj, make.input_side(mlp_gain).T, TeacherTimesFactorT(t_mlp.up_proj))
        _register(s_mlp.down_proj, make.output_side(), FactorTimesTeacher(t_mlp.down_proj))

    emb_factor = make.output_side()
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    # Untie the Parameter objects first: registering rewrites the stored tensor in place.
    student.lm_head.weight = nn.Parameter(torch.empty(0))
    _register(student.model.embed_tokens, emb_factor, TeacherTimesFactorT(teacher.model.embed_tokens))
    _register(student.lm_head, emb_factor.clone() if tied else make.input_side(teacher.model.norm.weight).T,
              TeacherTimesFactorT(teacher.lm_head))
    if tied:
        student.lm_head.parametrizations.weight.original = student.model.embed_tokens.parametrizations.weight.original

    with torch.no_grad():
        for name, p in student.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
        if make.final_gain is not None:
            student.model.norm.weight.copy_(make.final_gain)
    for name, p in student.named_parameters():
        p.requires_grad_(name.endswith(".original") or "norm" in name)
    student.lrc_info = {
        "arm": "slice",
        "arm_seed": seed,
        "student_hidden": hidden_size,
        "teacher_hidden": teacher.config.hidden_size,
        "model_type": cfg.model_type,
        "init": init,
        "init_std": init_std,
        "seed": seed,
        "norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": tied,
    }
    if init == "activations":
        student.lrc_info["init_calibration_tokens"] = int(calibration.numel())
    return student.to(device).eval()


def save_lrc_state(student, out_dir: str | Path, **meta) -> Path:
    """Write ``student.safetensors`` and ``lrc.json`` into ``out_dir`` (atomically, per file)."""
    info = getattr(student, "lrc_info", None)
    if info is None:
        raise LRCError("save_lrc_state: not an LRC student (built by lrc.method.student.build_student)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / STATE_FILE) as tmp:
        save_model(student, str(tmp))  # stores a shared (tied) factor once
    record = dict(info) | {"meta": meta}
    write_text_atomic(out / STATE_META, json.dumps(record, indent=2, default=str) + "\n")
    return out


def read_lrc_meta(state_dir: str | Path) -> dict:
    path = Path(state_dir) / STATE_META
    if not path.is_file():
        raise LRCError(f"{state_dir} is not an LRC state directory (missing {STATE_META})")
    info = read_json_object(path, "LRC state metadata")
    missing = [k for k in ("arm", "student_hidden", "norm_eps") if k not in info]
    if missing:
        raise LRCError(f"LRC state metadata {path} lacks {', '.join(missing)}")
    return info


def load_lrc_state(state_dir: str | Path, teacher, bases=None):
    """Rebuild the student saved in ``state_dir`` (same arm) and load its trained values."""
    info = read_lrc_meta(state_dir)
    arm = info.get("arm")
    if arm not in ARMS:
        raise LRCError(f"{state_dir}/{STATE_META}: unknown arm {arm!r}")
    if info.get("teacher_hidden") != teacher.config.hidden_size or info.get("model_type") != teacher.config.model_type:
        raise LRCError(
            f"{state_dir} was trained from a {info.get('model_type')} teacher of hidden size "
            f"{info.get('teacher_hidden')}, not this {teacher.config.model_type} teacher of hidden size "
            f"{teacher.config.hidden_size}"
        )
    path = Path(state_dir) / STATE_FILE  # checked before the (costly) rebuild
    if not path.is_file():
        raise LRCError(f"{state_dir} has no {STATE_FILE}")
    check_safetensors(path, "LRC student state")
    headers = read_headers([path])
    check_float_dtypes(headers, "LRC student state")
    student = build_student(teacher, info["student_hidden"], init="normal", seed=info.get("seed", 0),
                            norm_eps=info["norm_eps"])
    # States written before the optimiser-step basis change hold core/randcomp's [A; C].
    apply_arm(student, teacher, arm, bases=bases, seed=info.get("arm_seed", 0),
              core_impl=info.get("core_impl", "parametrized"))
    for key in ("init", "init_std", "seed"):
        if key in info:
            student.lrc_info[key] = info[key]
    state = student.state_dict()
    check_against(state, headers, f"LRC student state ({arm} student)")
    missing, unexpected = load_model(student, str(path), strict=False,
                                     device=str(teacher.model.embed_tokens.weight.device))
    if missing or unexpected:
        raise LRCError(f"{path} does not match the {arm} student: missing {sorted(missing)[:5]}, unexpected "
                       f"{sorted(unexpected)[:5]}")
    state = student.state_dict()
    check_finite(((name, state[name]) for name in headers), headers, "LRC student state", path)
    return student.eval()
