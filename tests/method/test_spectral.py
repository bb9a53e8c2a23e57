"""Teacher bases (`lrc svd`) and the spectral factor init."""

from __future__ import annotations

import pytest
import torch

import lrc.method.student
from lrc.errors import LRCError
from lrc.method.spectral import (
    compute_bases,
    load_bases,
    mlp_teacher_matrix,
    save_bases,
)
from lrc.method.student import (
    build_student,
    fold_tied_head_gain,
    spectral_projection,
    student_config,
)
from tests.helpers import TEACHER_KINDS, make_teacher

H = 32


def test_bases_round_trip_and_shapes(tmp_path):
    teacher = make_teacher("llama-untied")
    bases = compute_bases(teacher)
    save_bases(bases, tmp_path)
    again = load_bases(tmp_path)
    assert set(again.U) == {f"{i}.{k}" for i in range(2) for k in ("gate", "up", "down")}
    for key, u in bases.U.items():
        assert u.shape == (96, H) and u.dtype == torch.float32
        assert torch.equal(again.U[key], u) and torch.equal(again.S[key], bases.S[key])
    assert torch.equal(again.embed_V, bases.embed_V) and again.embed_V.shape == (H, H)
    assert again.meta["complement"].startswith("Householder")
    with pytest.raises(LRCError, match="lrc svd"):
        load_bases(tmp_path / "missing")


def test_bases_are_the_singular_vectors_with_fixed_signs():
    teacher = make_teacher("qwen2-tied")
    bases = compute_bases(teacher)
    for kind in ("gate", "down"):
        t = mlp_teacher_matrix(teacher, 0, kind).double()
        u, s = bases.basis(0, kind).double(), bases.S[f"0.{kind}"].double()
        torch.testing.assert_close(s, torch.linalg.svdvals(t), rtol=1e-5, atol=1e-6)
        # U Uᵀ T = T: the columns span T's column space (row space of down_proj)
        torch.testing.assert_close(u @ (u.T @ t), t, rtol=0, atol=1e-5)
        idx = u.abs().argmax(0)
        assert torch.all(u[idx, torch.arange(H)] > 0)


def test_complement_is_orthonormal_and_orthogonal_to_the_basis():
    bases = compute_bases(make_teacher("llama-tied"))
    u = bases.basis(1, "up")
    refl, tau = bases.complement(1, "up")
    eye = torch.eye(96)
    q = torch.ormqr(refl, tau, eye)  # the full Householder Q
    torch.testing.assert_close(q.T @ q, eye, atol=1e-5, rtol=0)
    perp = q[:, H:]
    assert (u.T @ perp).abs().max() < 1e-5
    # Q's first H columns are U up to signs
    torch.testing.assert_close((q[:, :H] * (q[:, :H] * u).sum(0).sign()), u, atol=1e-5, rtol=0)


def test_spectral_factors_are_the_documented_ones():
    teacher = make_teacher("llama-untied")
    bases = compute_bases(teacher)
    r = 20
    student = build_student(teacher, r, init="spectral", bases=bases)
    v = bases.embed_V[:, :r]
    torch.testing.assert_close(student.model.embed_tokens.weight, teacher.model.embed_tokens.weight @ v)
    torch.testing.assert_close(student.model.layers[0].self_attn.o_proj.parametrizations.weight.original, v.T)
    g = teacher.model.layers[1].post_attention_layernorm.weight
    want = ((g[:, None] * v) * (H / r) ** 0.5).T
    torch.testing.assert_close(student.model.layers[1].mlp.gate_proj.parametrizations.weight.original, want)
    # without precomputed bases the same projection is computed from the teacher
    again = build_student(teacher, r, init="spectral")
    torch.testing.assert_close(again.model.embed_tokens.weight, student.model.embed_tokens.weight, rtol=0, atol=1e-6)


def test_spectral_student_starts_near_the_teacher(token_batch):
    for kind in ("llama-untied", "qwen2-tied"):
        teacher = make_teacher(kind)
        ref = teacher(input_ids=token_batch).logits
        errs = {}
        for init in ("spectral", "normal"):
            out = build_student(teacher, H - 1, init=init)(input_ids=token_batch).logits
            errs[init] = ((out - ref).norm() / ref.norm()).item()
        assert errs["spectral"] < 0.5 < 0.9 < errs["normal"], (kind, errs)


def full_width_student(monkeypatch, teacher, init, **kw):
    """The student at r = H (build_student refuses r = H; lift only that check)."""

    def full_width(cfg, r, eps=None):
        out = student_config(cfg, H - 1, eps)
        out.hidden_size = H
        return out

    monkeypatch.setattr(lrc.method.student, "student_config", full_width)
    return build_student(teacher, H, init=init, **kw)


def with_wild_norm_gains(teacher, seed=1):
    """Norm gains drawn from [-2, 3] (a pretrained model's final norm spans about -2 ... 3):
    a tied head that ignores the final gain is then far from the teacher."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in teacher.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) * 5 - 2)
    return teacher


@pytest.mark.parametrize("init", ["spectral", "activations"])
@pytest.mark.parametrize("kind", TEACHER_KINDS)
def test_spectral_init_at_full_width_is_the_teacher(monkeypatch, token_batch, kind, init):
    """At r = H the projection is a rotation: the student computes the teacher, tied or untied."""
    teacher = with_wild_norm_gains(make_teacher(kind))
    student = full_width_student(monkeypatch, teacher, init, calibration=token_batch.flip(1))
    diff = (student(input_ids=token_batch).logits - teacher(input_ids=token_batch).logits).abs().max()
    assert diff < 1e-4, (kind, diff.item())
    # the tied head carries the final gain in the student's final norm, the untied one in its factor
    final = student.model.norm.weight
    if teacher.config.tie_word_embeddings:
        torch.testing.assert_close(final.sort().values, teacher.model.norm.weight.sort().values, rtol=0, atol=1e-5)
    else:
        assert torch.equal(final, torch.ones(H))


def test_tied_gain_fold_keeps_the_span_and_diagonalises_the_gain():
    teacher = with_wild_norm_gains(make_teacher("llama-tied"))
    v = spectral_projection(teacher, 12)
    gain = teacher.model.norm.weight
    rotated, lam = fold_tied_head_gain(v, gain)
    torch.testing.assert_close(rotated @ rotated.T, v @ v.T, rtol=0, atol=1e-5)  # same span
    compressed = rotated.T @ torch.diag(gain) @ rotated
    torch.testing.assert_close(compressed, torch.diag(lam), rtol=0, atol=1e-5)
    # below full width the student's final norm starts at the compressed gain, times sqrt(H/r)
    student = build_student(teacher, 12, init="spectral")
    torch.testing.assert_close(student.model.norm.weight, lam * (H / 12) ** 0.5)
    torch.testing.assert_close(student.model.embed_tokens.parametrizations.weight.original, rotated.T)


def test_mismatched_bases_are_refused():
    bases = compute_bases(make_teacher("llama-tied"))
    other = make_teacher("llama-tied")
    other.config.intermediate_size = 80  # pretend a different teacher
    with pytest.raises(LRCError, match="do not match"):
        bases.check_matches(other)


def test_svd_command_refuses_an_unknown_device(tmp_path, capsys):
    from lrc.cli import main as lrc_main

    assert lrc_main(["svd", "--teacher", str(tmp_path), "--out", str(tmp_path / "b"), "--device", "tpu"]) == 2
    assert "'tpu'" in capsys.readouterr().err


def test_svd_command_lives_in_lrc_svd_and_the_method_imports_no_command_module():
    """`lrc svd` is lrc.commands.svd; importing the method (spectral, reach, student, clone,
    objectives) in a fresh interpreter loads no command module, no cli, no loop."""
    import subprocess
    import sys

    from lrc.cli import COMMANDS

    assert COMMANDS["svd"][0] == "lrc.commands.svd"
    code = ("import sys; import lrc.method.spectral, lrc.method.reach, lrc.method.student, lrc.method.clone, "
            "lrc.method.objectives; "
            "bad = sorted(m for m in sys.modules if m in ('lrc.cli', 'lrc.commands.svd', 'lrc.training.loop', "
            "'lrc.commands.distill', 'lrc.commands.merge', "
            "'lrc.commands.audit', 'lrc.commands.recover', 'lrc.commands.bench', 'lrc.commands.sft', "
            "'lrc.commands.pretrain', 'lrc.commands.evaluate', 'lrc.commands.tokenize')); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out
