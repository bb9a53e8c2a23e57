"""Recover LRC factors from a merged LRC student by least squares (`lrc recover`).

Given the teacher and a plain checkpoint of LRC shape (for example someone else's
released LRC model), every factor is the least-squares solution of its defining equation
(float64, ``torch.linalg.lstsq`` with the minimum-norm ``gelsd`` driver, so GQA's
underdetermined k/v factors get the minimum-norm one):

* q/k/v ``W = T·A``, gate/up ``W = T·Pᵀ``, embedding/head ``W = E·Pᵀ``: solve ``T X = W``;
* o/down ``W = B·T``: solve ``Tᵀ Bᵀ = Wᵀ``.

Norm weights, Qwen2's q/k/v biases and the RMSNorm eps are copied from the merged model.
For a tied model the embedding factor serves the head. The result is a `slice` LRC state
directory; each weight's relative residual ``‖T·X − W‖ / ‖W‖`` is reported (``recover.json``).
It is ~0 for a true LRC student; above ``threshold`` the student is not (only) an LRC
student of this teacher and a loud warning is printed (``--strict`` makes it an error).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lrc.errors import LRCError
from lrc.io.atomic import write_json_atomic
from lrc.io.hf import load_causal_lm, load_teacher
from lrc.io.provenance import write_settings
from lrc.method.student import build_student, check_teacher, save_lrc_state
from lrc.options import parse_args

RECOVER_REPORT = "recover.json"


def _solve(teacher_w: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Least-squares X with teacher_w @ X ≈ target, and the relative residual."""
    a, b = teacher_w.detach().double().cpu(), target.detach().double().cpu()
    x = torch.linalg.lstsq(a, b, driver="gelsd").solution
    res, denom = (a @ x - b).norm().item(), b.norm().item()
    return x, (res / denom if denom > 0 else res)


def recover_student(teacher, merged):
    """A `slice` student whose factors best reproduce ``merged``; returns (student, residuals)."""
    check_teacher(teacher)
    tc, mc = teacher.config, merged.config
    if mc.model_type != tc.model_type:
        raise LRCError(f"merged model is {mc.model_type!r}, the teacher is {tc.model_type!r}")
    for key in ("intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        if getattr(mc, key) != getattr(tc, key):
            raise LRCError(f"merged model's {key}={getattr(mc, key)} differs from the teacher's {getattr(tc, key)}: "
                           "not an LRC student of it")
    if bool(mc.tie_word_embeddings) != bool(tc.tie_word_embeddings):
        raise LRCError(f"merged model tie_word_embeddings={mc.tie_word_embeddings} but the teacher's is "
                       f"{tc.tie_word_embeddings}")
    student = build_student(teacher, mc.hidden_size, norm_eps=mc.rms_norm_eps)
    residuals: dict[str, float] = {}

    def put(module, factor):
        orig = module.parametrizations.weight.original
        with torch.no_grad():
            orig.copy_(factor.to(orig.dtype))

    with torch.no_grad():
        for i, (s_layer, t_layer, m_layer) in enumerate(zip(student.model.layers, teacher.model.layers,
                                                            merged.model.layers)):
            for name in ("q_proj", "k_proj", "v_proj"):
                t, m, s = (getattr(x.self_attn, name) for x in (t_layer, m_layer, s_layer))
                x, residuals[f"layers.{i}.{name}"] = _solve(t.weight, m.weight)
                put(s, x)
                if m.bias is not None:
                    s.bias.copy_(m.bias)
            x, residuals[f"layers.{i}.o_proj"] = _solve(t_layer.self_attn.o_proj.weight.T,
                                                        m_layer.self_attn.o_proj.weight.T)
            put(s_layer.self_attn.o_proj, x.T)
            for name in ("gate_proj", "up_proj"):
                x, residuals[f"layers.{i}.{name}"] = _solve(getattr(t_layer.mlp, name).weight,
                                                            getattr(m_layer.mlp, name).weight)
                put(getattr(s_layer.mlp, name), x.T)
            x, residuals[f"layers.{i}.down_proj"] = _solve(t_layer.mlp.down_proj.weight.T,
                                                           m_layer.mlp.down_proj.weight.T)
            put(s_layer.mlp.down_proj, x.T)
        x, residuals["embed_tokens"] = _solve(teacher.model.embed_tokens.weight, merged.model.embed_tokens.weight)
        put(student.model.embed_tokens, x.T)
        if not tc.tie_word_embeddings:
            x, residuals["lm_head"] = _solve(teacher.lm_head.weight, merged.lm_head.weight)
            put(student.lm_head, x.T)
        merged_params = dict(merged.named_parameters())
        for name, p in student.named_parameters():
            if "norm" in name:
                p.copy_(merged_params[name])
    student.lrc_info["init"] = "recovered"
    return student, residuals


def summarize(residuals: dict[str, float], threshold: float) -> dict:
    worst = max(residuals, key=residuals.get)
    return {
        "max_relative_residual": residuals[worst],
        "worst_weight": worst,
        "threshold": threshold,
        "is_lrc_student": residuals[worst] <= threshold,
        "residuals": residuals,
    }


@dataclass(kw_only=True)
class RecoverArgs:
    """Recover the LRC factors of a merged LRC student (least squares), as a slice state."""

    teacher: Path = field(metadata={"help": "teacher checkpoint directory"})
    merged: Path = field(metadata={"help": "merged LRC student checkpoint directory (plain HF)"})
    out: Path = field(metadata={"help": "output LRC state directory (arm slice)"})
    threshold: float = field(default=1e-3, metadata={
        "help": "relative residual above which the student is reported as not an LRC student"})
    strict: bool = field(default=False, metadata={
        "help": "fail instead of warning when a residual exceeds the threshold"})
    allow_pickle: bool = field(default=False, metadata={
        "help": "accept teacher/merged weights stored as pickles (pytorch_model.bin; can run code when loaded)"})


def main(argv=None) -> int:
    args = parse_args(RecoverArgs, argv, prog="lrc recover")
    teacher = load_teacher(args.teacher, allow_pickle=args.allow_pickle)
    merged = load_causal_lm(args.merged, dtype=torch.float32, role="--merged", allow_pickle=args.allow_pickle)
    student, residuals = recover_student(teacher, merged)
    report = summarize(residuals, args.threshold)
    if not report["is_lrc_student"]:
        msg = (
            f"relative residual {report['max_relative_residual']:.3g} at {report['worst_weight']} exceeds "
            f"{args.threshold:g}: {args.merged} is not an LRC student of this teacher; the recovered "
            "factors do NOT reproduce it"
        )
        if args.strict:
            raise LRCError(msg)
        print("WARNING: " + msg, file=sys.stderr)
    save_lrc_state(student, args.out, recovered_from=str(args.merged),
                   max_relative_residual=report["max_relative_residual"])
    write_json_atomic(args.out / RECOVER_REPORT, report)
    write_settings(args.out, "recover", args, max_relative_residual=report["max_relative_residual"])
    print(f"recovered factors into {args.out}: max relative residual {report['max_relative_residual']:.3g} "
          f"({report['worst_weight']})")
    return 0
