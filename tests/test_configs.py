"""Every shipped config passes the schema, and its flag sections name real command options."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.helpers import command_options

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
# The shipped configs, and any a user adds to config/paper/ ("Your own teacher on a SLURM cluster" in the README).
CONFIGS = sorted([ROOT / "config" / "config.yaml", ROOT / "config" / "test.yaml",
                  *(ROOT / "config" / "paper").glob("*.yaml")])
SHIPPED = ["config/config.yaml", "config/test.yaml", "config/paper/llama3.1-8b.yaml", "config/paper/llama3.2-3b.yaml",
           "config/paper/qwen2.5-3b.yaml"]

# Config section -> the `lrc` command whose options it holds.
SECTIONS = {
    ("world",): "world",
    ("teacher", "hub"): "download",
    ("teacher", "pretrain"): "pretrain",
    ("data", "corpus"): "tokenize",
    ("data", "sft"): "tokenize",
    ("svd",): "svd",
    ("warmstart",): "warmstart",
    ("distill", "train"): "distill",
    ("merge",): "merge",
    ("sft", "train"): "sft",
    ("evaluate",): "evaluate",
    ("audit",): "audit",
}


def load(path):
    return yaml.safe_load(Path(path).read_text())


def validator():
    return jsonschema.Draft202012Validator(yaml.safe_load(SCHEMA.read_text()))


def test_every_config_is_listed():
    listed = [p.relative_to(ROOT).as_posix() for p in CONFIGS]
    assert set(SHIPPED) <= set(listed) and all(p.exists() for p in CONFIGS), listed


@pytest.mark.parametrize("path", ["config/config.yaml", "config/test.yaml"])
def test_local_configs_checkpoint_every_training_stage(path):
    """A killed local run resumes instead of restarting from step 0 (checkpoints do not change
    the trajectory: resuming reaches the same weights, tests/training/test_resume.py)."""
    (x,) = load(ROOT / path)["experiments"].values()
    for where in (x["teacher"]["pretrain"], x["warmstart"], x["distill"]["train"], x["sft"]["train"]):
        assert where.get("checkpoint_every", 0) > 0, where


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_config_passes_the_schema(path):
    errors = sorted(validator().iter_errors(load(path)), key=lambda e: list(e.absolute_path))
    assert not errors, [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_flag_sections_name_real_options(path):
    """Config keys ARE the commands' option names: a typo is caught here, not in a job."""
    for exp, settings in load(path)["experiments"].items():
        sections = [(".".join(keys), command, _get(settings, keys)) for keys, command in SECTIONS.items()]
        sections += [(f"loss.{r}", c, f) for r, f in settings.get("loss", {}).items() for c in ("warmstart", "distill")]
        for where, command, section in sections:
            if not section:
                continue
            options = command_options(command)
            unknown = set(section) - options
            assert not unknown, (
                f"{path.name}: experiments.{exp}.{where}: not options of `lrc {command}`: {sorted(unknown)}")


def _get(settings, keys):
    for key in keys:
        settings = (settings or {}).get(key)
    return settings


def test_paper_configs_follow_method():
    """Widths and recipe numbers of docs/method.md §1 (Llama-3.1-8B's r is an assumption, see its file)."""
    expect = {
        "llama3.2-3b": ("meta-llama/Llama-3.2-3B", 1536, 1e-4, 24 * 2048, 0.2),
        "llama3.1-8b": ("meta-llama/Llama-3.1-8B", 1376, 1e-4, 24 * 2048, 0.2),
        "qwen2.5-3b": ("Qwen/Qwen2.5-3B", 1200, 6.7e-5, 16 * 2048, 0.5),
    }
    for name, (repo, r, lr, tokens_per_step, alpha) in expect.items():
        (exp, x), = load(ROOT / "config" / "paper" / f"{name}.yaml")["experiments"].items()
        assert exp == name and x["teacher"]["hub"]["repo_id"] == repo
        assert re.fullmatch(r"[0-9a-f]{40}", x["teacher"]["hub"]["revision"])  # a pinned commit
        assert x["student"]["hidden_size"] == r
        train = x["distill"]["train"]
        assert train["lr"] == pytest.approx(lr) and x["warmstart"]["lr"] == pytest.approx(lr)
        assert train["batch_size"] * x["data"]["corpus"]["seq_len"] == tokens_per_step
        assert x["loss"]["lrc"] == {"alpha": alpha, "temperature": 40.0}
        assert x["warmstart"]["tokens"] + x["distill"]["tokens"][0] == 10_000_000_000
        assert {"slice", "dense", "core"} <= set(x["distill"]["arms"])


@pytest.mark.parametrize(
    "edit, key, reason",
    [
        (lambda c: c["experiments"]["tiny"]["distill"]["arms"].append("wide"), "experiments.tiny.distill.arms.3",
         "'wide' is not one of"),
        (lambda c: c["experiments"]["tiny"]["student"].update(hidden_size="48"), "experiments.tiny.student.hidden_size",
         "is not of type 'integer'"),
        (lambda c: c["experiments"]["tiny"]["distill"].pop("tokens"), "experiments.tiny.distill",
         "'tokens' is a required property"),
        (lambda c: c["experiments"]["tiny"]["distill"]["train"].update({"Learning-Rate": 1}),
         "experiments.tiny.distill.train", "does not match"),
        (lambda c: c["experiments"]["tiny"].update(teacher={"source": "hub"}), "experiments.tiny.teacher",
         "'hub' is a required property"),
    ],
)
def test_broken_config_is_refused_naming_the_key(edit, key, reason):
    config = copy.deepcopy(load(ROOT / "config" / "config.yaml"))
    edit(config)
    errors = list(validator().iter_errors(config))
    assert errors
    assert any(".".join(map(str, e.absolute_path)) == key and reason in e.message for e in errors), [
        (".".join(map(str, e.absolute_path)), e.message) for e in errors
    ]
