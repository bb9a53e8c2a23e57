"""Shared fixtures: tiny random teachers of both architectures, tied and untied, with GQA."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

# One intra-op thread: on a shared 2-core machine two OpenMP threads per process made
# the LRC-core tests 10-20x slower under load (9.8 s vs 100-200 s measured).
torch.set_num_threads(1)

TEACHER_KINDS = ["llama-tied", "llama-untied", "qwen2-tied", "qwen2-untied"]


def make_teacher(kind: str, seed: int = 0, vocab_size: int = 97) -> torch.nn.Module:
    """A tiny random teacher: H 32, d_ff 96 (rho 3), 4 heads of 8, 2 KV heads, 2 layers."""
    arch, tying = kind.split("-")
    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=(tying == "tied"),
    )
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(rms_norm_eps=1e-5, **common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(rms_norm_eps=1e-6, **common))
        # Qwen2 initialises q/k/v biases to zero; give them values so tests see them.
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.02)
    with torch.no_grad():
        # Non-trivial norm weights, so tests notice when a student copies them by mistake.
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()


@pytest.fixture(params=TEACHER_KINDS)
def teacher(request) -> torch.nn.Module:
    return make_teacher(request.param)


@pytest.fixture
def token_batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 97, (2, 16), generator=g)
