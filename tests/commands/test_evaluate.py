"""`lrc evaluate`: the tiny suite through real lm-eval, the paper suite's call, held-out measures."""

from __future__ import annotations

import json
import math
import re
import time

import pytest
import torch

from lrc.commands.evaluate import (
    EvaluateArgs,
    check_tasks_known,
    heldout_measures,
    lm_eval_call,
    load_suite,
    main,
    selected_tasks,
    task_manager,
)
from lrc.errors import LRCError

PAPER = {"arc_easy": "acc", "arc_challenge": "acc_norm", "logiqa": "acc_norm", "commonsense_qa": "acc", "piqa": "acc",
         "winogrande": "acc", "boolq": "acc", "sciq": "acc", "mmlu": "acc"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from lrc.commands.world import main as world_main

    out = tmp_path_factory.mktemp("w") / "world"
    world_main(["--out", str(out), "--seed", "1", "--size", "test"])
    return out


@pytest.fixture(scope="module")
def checkpoint(world, tmp_path_factory):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**json.loads((world / "teacher_config.json").read_text())))
    with torch.no_grad():  # sharper than the default init, so choices are not near-ties
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.2)
    out = tmp_path_factory.mktemp("m") / "model"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(world / "tokenizer")).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def heldout(world, tmp_path_factory):
    from lrc.commands.tokenize import TokenizeArgs, tokenize

    out = tmp_path_factory.mktemp("d")
    return tokenize(TokenizeArgs(tokenizer=str(world / "tokenizer"), source=str(world / "corpus/train.jsonl"),
                                 valid_source=str(world / "corpus/valid.jsonl"), out=out, seq_len=32))["valid"]


def _own_loglikelihoods(model, tok, doc):
    """Sum of log-probs of each choice after the context, computed here without lm-eval."""
    ctx = tok(doc["context"], add_special_tokens=False)["input_ids"]
    out = []
    for choice in doc["choices"]:
        whole = tok(doc["context"] + choice, add_special_tokens=False)["input_ids"]
        assert whole[:len(ctx)] == ctx
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([whole])).logits[0, :-1].float(), -1)
        out.append(sum(logp[i - 1, whole[i]].item() for i in range(len(ctx), len(whole))))
    return out


def test_tiny_suite_end_to_end(world, checkpoint, heldout, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.chdir(tmp_path)  # the task YAMLs must not depend on the working directory
    out = tmp_path / "eval" / "model.json"
    start = time.time()
    rc = main([str(checkpoint), "--tasks-dir", str(world / "tasks"), "--heldout", str(heldout),
               "--teacher", str(checkpoint), "--batch-size", "8", "--threads", "1", "--out", str(out),
               "--name", "rand"])
    elapsed = time.time() - start
    assert rc == 0 and elapsed < 60
    record = json.loads(out.read_text())
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.json", "model.lm_eval"]
    # lm-eval's own record beside the summary: its results and one per-document log per task.
    records = out.parent / record["lm_eval_records"]
    raw = json.loads((records / "results.json").read_text())
    for name, entry in record["tasks"].items():
        assert raw["results"][name][f"{entry['metric']},none"] == pytest.approx(entry["value"])
        logged = [json.loads(line) for line in (records / f"samples_{name}.jsonl").read_text().splitlines()]
        assert len(logged) == len((world / "tasks" / f"{name}.jsonl").read_text().splitlines())
        assert sum(s[entry["metric"]] for s in logged) / len(logged) == pytest.approx(entry["value"])
    assert record["model"] == "rand" and record["suite"] == "tiny"
    suite = load_suite("tiny")["tasks"]
    assert set(record["tasks"]) == set(suite)
    for name, entry in record["tasks"].items():
        assert entry["metric"] == suite[name]["metric"] and entry["chance"] == 1 / suite[name]["choices"]
        assert entry["value"] == entry[entry["metric"]] and 0 <= entry["value"] <= 1 and entry["stderr"] > 0
    values = [t["value"] for t in record["tasks"].values()]
    assert record["aggregate"] == {"name": "Avg", "value": pytest.approx(sum(values) / len(values))}
    assert (record["lm_eval"]["num_fewshot"] == 0 and record["lm_eval"]["batch_size"] == 8
            and record["lm_eval"]["version"])

    # lm-eval's accuracy and gold log-likelihood agree with a direct computation.
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint)).eval()
    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    docs = [json.loads(line) for line in (world / "tasks/world_facts.jsonl").read_text().splitlines()]
    lls = [_own_loglikelihoods(model, tok, d) for d in docs]
    acc = sum(max(range(len(ll)), key=ll.__getitem__) == d["gold"] for ll, d in zip(lls, docs)) / len(docs)
    assert record["tasks"]["world_facts"]["acc"] == pytest.approx(acc)
    gold = sum(ll[d["gold"]] for ll, d in zip(lls, docs)) / len(docs)
    assert record["tasks"]["world_facts"]["answer_logprob"] == pytest.approx(gold, abs=1e-3)

    extra = record["extra"]
    assert extra["kl_to_teacher"] == pytest.approx(0.0, abs=1e-6)  # the model is its own teacher
    assert extra["answer_kl"] == pytest.approx(0.0, abs=1e-6)
    assert extra["perplexity"] > 1


def test_heldout_perplexity_matches_the_models_own_loss():
    from tests.helpers import make_teacher

    model, other = make_teacher("llama-tied", seed=0), make_teacher("llama-tied", seed=1)
    rows = torch.randint(0, 97, (3, 12), generator=torch.Generator().manual_seed(0))
    masks = torch.ones_like(rows, dtype=torch.bool)
    got = heldout_measures(model, rows, masks, teacher=other, batch_size=2)
    with torch.no_grad():
        loss = model(rows, labels=rows).loss.item()
        p = torch.log_softmax(other(rows).logits[:, :-1], -1)
        q = torch.log_softmax(model(rows).logits[:, :-1], -1)
        kl = (p.exp() * (p - q)).sum(-1).mean().item()
    assert got["perplexity"] == pytest.approx(torch.exp(torch.tensor(loss)).item(), rel=1e-5)
    assert got["kl_to_teacher"] == pytest.approx(kl, rel=1e-5) and kl > 0
    agree = (p.argmax(-1) == q.argmax(-1)).float()
    assert got["top1_agreement"] == pytest.approx(agree.mean().item())  # (these two predict alike: 1.0)
    kept = got["heldout_rows"]  # per row: the sums behind the means, for lrc compare
    assert kept["tokens"] == [11, 11, 11] and kept["top1_agreement"] == agree.sum(1).tolist()
    assert sum(kept["nll"]) / 33 == pytest.approx(loss, rel=1e-5)
    assert sum(kept["kl_to_teacher"]) / 33 == pytest.approx(kl, rel=1e-5)
    masks[:, 6:] = False  # only positions whose target is counted enter the average
    part = heldout_measures(model, rows, masks)
    with torch.no_grad():
        loss5 = model(rows[:, :6], labels=rows[:, :6]).loss.item()
    assert part["perplexity"] == pytest.approx(torch.exp(torch.tensor(loss5)).item(), rel=1e-5)


@pytest.mark.slow
def test_paper_suite_builds_the_right_lm_eval_call(tmp_path):
    args = EvaluateArgs(model=str(tmp_path), out=tmp_path / "e.json", suite="paper", batch_size=32, limit=100)
    tasks = selected_tasks(load_suite("paper"), None)
    assert {k: v["metric"] for k, v in tasks.items()} == PAPER
    call = lm_eval_call(args, tasks, task_manager(args, None))
    assert call["tasks"] == list(PAPER) and call["num_fewshot"] == 0
    assert call["batch_size"] == 32 and call["limit"] == 100 and call["log_samples"]
    check_tasks_known(call["task_manager"], tasks)  # every name and metric is lm-eval's own
    with pytest.raises(LRCError, match="does not compute 'acc_norm'"):
        check_tasks_known(call["task_manager"], {"winogrande": {"metric": "acc_norm"}})
    with pytest.raises(LRCError, match="no task or group named 'arc_medium'"):
        check_tasks_known(call["task_manager"], {"arc_medium": {"metric": "acc"}})


def test_bad_input_is_named(world, checkpoint, tmp_path):
    with pytest.raises(LRCError, match="--suite tiny needs --tasks-dir"):
        main([str(checkpoint), "--out", str(tmp_path / "e.json")])
    with pytest.raises(LRCError, match=r"--tasks \['world_nope'\] not in suite 'tiny'"):
        main([str(checkpoint), "--tasks-dir", str(world / "tasks"), "--tasks", "world_nope",
              "--out", str(tmp_path / "e.json")])
    with pytest.raises(LRCError, match="--model .*missing is not a checkpoint directory"):
        main([str(tmp_path / "missing"), "--tasks-dir", str(world / "tasks"), "--out", str(tmp_path / "e.json")])
    empty = tmp_path / "tasks"
    empty.mkdir()
    with pytest.raises(LRCError, match="has no task file world_facts.yaml"):
        main([str(checkpoint), "--tasks-dir", str(empty), "--out", str(tmp_path / "e.json")])
    assert not (tmp_path / "e.json").exists()


def test_moved_world_tasks_are_repointed(world, tmp_path):
    import shutil

    import yaml

    from lrc.commands.evaluate import prepare_include_dir

    moved = tmp_path / "elsewhere" / "tasks"
    shutil.copytree(world / "tasks", moved)
    include = prepare_include_dir(moved, ["world_facts", "world_pairs"], tmp_path / "include")
    assert sorted(p.name for p in include.iterdir()) == ["world_facts.yaml", "world_pairs.yaml"]
    for name in ("world_facts", "world_pairs"):
        config = yaml.safe_load((include / f"{name}.yaml").read_text())
        assert config["dataset_kwargs"]["data_files"]["test"] == str(moved.resolve() / f"{name}.jsonl")
    (moved / "world_pairs.jsonl").unlink()
    with pytest.raises(LRCError, match="task world_pairs: data file .*world_pairs.jsonl not found"):
        prepare_include_dir(moved, ["world_pairs"], tmp_path / "include2")


@pytest.mark.slow
def test_paper_suite_without_network_names_the_task(checkpoint, tmp_path, monkeypatch):
    import datasets
    import huggingface_hub

    # No network in this test even where CI has it: both libraries read these at import.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    with pytest.raises(LRCError, match=r"lm-eval failed on suite 'paper' \(tasks boolq\).*needs the hub's datasets"):
        main([str(checkpoint), "--suite", "paper", "--tasks", "boolq", "--threads", "1",
              "--out", str(tmp_path / "e.json")])
    # Any task lm-eval knows, outside the paper's nine, is taken (here up to its dataset's download).
    with pytest.raises(LRCError, match=r"suite 'lm-eval' \(tasks hellaswag\).*needs the hub's datasets"):
        main([str(checkpoint), "--suite", "lm-eval", "--tasks", "hellaswag:acc_norm", "--threads", "1",
              "--out", str(tmp_path / "e.json")])
    with pytest.raises(LRCError, match=r"lm-eval has no task or group named 'hellaswog'"):
        main([str(checkpoint), "--suite", "lm-eval", "--tasks", "hellaswog", "--out", str(tmp_path / "e.json")])
    assert not (tmp_path / "e.json").exists() and not (tmp_path / "e.lm_eval").exists()


def test_answer_kl_with_padding_matches_one_context_at_a_time(world):
    from transformers import AutoTokenizer

    from lrc.commands.evaluate import answer_kl
    from tests.helpers import make_teacher

    tok = AutoTokenizer.from_pretrained(str(world / "tokenizer"))
    model, teacher = make_teacher("llama-tied", 0, len(tok)), make_teacher("llama-untied", 1, len(tok))
    contexts = ["Kabo lives in", "The favorite color of Kabo is", "Zu is a"]
    expected = []
    with torch.no_grad():
        for c in contexts:
            ids = torch.tensor([tok(c, add_special_tokens=False)["input_ids"]])
            p = torch.log_softmax(teacher(ids).logits[0, -1], -1)
            q = torch.log_softmax(model(ids).logits[0, -1], -1)
            expected.append((p.exp() * (p - q)).sum().item())
    got = answer_kl(model, teacher, tok, contexts, batch_size=2)
    assert got == pytest.approx(sum(expected) / len(expected), rel=1e-4) and got > 0


def _swapped_tokenizer(source, out):
    """The same tokenizer with two token ids swapped: equal vocabulary size, other fingerprint."""
    import shutil

    shutil.copytree(source, out)
    spec = json.loads((out / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(t for t, i in vocab.items() if i in (100, 101))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return out


def test_another_tokenizer_of_the_same_size_is_refused_naming_both(world, checkpoint, heldout, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    from lrc.io.tokens import tokenizer_fingerprint

    other = _swapped_tokenizer(world / "tokenizer", tmp_path / "other_tok")
    own_tok, other_tok = AutoTokenizer.from_pretrained(str(checkpoint)), AutoTokenizer.from_pretrained(str(other))
    assert len(own_tok) == len(other_tok)
    own, theirs = tokenizer_fingerprint(own_tok), tokenizer_fingerprint(other_tok)
    assert own != theirs
    out = tmp_path / "e.json"
    out.write_text('{"earlier": true}')
    args = ["--tasks-dir", str(world / "tasks"), "--out", str(out), "--threads", "1"]
    with pytest.raises(LRCError, match=rf"tokenizer .*other_tok \(fingerprint {theirs}\) is not the one saved with "
                                       rf"--model .*model \(fingerprint {own}\)"):
        main([str(checkpoint), "--tokenizer", str(other), *args])
    # A model saved without a tokenizer: the held-out data's manifest names the one it was built with.
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(checkpoint / f, bare / f)
    with pytest.raises(LRCError, match=rf"token directory .*valid was built with tokenizer .*fingerprint {own}\), "
                                       rf"not with the expected tokenizer .*other_tok.*fingerprint {theirs}\)"):
        main([str(bare), "--tokenizer", str(other), "--heldout", str(heldout), *args])
    # ... and so does a teacher saved with its tokenizer.
    with pytest.raises(LRCError, match=rf"\(fingerprint {theirs}\) is not the one saved with --teacher"):
        main([str(bare), "--tokenizer", str(other), "--teacher", str(checkpoint), *args])
    assert json.loads(out.read_text()) == {"earlier": True}  # the earlier output is left as it was


def test_a_tampered_heldout_set_is_refused_before_lm_eval(world, checkpoint, heldout, tmp_path, capsys, monkeypatch):
    import shutil

    import lm_eval

    from lrc.cli import main as lrc

    def not_reached(**kwargs):
        raise AssertionError("lm-eval ran before the held-out set was checked")

    monkeypatch.setattr(lm_eval, "simple_evaluate", not_reached)
    copy = tmp_path / "valid"
    shutil.copytree(heldout, copy)
    data = bytearray((copy / "tokens.bin").read_bytes())
    data[0] ^= 1  # same size, another id
    (copy / "tokens.bin").write_bytes(bytes(data))
    rc = lrc(["evaluate", str(checkpoint), "--tasks-dir", str(world / "tasks"), "--heldout", str(copy),
              "--threads", "1", "--out", str(tmp_path / "e.json")])
    assert rc == 2
    assert re.search(r"^error: .*valid/tokens.bin: its SHA-256 .* recorded in manifest.json", capsys.readouterr().err,
                     re.M)
    assert (copy / "tokens.bin").read_bytes() == bytes(data) and not (tmp_path / "e.json").exists()


def test_evaluation_reads_the_suites_without_the_tiny_world():
    import subprocess
    import sys

    code = ("import sys, lrc.commands.evaluate; "
            "print(sorted(m for m in sys.modules if m == 'lrc.world' or m.startswith('lrc.world.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    from lrc.io import suites

    assert load_suite is suites.load_suite  # one reader, shared with `lrc world`
    with pytest.raises(LRCError, match="unknown suite .tiny_task.; choose one of: tiny, paper, local, none"):
        load_suite("tiny_task")


# ---- held-out measures alone, and local task directories ---------------------------------


def test_suite_none_gives_the_heldout_measures_without_lm_eval(checkpoint, heldout, tmp_path, monkeypatch):
    import lm_eval

    from lrc.commands.evaluate import heldout_rows, load_model
    from lrc.io.tokens import TokenDataset

    def not_reached(**kwargs):
        raise AssertionError("lm-eval ran for --suite none")

    monkeypatch.setattr(lm_eval, "simple_evaluate", not_reached)
    out = tmp_path / "none.json"
    assert main([str(checkpoint), "--suite", "none", "--heldout", str(heldout), "--teacher", str(checkpoint),
                 "--heldout-rows", "8", "--threads", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["suite"] == "none" and record["tasks"] == {} and record["aggregate"] == {"name": None, "value": None}
    rows, masks = heldout_rows(TokenDataset(heldout), 8)
    direct = heldout_measures(load_model(str(checkpoint), torch.device("cpu")), rows, masks)
    assert record["extra"]["perplexity"] == pytest.approx(direct["perplexity"], rel=1e-5)
    assert (record["extra"]["kl_to_teacher"] == pytest.approx(0.0, abs=1e-6)
            and record["extra"]["heldout_tokens"] == direct["heldout_tokens"])
    with pytest.raises(LRCError, match="--suite none measures only held-out rows: give --heldout"):
        EvaluateArgs(model="m", out=tmp_path / "x.json", suite="none")
    with pytest.raises(LRCError, match="--suite none runs no task"):
        EvaluateArgs(model="m", out=tmp_path / "x.json", suite="none", heldout=heldout, tasks=["world_facts"])


def test_a_local_task_directory_scores_as_the_tiny_suite_does(world, checkpoint, tmp_path):
    """`--suite local` on the world's tasks/ (no suite.yaml: every task YAML in it) gives the tiny suite's numbers."""
    common = [str(checkpoint), "--tasks-dir", str(world / "tasks"), "--limit", "12", "--batch-size", "8",
              "--threads", "1"]
    assert main(common + ["--suite", "local", "--out", str(tmp_path / "local.json")]) == 0
    assert main(common + ["--suite", "tiny", "--out", str(tmp_path / "tiny.json")]) == 0
    local, tiny = (json.loads((tmp_path / f"{n}.json").read_text())["tasks"] for n in ("local", "tiny"))
    assert set(local) == set(tiny) == set(load_suite("tiny")["tasks"])
    for name in tiny:
        assert local[name]["metric"] == "acc" and local[name]["acc"] == pytest.approx(tiny[name]["acc"])
    with pytest.raises(LRCError, match="--suite local needs --tasks-dir"):
        main([str(checkpoint), "--suite", "local", "--out", str(tmp_path / "x.json")])
    with pytest.raises(LRCError, match="holds no lm-eval task YAML"):
        main([str(checkpoint), "--suite", "local", "--tasks-dir", str(tmp_path), "--out", str(tmp_path / "x.json")])


def test_heldout_tasks_from_lrc_tasks_run_offline(world, checkpoint, heldout, tmp_path):
    from lrc.commands.tasks import main as tasks_main

    tasks = tmp_path / "tasks"
    assert tasks_main(["--data", str(world / "corpus/valid.jsonl"), "--tokenizer", str(world / "tokenizer"),
                       "--out", str(tasks), "--prefix-tokens", "12", "--continuation-tokens", "6",
                       "--items", "16"]) == 0
    out = tmp_path / "e.json"
    assert main([str(checkpoint), "--suite", "local", "--tasks-dir", str(tasks), "--heldout", str(heldout),
                 "--heldout-rows", "4", "--batch-size", "8", "--threads", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["suite"] == "local" and set(record["tasks"]) == {"heldout_continuation", "heldout_shuffled"}
    assert (record["tasks"]["heldout_continuation"]["chance"] == 0.25
            and record["tasks"]["heldout_shuffled"]["chance"] == 0.5)
    values = [t["value"] for t in record["tasks"].values()]
    assert (all(0 <= v <= 1 for v in values)
            and record["aggregate"] == {"name": "Avg", "value": pytest.approx(sum(values) / 2)})
    assert record["extra"]["perplexity"] > 1


# ---- any lm-eval task, its records kept, two models compared item by item ---------------------


@pytest.fixture(scope="module")
def other_checkpoint(checkpoint, tmp_path_factory):
    """The checkpoint with its weights moved a little: a second model to compare with."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    out = tmp_path_factory.mktemp("other") / "model"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(checkpoint)).save_pretrained(out)
    return out


def test_two_models_compared_on_the_same_heldout_rows(checkpoint, other_checkpoint, heldout, tmp_path, capsys):
    import pandas as pd

    from lrc.cli import main as lrc

    common = ["--suite", "none", "--heldout", str(heldout), "--teacher", str(checkpoint), "--threads", "1"]
    for name, model, rows in (("a", checkpoint, "8"), ("b", other_checkpoint, "8"), ("b4", other_checkpoint, "4")):
        out = tmp_path / f"{name}.json"
        assert lrc(["evaluate", str(model), *common, "--heldout-rows", rows, "--out", str(out)]) == 0
    a, b = (json.loads((tmp_path / f"{n}.json").read_text())["extra"] for n in "ab")
    capsys.readouterr()
    assert lrc(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path / "c.csv")]) == 0
    table = pd.read_csv(tmp_path / "c.csv").set_index("task")
    assert list(table.index) == ["heldout_ce", "heldout_kl_to_teacher", "heldout_top1_agreement"]
    assert (table["items"] == 8).all() and (table["interval"] == "paired bootstrap over held-out rows").all()
    kl, top1, ce = table.loc["heldout_kl_to_teacher"], table.loc["heldout_top1_agreement"], table.loc["heldout_ce"]
    csv = 5e-5  # the table's numbers are written to 4 decimals
    assert kl["a"] == pytest.approx(0.0, abs=1e-6) and kl["b"] == pytest.approx(b["kl_to_teacher"], abs=csv)
    assert top1["a"] == pytest.approx(1.0) and top1["b"] == pytest.approx(b["top1_agreement"], abs=csv)
    assert ce["a"] == pytest.approx(math.log(a["perplexity"]), abs=csv)
    # the moved model is farther from the teacher on every row: the interval lies above 0
    assert 0 < kl["ci_low"] <= kl["b_minus_a"] <= kl["ci_high"] and kl["p"] < 0.01
    assert "heldout_kl_to_teacher" in capsys.readouterr().out
    assert lrc(["compare", str(tmp_path / "a.json"), str(tmp_path / "b4.json")]) != 0
    assert "not measured on the same held-out rows" in capsys.readouterr().err


@pytest.mark.slow
def test_any_local_task_directory_through_include_path_and_a_paired_comparison(world, checkpoint, other_checkpoint,
                                                                                tmp_path, capsys):
    import pandas as pd

    from lrc.cli import main as lrc
    from lrc.commands.evaluate import prepare_include_dir

    tasks = prepare_include_dir(world / "tasks", ["world_facts"], tmp_path / "mytasks")  # absolute data paths
    common = ["--suite", "lm-eval", "--include-path", str(tasks), "--tasks", "world_facts", "--batch-size", "8",
              "--threads", "1", "--model-args", "max_length=64"]
    for name, model in (("a", checkpoint), ("b", other_checkpoint)):
        assert lrc(["evaluate", str(model), *common, "--limit", "40", "--out", str(tmp_path / f"{name}.json")]) == 0
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    assert a["suite"] == "lm-eval" and a["tasks"]["world_facts"]["metric"] == "acc"
    assert a["aggregate"]["name"] == "Avg" and a["tasks"]["world_facts"]["value"] != b["tasks"]["world_facts"]["value"]

    capsys.readouterr()
    assert lrc(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path / "c.csv")]) == 0
    row = pd.read_csv(tmp_path / "c.csv").iloc[0]
    assert row["task"] == "world_facts" and row["items"] == 40
    assert row["a"] == pytest.approx(a["tasks"]["world_facts"]["value"], abs=1e-4)
    assert row["b"] == pytest.approx(b["tasks"]["world_facts"]["value"], abs=1e-4)
    assert row["b_minus_a"] == pytest.approx(row["b"] - row["a"], abs=2e-4)
    assert row["ci_low"] < row["b_minus_a"] < row["ci_high"] and 0 <= row["p"] <= 1
    assert "world_facts" in capsys.readouterr().out

    # Not the same items: refused, naming the task and the counts.
    assert lrc(["evaluate", str(other_checkpoint), *common, "--limit", "20", "--out", str(tmp_path / "b20.json")]) == 0
    capsys.readouterr()
    assert lrc(["compare", str(tmp_path / "a.json"), str(tmp_path / "b20.json")]) != 0
    assert re.search(r"task world_facts: .*a.json has 40 documents and .*b20.json 20", capsys.readouterr().err)
    with pytest.raises(LRCError, match="batch_size are set by lrc evaluate's own options"):
        main([str(checkpoint), *common[:-1], "batch_size=2", "--out", str(tmp_path / "x.json")])
    with pytest.raises(LRCError, match="--suite lm-eval runs the tasks you name: give --tasks"):
        EvaluateArgs(model="m", out=tmp_path / "x.json", suite="lm-eval")


@pytest.mark.slow
def test_fetch_tasks_builds_the_tasks_ahead_and_names_what_it_fetched(world, tmp_path, monkeypatch):
    """`lrc fetch-tasks` builds the tasks as an evaluation would (their data into the cache): a local
    task directory works offline; a hub task offline is refused naming the task and the hub."""
    import datasets
    import huggingface_hub

    from lrc.cli import main as lrc
    from lrc.commands.evaluate import prepare_include_dir

    tasks = prepare_include_dir(world / "tasks", ["world_facts", "world_pairs"], tmp_path / "mytasks")
    out = tmp_path / "fetched.json"
    assert lrc(["fetch-tasks", "--suite", "lm-eval", "--include-path", str(tasks), "--tasks", "world_facts",
                "world_pairs", "--out", str(out)]) == 0
    fetched = json.loads(out.read_text())["tasks"]
    assert set(fetched) == {"world_facts", "world_pairs"}
    assert fetched["world_facts"]["documents"] == len((world / "tasks/world_facts.jsonl").read_text().splitlines())
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    with pytest.raises(LRCError, match="could not build the tasks boolq.*fetching needs the hub"):
        from lrc.commands.fetch_tasks import main as fetch

        fetch(["--tasks", "boolq", "--out", str(tmp_path / "paper.json")])
    with pytest.raises(LRCError, match=r"--tasks \['hellaswag'\] not in suite 'paper'"):
        fetch(["--tasks", "hellaswag", "--out", str(tmp_path / "paper.json")])
    assert not (tmp_path / "paper.json").exists()
