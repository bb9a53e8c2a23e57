"""`lrc pretrain`: the same seed gives the same weights, and what a run writes."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from tests.helpers import make_tokenizer, write_corpus, write_llama_config


def test_pretrain_same_seed_same_weights_and_outputs(tmp_path):
    from lrc.commands.pretrain import main

    tok = make_tokenizer(tmp_path / "tok")
    write_corpus(tmp_path / "data", tok, rows=16, seq_len=16)
    write_llama_config(tmp_path / "config.json", len(tok))
    common = ["--model-config", str(tmp_path / "config.json"), "--tokenizer", str(tmp_path / "tok"),
              "--data", str(tmp_path / "data"), "--tokens", str(5 * 4 * 16), "--batch-size", "4",
              "--micro-batch-size", "4", "--lr", "1e-3", "--no-progress", "--log-every", "1"]
    for name in ("a", "b"):
        assert main(common + ["--out", str(tmp_path / name)]) == 0
    a, b = (load_file(str(tmp_path / n / "model.safetensors")) for n in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    out = tmp_path / "a"
    assert ({"config.json", "model.safetensors", "tokenizer.json", "settings.json", "metrics.jsonl"}
            <= {p.name for p in out.iterdir()})
    settings = json.loads((out / "settings.json").read_text())
    assert (settings["command"] == "pretrain" and settings["settings"]["tokens"] == 320
            and settings["training"]["steps"] == 5)
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert reloaded.config.vocab_size == len(tok)
    # A different seed gives different weights.
    assert main(common + ["--out", str(tmp_path / "c"), "--seed", "1"]) == 0
    c = load_file(str(tmp_path / "c" / "model.safetensors"))
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])

