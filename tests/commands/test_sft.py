"""`lrc sft`: the loss counts only answer tokens, and tuning raises the answers' log-probability."""

from __future__ import annotations

import json

import pytest
import torch

from lrc.errors import LRCError
from tests.helpers import make_tokenizer

JOBS = ["baker", "smith", "pilot"]
PEOPLE = 12


def chat(i: int) -> list[dict]:
    return [{"role": "user", "content": f"What does person {i} do?"},
            {"role": "assistant", "content": JOBS[(i * 7) % 3]}]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tokenizer, a random tiny base model saved as a plain HF checkpoint, and a chat token dir."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lrc.commands.tokenize import main as tokenize

    root = tmp_path_factory.mktemp("sft")
    tok = make_tokenizer(root / "tok")
    src = root / "chats.jsonl"
    src.write_text("".join(json.dumps({"messages": chat(i)}) + "\n" for i in range(PEOPLE)))
    assert tokenize(["--tokenizer", str(root / "tok"), "--source", str(src), "--out", str(root / "data"),
                     "--seq-len", "24", "--chat", "--chat-layout", "pad", "--valid-rows", "1"]) == 0
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    return root, tok


def answer_logprob(model, tok, i: int, answer: str) -> float:
    """log p(answer turn | question) under the chat template, summed over the answer's tokens."""
    from lrc.commands.tokenize import chat_ids

    msgs = chat(i)[:1] + [{"role": "assistant", "content": answer}]
    ids, mask = chat_ids(tok, msgs)
    ids, mask = torch.tensor([ids]), torch.tensor([mask], dtype=torch.bool)
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1)
    picked = lp.gather(-1, ids[:, 1:, None])[..., 0]
    return float((picked * mask[:, 1:]).sum())


def score(model_dir, tok) -> tuple[float, float]:
    """Mean answer log-prob of the tuned questions, and accuracy of ranking the three jobs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    lps, right = [], 0
    tuned = range(1, PEOPLE)  # person 0 went to valid/ (--valid-rows 1)
    for i in tuned:
        options = {job: answer_logprob(model, tok, i, job) for job in JOBS}
        lps.append(options[JOBS[(i * 7) % 3]])
        right += max(options, key=options.get) == JOBS[(i * 7) % 3]
    return sum(lps) / len(lps), right / len(tuned)


def test_sft_raises_the_answers_and_counts_only_answer_tokens(world, tmp_path):
    from transformers import AutoModelForCausalLM

    from lrc.commands.sft import main
    from lrc.io.tokens import TokenDataset
    from lrc.method.objectives import masked_ce
    from lrc.training.loop import StepBatches

    root, tok = world
    out = tmp_path / "sft"
    data = TokenDataset(root / "data" / "train")
    assert main(["--model", str(root / "base"), "--data", str(root / "data"), "--out", str(out), "--epochs", "40",
                 "--batch-size", "4", "--micro-batch-size", "4", "--lr", "3e-3", "--log-every", "1", "--no-progress",
                 "--threads", "1"]) == 0
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 40 * len(data) // 4

    # The first step's logged loss is the base model's CE on that batch's answer tokens only.
    base = AutoModelForCausalLM.from_pretrained(root / "base").eval()
    rows = next(iter(StepBatches(len(data), seed=0, batch_size=4, micro_batch_size=4, num_processes=1, process_index=0,
                                 start_step=0, steps=1)))
    batch = {k: torch.stack([data[r][k] for r in rows]) for k in ("input_ids", "loss_mask")}
    assert 0 < int(batch["loss_mask"].sum()) < batch["loss_mask"].numel() // 3
    with torch.no_grad():
        logits = base(input_ids=batch["input_ids"]).logits
    answers_only = float(masked_ce(logits, batch))
    every_token = float(masked_ce(logits, {"input_ids": batch["input_ids"]}))
    assert metrics[0]["ce"] == pytest.approx(answers_only, rel=1e-5)
    assert abs(answers_only - every_token) > 1e-3

    before_lp, before_acc = score(root / "base", tok)
    after_lp, after_acc = score(out, tok)
    print(f"answer log-prob {before_lp:.2f} -> {after_lp:.2f}; accuracy {before_acc:.2f} -> {after_acc:.2f}")
    assert after_lp > before_lp + 2.0
    assert after_acc > max(before_acc, 1 / 3)
    assert (out / "tokenizer.json").is_file() and json.loads((out / "settings.json").read_text())["command"] == "sft"


def test_sft_refuses_data_without_a_loss_mask(world, tmp_path):
    from lrc.commands.sft import main
    from tests.helpers import write_corpus

    root, tok = world
    write_corpus(tmp_path / "plain", tok, rows=4, seq_len=8)
    with pytest.raises(LRCError, match="no loss mask"):
        main(["--model", str(root / "base"), "--data", str(tmp_path / "plain"), "--out", str(tmp_path / "o")])
