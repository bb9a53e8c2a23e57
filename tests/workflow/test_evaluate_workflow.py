"""The workflow's offline evaluation of a non-world teacher: `evaluate: {suite: none}` and
`evaluate: {suite: local}` (held-out tasks built by `lrc tasks`, or a task directory of one's own)."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.helpers import command_options
from tests.workflow_helpers import ROOT, shell_commands, snakemake

CONFIG = ROOT / "config" / "paper" / "llama3.2-3b.yaml"


def dry_run(tmp_path, evaluate: dict, tasks: dict | None = None) -> list[str]:
    config = yaml.safe_load(CONFIG.read_text())
    (settings,) = config["experiments"].values()
    settings["evaluate"] = evaluate
    if tasks is not None:
        settings["tasks"] = tasks
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    result = snakemake("-n", "-p", "--forceall", "results/table1.csv", "--configfile", path)
    assert result.returncode == 0, result.stderr
    return shell_commands(result.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("evaluate",
                         [{"suite": "local"}, {"suite": "none"}, {"suite": "local", "tasks_dir": "my/tasks"}],
                         ids=["local-built", "none", "local-own"])
def test_a_hub_teacher_can_be_evaluated_offline(tmp_path, evaluate):
    tasks = {"stride": 32, "kinds": ["continuation", "http_status"]}  # the config's `tasks` flags reach lrc tasks
    commands = dry_run(tmp_path, evaluate, tasks)
    evaluations = [c for c in commands if " lrc evaluate " in f" {c}"]
    built = [c for c in commands if re.search(r"\blrc tasks\b", c)]
    assert len(evaluations) == 4  # the teacher and three students
    if evaluate == {"suite": "local"}:
        assert built == [("lrc tasks --data results/llama3.2-3b/data/corpus/valid "
                          "--tokenizer results/llama3.2-3b/teacher --out results/llama3.2-3b/tasks "
                          "--kinds continuation http_status --stride 32 > logs/llama3.2-3b/tasks.log 2>&1")]
        assert all("--tasks-dir results/llama3.2-3b/tasks" in c and "--suite local" in c for c in evaluations)
        flags = set(re.findall(r"--([a-z][a-z0-9-]*)", built[0]))
        assert {f.replace("-", "_") for f in flags} <= command_options("tasks")
    elif evaluate["suite"] == "none":
        assert not built and all("--suite none" in c and "--tasks-dir" not in c for c in evaluations)
    else:
        assert not built and all(c.count("--tasks-dir") == 1 and "--tasks-dir my/tasks" in c for c in evaluations)
    assert all("--heldout results/llama3.2-3b/data/corpus/valid" in c for c in evaluations)


@pytest.mark.slow
@pytest.mark.parametrize("evaluate, flags", [
    ({"suite": "paper"}, "--suite paper"),
    ({"suite": "lm-eval", "tasks": ["hellaswag", "arc_easy:acc_norm"]},
     "--suite lm-eval --tasks hellaswag arc_easy:acc_norm"),
], ids=["paper", "lm-eval"])
def test_a_hub_suite_is_fetched_where_the_network_is_before_any_evaluation(tmp_path, evaluate, flags):
    commands = dry_run(tmp_path, evaluate)
    fetched = [i for i, c in enumerate(commands) if c.startswith("lrc fetch-tasks")]
    evaluations = [i for i, c in enumerate(commands) if " lrc evaluate " in f" {c}"]
    assert len(fetched) == 1 and len(evaluations) == 4
    assert commands[fetched[0]].startswith(f"lrc fetch-tasks {flags} --out results/llama3.2-3b/eval_tasks.json")
    # The target is results/table1.csv: the fetch is in its DAG only as an input of the evaluations.
    assert not [c for c in dry_run(tmp_path, {"suite": "none"}) if c.startswith("lrc fetch-tasks")]
