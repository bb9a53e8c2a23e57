"""Helpers shared by the tests, imported one way: ``from tests.helpers import ...``."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import socket

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from lrc.cli import COMMANDS

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


VOCAB, SEQ = 97, 16


class RandomTokens(torch.utils.data.Dataset):
    """``rows`` seeded random sequences; rows listed in ``poison`` end in token VOCAB - 1."""

    def __init__(self, rows: int = 64, seq_len: int = SEQ, seed: int = 0, poison: tuple[int, ...] = ()):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, VOCAB - 1, (rows, seq_len), generator=g)
        for r in poison:
            self.x[r, 3] = VOCAB - 1

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "loss_mask": torch.ones(self.x.shape[1], dtype=torch.bool)}


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)


TEXTS = [f"Person {i} lives in town {i % 7} and works as a {['baker', 'smith', 'pilot'][i % 3]}." for i in range(60)]


def make_tokenizer(directory):
    from lrc.world.tokenizer import train_tokenizer

    return train_tokenizer(TEXTS, vocab_size=300, out_dir=directory)


def write_llama_config(path, vocab_size: int, hidden: int = 32, layers: int = 2) -> None:
    cfg = {"model_type": "llama", "vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 3 * hidden,
           "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 128, "tie_word_embeddings": True}
    path.write_text(json.dumps(cfg))


def write_corpus(directory, tokenizer, *, rows: int = 64, seq_len: int = 32, seed: int = 0):
    import numpy as np

    from lrc.io.tokens import write_tokens

    g = np.random.default_rng(seed)
    ids = g.integers(0, len(tokenizer), size=(rows, seq_len))
    return write_tokens(directory, ids, tokenizer=tokenizer, source="random")


ENV = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    """A TCP port free now, for a 2-process run's rendezvous: fixed ports collide when two
    runs start side by side (a port still in TIME_WAIT, or another test run on the machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command_options(command: str) -> set[str]:
    """The option names (`--lr` -> "lr") of an `lrc` command, from its own parser."""
    module = importlib.import_module(COMMANDS[command][0])
    entry = getattr(module, f"main_{command}", None) or module.main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        entry(["--help"])
    return {m.replace("-", "_") for m in re.findall(r"--([a-z][a-z0-9-]*)", out.getvalue())}
