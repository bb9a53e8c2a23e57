"""Student construction: config, factors, tying, trainable set, save/load, bad input."""

from __future__ import annotations

import pytest
import torch

from lrc.errors import LRCError
from lrc.method.reach import apply_arm
from lrc.method.spectral import compute_bases
from lrc.method.student import (
    build_student,
    load_lrc_state,
    save_lrc_state,
    trainable_parameters,
)
from lrc.names import ARMS
from tests.helpers import make_teacher

R = 16


def test_student_is_a_real_model_of_the_teacher_class(teacher):
    student = build_student(teacher, R)
    assert type(student) is type(teacher)
    cfg = student.config
    assert cfg.hidden_size == R and cfg.head_dim == 8
    assert cfg.num_attention_heads == 4 and cfg.num_key_value_heads == 2
    assert cfg.intermediate_size == teacher.config.intermediate_size
    assert cfg.rms_norm_eps == teacher.config.rms_norm_eps
    assert cfg.tie_word_embeddings == teacher.config.tie_word_embeddings
    layer = student.model.layers[0]
    assert layer.self_attn.q_proj.weight.shape == (32, R)
    assert layer.self_attn.k_proj.weight.shape == (16, R)
    assert layer.self_attn.o_proj.weight.shape == (R, 32)
    assert layer.mlp.gate_proj.weight.shape == (96, R)
    assert layer.mlp.down_proj.weight.shape == (R, 96)
    assert student.lm_head.weight.shape == (97, R)


def test_weights_are_teacher_times_factor(teacher):
    student = build_student(teacher, R, seed=3)
    s, t = student.model.layers[1], teacher.model.layers[1]
    a = s.self_attn.v_proj.parametrizations.weight.original
    assert a.shape == (32, R)
    torch.testing.assert_close(s.self_attn.v_proj.weight, t.self_attn.v_proj.weight @ a)
    b = s.self_attn.o_proj.parametrizations.weight.original
    torch.testing.assert_close(s.self_attn.o_proj.weight, b @ t.self_attn.o_proj.weight)
    p = s.mlp.up_proj.parametrizations.weight.original
    torch.testing.assert_close(s.mlp.up_proj.weight, t.mlp.up_proj.weight @ p.T)
    p_emb = student.model.embed_tokens.parametrizations.weight.original
    torch.testing.assert_close(student.model.embed_tokens.weight, teacher.model.embed_tokens.weight @ p_emb.T)
    # reference init: N(0, 0.02)
    assert abs(p.std().item() - 0.02) < 0.004


def test_head_factor_shared_when_tied_own_when_untied(teacher):
    student = build_student(teacher, R)
    head = student.lm_head.parametrizations.weight.original
    emb = student.model.embed_tokens.parametrizations.weight.original
    if teacher.config.tie_word_embeddings:
        assert head is emb
    else:
        assert head is not emb
        torch.testing.assert_close(student.lm_head.weight, teacher.lm_head.weight @ head.T)


def test_only_factors_and_norms_train_and_teacher_stays_frozen(teacher):
    student = build_student(teacher, R)
    names = [n for n, _ in trainable_parameters(student)]
    assert names and all(n.endswith(".original") or "norm" in n for n in names)
    assert not any(p.requires_grad for p in teacher.parameters())
    assert not teacher.training
    for name, p in student.named_parameters():
        if "norm" in name:
            assert torch.all(p == 1.0)
    if teacher.config.model_type == "qwen2":
        bias = student.model.layers[0].self_attn.q_proj.bias
        assert not bias.requires_grad
        torch.testing.assert_close(bias, teacher.model.layers[0].self_attn.q_proj.bias)
    # the teacher weights are not in the state (non-persistent buffers)
    assert not any("frozen" in k for k in student.state_dict())


def test_build_is_seeded_and_eps_is_settable(teacher, token_batch):
    a = build_student(teacher, R, seed=5)(input_ids=token_batch).logits
    b = build_student(teacher, R, seed=5)(input_ids=token_batch).logits
    c = build_student(teacher, R, seed=6)(input_ids=token_batch).logits
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert build_student(teacher, R, norm_eps=1e-3).config.rms_norm_eps == 1e-3
    assert teacher.config.hidden_size == 32  # the teacher config itself is untouched


@pytest.mark.parametrize("arm", ARMS)
def test_save_load_restores_trained_values_and_arm(arm, tmp_path, token_batch):
    teacher = make_teacher("qwen2-tied")
    bases = compute_bases(teacher)
    student = build_student(teacher, R, seed=1)
    apply_arm(student, teacher, arm, bases=bases, seed=2)
    with torch.no_grad():
        for _, p in trainable_parameters(student):
            p.add_(0.01 * torch.randn_like(p))
    save_lrc_state(student, tmp_path, step=7)
    loaded = load_lrc_state(tmp_path, teacher, bases)
    assert loaded.lrc_info["arm"] == arm
    assert torch.equal(loaded(input_ids=token_batch).logits, student(input_ids=token_batch).logits)
    assert [n for n, _ in trainable_parameters(loaded)] == [n for n, _ in trainable_parameters(student)]
    assert loaded.lm_head.parametrizations.weight.original is loaded.model.embed_tokens.parametrizations.weight.original


def test_load_checks_the_teacher(tmp_path):
    teacher = make_teacher("llama-untied")
    save_lrc_state(build_student(teacher, R), tmp_path)
    with pytest.raises(LRCError, match="qwen2"):
        load_lrc_state(tmp_path, make_teacher("qwen2-untied"))
    with pytest.raises(LRCError, match="lrc.json"):
        load_lrc_state(tmp_path / "nowhere", teacher)


@pytest.mark.parametrize("r", [32, 40, 0, -3, 2.5])
def test_bad_widths_are_errors_naming_the_value(r):
    with pytest.raises(LRCError, match=str(r)):
        build_student(make_teacher("llama-tied"), r)


def test_unsupported_architecture_and_init():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=50))
    with pytest.raises(LRCError, match="gpt2"):
        build_student(gpt2, 16)
    with pytest.raises(LRCError, match="pca"):
        build_student(make_teacher("llama-tied"), 16, init="pca")


def test_residual_side_biases_are_refused():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                      attention_bias=True)
    with pytest.raises(LRCError, match="o_proj"):
        build_student(LlamaForCausalLM(cfg), 16)
