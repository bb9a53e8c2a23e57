"""The evaluation suites, as data: ``<name>.yaml`` here, read by `lrc evaluate` and `lrc world`.

``paper.yaml`` holds the paper's nine zero-shot tasks (metric per task, "Avg9"); ``tiny.yaml``
the tiny world's four families ("Avg"); ``tiny_task.yaml`` is the lm-eval task template the
world fills in for each family (and `lrc tasks` for its held-out tasks). Two suites are not
files here: ``local`` is any local lm-eval task directory (its ``suite.yaml`` if it has one,
as `lrc tasks` writes, else every task YAML in it), ``none`` has no task (held-out measures
only). A neutral home: evaluation does not import the tiny world.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from lrc.errors import LRCError

SUITES = ("tiny", "paper", "local", "none")  # and `lrc evaluate --suite lm-eval`: lm-eval's own index
SUITE_FILE = "suite.yaml"  # a local task directory's own description (`lrc tasks` writes one)


def _read(name: str) -> dict[str, Any]:
    return yaml.safe_load((resources.files(__name__) / f"{name}.yaml").read_text())


def load_suite(name: str, tasks_dir: str | Path | None = None) -> dict[str, Any]:
    """The suite description: ``lrc/io/suites/<name>.yaml``, a local directory's, or none's."""
    if name not in SUITES:
        raise LRCError(f"unknown suite {name!r}; choose one of: {', '.join(SUITES)}")
    if name == "none":
        return {"name": "none", "aggregate": None, "tasks": {}}
    if name == "local":
        if tasks_dir is None:
            raise LRCError("--suite local needs --tasks-dir (a directory of lm-eval task YAMLs and their data)")
        return local_suite(Path(tasks_dir))
    return _read(name)


def selected_tasks(suite: dict[str, Any], only: list[str] | None) -> dict[str, dict[str, Any]]:
    """The suite's tasks (``only`` those named, each known to the suite), each with its metric and chance."""
    tasks = suite["tasks"]
    if only:
        unknown = [t for t in only if t not in tasks]
        if unknown:
            raise LRCError(f"--tasks {unknown} not in suite {suite['name']!r}; it has: {', '.join(tasks)}")
        tasks = {t: tasks[t] for t in only}
    out = {}
    for name, spec in tasks.items():
        chance = spec.get("chance", 1.0 / spec["choices"] if "choices" in spec else None)
        out[name] = {"metric": spec["metric"], "chance": chance}
    return out


def local_suite(tasks_dir: Path) -> dict[str, Any]:
    """A local lm-eval task directory as a suite. Each task may name its YAML (``file``);
    without ``suite.yaml`` every YAML with a ``task:`` key is a task, scored with the first
    metric of its ``metric_list`` (``acc`` if it lists none), and the aggregate is "Avg"."""
    if not tasks_dir.is_dir():
        raise LRCError(f"--tasks-dir {tasks_dir} is not a directory")
    described = tasks_dir / SUITE_FILE
    if described.is_file():
        suite = yaml.safe_load(described.read_text())
        if not (isinstance(suite, dict) and isinstance(suite.get("tasks"), dict) and suite["tasks"]
                and all(isinstance(t, dict) and "metric" in t for t in suite["tasks"].values())):
            raise LRCError(f"{described}: expected `tasks:` mapping each task to at least its `metric`")
        return {"name": suite.get("name", "local"), "aggregate": suite.get("aggregate", "Avg"), "tasks": suite["tasks"]}
    tasks: dict[str, dict[str, Any]] = {}
    for path in sorted(tasks_dir.glob("*.yaml")):
        try:
            config = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            raise LRCError(f"--tasks-dir {tasks_dir}: {path.name} is not YAML ({err})") from err
        if not isinstance(config, dict) or not isinstance(config.get("task"), str):
            continue  # a group file or something else: only plain task files count
        metrics = [m.get("metric") for m in config.get("metric_list") or [] if isinstance(m, dict)]
        tasks[config["task"]] = {"metric": metrics[0] if metrics else "acc", "file": path.name}
    if not tasks:
        raise LRCError(f"--tasks-dir {tasks_dir} holds no lm-eval task YAML (a .yaml file with a `task:` key)")
    return {"name": "local", "aggregate": "Avg", "tasks": tasks}


def task_template() -> dict[str, Any]:
    """The lm-eval task YAML of one multiple-choice family, before `lrc world` (or `lrc tasks`) fills it in."""
    return _read("tiny_task")
