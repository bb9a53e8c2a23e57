"""The `activations` factor init: the teacher's residual-stream principal directions."""

from __future__ import annotations

import json

import pytest
import torch

from lrc.errors import LRCError
from lrc.method.spectral import activation_basis
from lrc.method.student import build_student, spectral_projection
from tests.helpers import make_teacher, make_tokenizer, write_corpus

H = 32


@pytest.fixture
def calibration() -> torch.Tensor:
    return torch.randint(0, 97, (6, 16), generator=torch.Generator().manual_seed(5))


def norm_inputs(teacher, ids: torch.Tensor, gained: bool = False) -> torch.Tensor:
    """Every vector the teacher's RMSNorms read on ``ids``, each divided by its RMS (and
    times that norm's gain when ``gained``): [n, H]."""
    seen = []

    def record(m, a):
        x = a[0].reshape(-1, H).double()
        x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
        seen.append(x * m.weight.double() if gained else x)

    norms = [m for name, m in teacher.named_modules() if name.endswith("norm")]
    hooks = [m.register_forward_pre_hook(record) for m in norms]
    with torch.no_grad():
        teacher(input_ids=ids)
    for h in hooks:
        h.remove()
    x = torch.cat(seen)
    assert x.shape[0] == ids.numel() * (2 * teacher.config.num_hidden_layers + 1)
    return x


def test_basis_is_orthonormal_sorted_sign_fixed_and_deterministic(calibration):
    teacher = make_teacher("qwen2-tied")
    v, s = activation_basis(teacher, calibration)
    torch.testing.assert_close(v.T @ v, torch.eye(H, dtype=v.dtype), rtol=0, atol=1e-10)
    assert torch.all(s[:-1] >= s[1:])
    assert torch.all(v[v.abs().argmax(0), torch.arange(H)] > 0)
    # RMS-normalised vectors have squared norm H, so the second moment's trace is H
    assert abs(s.pow(2).sum().item() - H) < 1e-8
    again, s2 = activation_basis(teacher, calibration, batch_size=1)
    torch.testing.assert_close(again, v, rtol=0, atol=1e-8)
    assert torch.equal(activation_basis(teacher, calibration)[0], v)


def test_basis_is_the_best_rank_r_subspace_of_what_the_norms_read(calibration):
    teacher = make_teacher("llama-untied")
    x = norm_inputs(teacher, calibration)
    r = 8
    v = activation_basis(teacher, calibration)[0][:, :r]

    def kept(basis):  # energy of the normalised stream inside span(basis)
        return (x @ basis.double()).pow(2).sum().item() / x.pow(2).sum().item()

    want = torch.linalg.eigvalsh(x.T @ x).flip(0)[:r].sum().item() / x.pow(2).sum().item()
    assert abs(kept(v) - want) < 1e-9
    assert kept(v) > kept(spectral_projection(teacher, r)) + 0.01
    # `gained`: the same optimum for the gain-weighted vectors
    xg = norm_inputs(teacher, calibration, gained=True)
    vg = activation_basis(teacher, calibration, statistic="gained")[0][:, :r]
    best = torch.linalg.eigvalsh(xg.T @ xg).flip(0)[:r].sum().item()
    assert abs((xg @ vg).pow(2).sum().item() - best) < 1e-9 * best
    # the raw-stream statistic is another subspace (it weighs large vectors more)
    raw = activation_basis(teacher, calibration, statistic="stream")[0][:, :r]
    assert kept(raw) < kept(v)


def test_student_uses_the_top_r_directions(calibration):
    teacher = make_teacher("llama-untied")
    r = 12
    student = build_student(teacher, r, init="activations", calibration=calibration)
    v = activation_basis(teacher, calibration)[0][:, :r].float()
    torch.testing.assert_close(student.model.embed_tokens.parametrizations.weight.original, v.T)
    g = teacher.model.layers[0].input_layernorm.weight
    torch.testing.assert_close(student.model.layers[0].self_attn.q_proj.parametrizations.weight.original,
                               (g[:, None] * v) * (H / r) ** 0.5)
    assert (student.lrc_info["init"] == "activations"
            and student.lrc_info["init_calibration_tokens"] == calibration.numel())


def test_activations_init_refuses_missing_or_bad_calibration(calibration):
    teacher = make_teacher("llama-tied")
    with pytest.raises(LRCError, match="calibration tokens"):
        build_student(teacher, 16, init="activations")
    with pytest.raises(LRCError, match=r"\[rows, seq_len\]"):
        build_student(teacher, 16, init="activations", calibration=calibration[0])
    with pytest.raises(LRCError, match="'mean'"):
        activation_basis(teacher, calibration, statistic="mean")


def test_warmstart_with_the_activations_init(tmp_path):
    from lrc.commands.distill import calibration_rows, main_warmstart
    from lrc.io.tokens import open_token_data
    from lrc.method.student import load_lrc_state

    tok = make_tokenizer(tmp_path / "teacher")
    make_teacher("llama-tied", vocab_size=len(tok)).save_pretrained(tmp_path / "teacher")
    write_corpus(tmp_path / "data" / "train", tok, rows=8, seq_len=16)
    common = ["--teacher", str(tmp_path / "teacher"), "--data", str(tmp_path / "data"), "--student-hidden", "16",
              "--tokens", "0", "--batch-size", "2", "--micro-batch-size", "2", "--no-progress", "--threads", "1",
              "--init", "activations"]
    assert main_warmstart([*common, "--out", str(tmp_path / "ws"), "--init-tokens", "40"]) == 0
    meta = json.loads((tmp_path / "ws" / "lrc.json").read_text())
    assert meta["init"] == "activations" and meta["init_calibration_tokens"] == 48  # whole rows: 3 of 16
    rows = calibration_rows(open_token_data(tmp_path / "data"), 40)
    assert rows.shape == (3, 16)
    # what was saved is the init built from those rows
    from lrc.io.hf import load_teacher

    teacher = load_teacher(tmp_path / "teacher")
    want = build_student(teacher, 16, init="activations", calibration=rows)
    got = load_lrc_state(tmp_path / "ws", teacher)
    ids = rows[:2]
    torch.testing.assert_close(got(input_ids=ids).logits, want(input_ids=ids).logits, rtol=0, atol=1e-6)
    with pytest.raises(LRCError, match="--init-tokens"):
        main_warmstart([*common, "--out", str(tmp_path / "bad"), "--init-tokens", "0"])
