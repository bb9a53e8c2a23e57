"""A researcher's own teacher, run from their own project directory (outside the checkout):
plan -> a wrong width refused before any job -> dry run -> run -> table -> model card, with
nothing written inside the checkout."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.workflow_helpers import ROOT, failure_report, snakemake

pytestmark = pytest.mark.slow


def checkout_files() -> dict[str, int]:
    """Every file of the checkout but bytecode caches, with its modification time."""
    skip = {"__pycache__", ".pytest_cache", ".git"}
    return {str(p.relative_to(ROOT)): p.stat().st_mtime_ns for p in ROOT.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(ROOT).parts)}


@pytest.fixture(scope="module")
def own_teacher(tmp_path_factory):
    """The tiny world's teacher as a plain HF directory (weights and tokenizer), outside the checkout."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from lrc.commands.world import main as world_main

    base = tmp_path_factory.mktemp("own")
    world_main(["--out", str(base / "world"), "--size", "test", "--seed", "0"])
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**json.loads((base / "world" / "teacher_config.json").read_text())))
    model.save_pretrained(base / "teacher")
    AutoTokenizer.from_pretrained(str(base / "world" / "tokenizer")).save_pretrained(base / "teacher")
    return base


def project_config(own, hidden_size: int) -> dict:
    world = own / "world"
    train = {"batch_size": 4, "micro_batch_size": 4, "lr": 0.003, "checkpoint_every": 10, "progress": False}
    return {"experiments": {"mine": {
        "teacher": {"source": "local", "local": {"path": str(own / "teacher")}},
        "data": {"corpus": {"source": str(world / "corpus/train.jsonl"),
                            "valid_source": str(world / "corpus/valid.jsonl"), "seq_len": 32}},
        "student": {"hidden_size": hidden_size},
        "warmstart": {"tokens": 1280, **train},
        "distill": {"arms": ["slice", "dense"], "tokens": [1280], "train": train},
        "sft": {"enabled": False},
        "evaluate": {"suite": "local", "tasks_dir": str(world / "tasks"), "limit": 8, "heldout_rows": 4},
    }}}


def test_own_teacher_from_a_project_directory_outside_the_checkout(own_teacher, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "wide.yaml").write_text(yaml.safe_dump(project_config(own_teacher, 48)))
    (project / "mine.yaml").write_text(yaml.safe_dump(project_config(own_teacher, 16)))
    before = checkout_files()
    snakefile = str(ROOT / "Snakefile")

    planned = subprocess.run([sys.executable, "-m", "lrc.cli", "plan", "--workflow-config", "mine.yaml",
                              "--arms", "slice", "dense", "--no-search"], cwd=project, capture_output=True, text=True)
    assert planned.returncode == 0, planned.stderr
    assert f"teacher {own_teacher / 'teacher' / 'config.json'}" in planned.stdout

    wide = snakemake("-s", snakefile, "-n", "--cores", "1", "results/table1.csv", "--configfile", "wide.yaml",
                     cwd=project)
    assert wide.returncode != 0
    told = wide.stdout + wide.stderr
    assert "experiments.mine.student.hidden_size: 48 must be below the teacher's hidden size 32" in told
    assert not (project / "results").exists() and not (project / "logs").exists()

    dry = snakemake("-s", snakefile, "-n", "--cores", "1", "results/table1.csv", "--configfile", "mine.yaml",
                    cwd=project)
    assert dry.returncode == 0, dry.stderr[-3000:]

    run = snakemake("-s", snakefile, "--cores", "2", "results/table1.csv", "--configfile", "mine.yaml",
                    cwd=project, timeout=900)
    assert run.returncode == 0, failure_report(run, project)
    table = (project / "results" / "table1.csv").read_text()
    assert "slice" in table and "dense" in table
    card = (project / "results" / "mine" / "merged" / "lrc-dense-s0-t1280" / "README.md").read_text()
    assert "arm `dense`" in card and "teacher" in card
    assert checkout_files() == before, "the run wrote inside the checkout"
