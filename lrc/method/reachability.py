"""What each arm can reach of every deployed weight, and how much of a trained MLP lies outside
the teacher's subspaces (occupancy, knockout). `lrc audit` (:mod:`lrc.commands.audit`) reports them."""

from __future__ import annotations

from pathlib import Path

import torch

from lrc.errors import LRCError
from lrc.io.checks import check_config
from lrc.io.hf import (
    SUPPORTED_MODEL_TYPES,
    read_json_object,
)
from lrc.method.spectral import column_basis, mlp_teacher_matrix
from lrc.names import ARMS, FULL_REACH_ARMS, MLP_KINDS

MLP_WEIGHTS = ("gate_proj", "up_proj", "down_proj")
OCCUPANCY_COLUMNS = ("layer", "weight", "energy", "outside", "occupancy")


def read_teacher_config(path: str | Path) -> dict:
    """The teacher's config as a dict, from a config.json file or a checkpoint directory."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    if not file.is_file():
        raise LRCError(f"teacher {p}: no config.json found")
    cfg = read_json_object(file, "teacher config")
    if cfg.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise LRCError(f"unsupported teacher model_type {cfg.get('model_type')!r} in {file}; supported: "
                       f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    return check_config(cfg, file)


def reachability_table(cfg: dict, r: int) -> list[dict]:
    """One row per deployed weight type (see module doc)."""
    H, d_ff, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    if not isinstance(r, int) or r < 1 or r >= H:
        raise LRCError(f"--student-hidden {r!r} must be a positive integer below the teacher's hidden size {H}")
    n_h = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_h
    h_d = cfg.get("head_dim") or H // n_h
    tied = bool(cfg.get("tie_word_embeddings", False))
    # name, count, student shape [out, in], rank of the frozen teacher factor
    specs = [
        ("embed_tokens", 1, (V, r), min(V, H)),
        ("q_proj", L, (n_h * h_d, r), min(n_h * h_d, H)),
        ("k_proj", L, (n_kv * h_d, r), min(n_kv * h_d, H)),
        ("v_proj", L, (n_kv * h_d, r), min(n_kv * h_d, H)),
        ("o_proj", L, (r, n_h * h_d), min(n_h * h_d, H)),
        ("gate_proj", L, (d_ff, r), min(d_ff, H)),
        ("up_proj", L, (d_ff, r), min(d_ff, H)),
        ("down_proj", L, (r, d_ff), min(d_ff, H)),
        ("lm_head" + (" (tied)" if tied else ""), 1, (V, r), min(V, H)),
        ("norms", 2 * L + 1, (r,), None),
    ]
    rows = []
    for name, count, shape, rank in specs:
        deployed = shape[0] * (shape[1] if len(shape) > 1 else 1)
        slice_reach = deployed if rank is None else rank * r
        row = {"weight": name, "count": count, "shape": "x".join(map(str, shape)), "deployed": deployed}
        for arm in ARMS:
            full = name in MLP_WEIGHTS and arm in FULL_REACH_ARMS
            row[f"reach_{arm}"] = deployed if full else slice_reach
        row["u"] = slice_reach / deployed
        row["stranded"] = 1.0 - row["u"]
        rows.append(row)
    return rows


def mlp_stranded_fraction(cfg: dict, r: int) -> float:
    rows = [row for row in reachability_table(cfg, r) if row["weight"] in MLP_WEIGHTS]
    return sum(row["stranded"] * row["deployed"] for row in rows) / sum(row["deployed"] for row in rows)


def mlp_bases(teacher, bases):
    """``get(layer, kind)``: the teacher's column-oriented basis U [d_ff, H] (float64), from
    ``bases`` (:class:`lrc.method.spectral.TeacherBases`) or, when None, an SVD of the teacher per call."""
    def get(i, kind):
        if bases is not None:
            return bases.basis(i, kind).double()
        return column_basis(mlp_teacher_matrix(teacher, i, kind))[0]

    return get


def deployed_column_oriented(model, i, kind) -> torch.Tensor:
    """The deployed ``kind`` weight of layer ``i``, column-oriented ([d_ff, r]; down transposed),
    detached, where it lives: the module's ``weight``, through any parametrisation (what
    `lrc merge` materialises), so it reads a training student of any arm and a merged model alike."""
    w = getattr(model.model.layers[i].mlp, f"{kind}_proj").weight.detach()
    return w.T if kind == "down" else w


def _column_oriented(student, i, kind):
    return deployed_column_oriented(student, i, kind).double().cpu()


def occupancy(teacher, student, bases=None) -> list[dict]:
    """Per layer and MLP matrix: energy of the student weight outside the teacher's space."""
    get = mlp_bases(teacher, bases)
    out = []
    for i in range(teacher.config.num_hidden_layers):
        for kind in MLP_KINDS:
            w, u = _column_oriented(student, i, kind), get(i, kind)
            rest = w - u @ (u.T @ w)
            total, outside = w.pow(2).sum().item(), rest.pow(2).sum().item()
            out.append({"layer": i, "weight": f"{kind}_proj", "energy": total, "outside": outside,
                        "occupancy": outside / total if total else 0.0})
    return out


@torch.no_grad()
def knockout(teacher, student, bases=None) -> None:
    """Project every MLP weight of ``student`` (a plain model) onto the teacher's space, in place."""
    get = mlp_bases(teacher, bases)
    for i in range(teacher.config.num_hidden_layers):
        for kind in MLP_KINDS:
            proj = getattr(student.model.layers[i].mlp, f"{kind}_proj")
            w, u = _column_oriented(student, i, kind), get(i, kind)
            kept = u @ (u.T @ w)
            proj.weight.copy_((kept.T if kind == "down" else kept).to(proj.weight.dtype))


