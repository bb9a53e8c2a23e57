"""lm-eval's task index, the open suite of any task it knows, and fetching tasks' datasets ahead.

`lrc evaluate --suite lm-eval` and `lrc fetch-tasks` share these. Fetching a task means building it
as lm-eval does before an evaluation (which loads its dataset through `datasets` into the cache), so
a later evaluation on an offline compute node (``HF_DATASETS_OFFLINE=1``) finds everything there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from lrc.errors import LRCError


def task_index(include_paths: Sequence[Path] | None = None, only: Path | None = None) -> Any:
    """lm-eval's ``TaskManager``: the YAMLs of ``only`` alone (skipping lm-eval's thousands of task files
    saves most of the start-up time), or lm-eval's own tasks with the ``include_paths`` directories."""
    from lm_eval.tasks import TaskManager

    if only is not None:
        return TaskManager(include_path=str(only), include_defaults=False)
    for path in include_paths or []:
        if not Path(path).is_dir():
            raise LRCError(f"--include-path {path}: not a directory")
    return TaskManager(include_path=[str(Path(p).resolve()) for p in include_paths] if include_paths else None)


def open_suite(names: Sequence[str], manager: Any) -> dict[str, Any]:
    """Suite lm-eval: each named task or group (``name`` or ``name:metric``) with its metric, the first
    lm-eval lists for it unless named; an average ("Avg") only where every metric is an accuracy."""
    tasks = {}
    for given in names:
        name, _, metric = given.partition(":")
        entry = manager.task_index.get(name)
        if entry is None:
            close = [t for t in manager.all_tasks if name.lower() in t.lower()][:8]
            raise LRCError(f"--tasks {given}: lm-eval has no task or group named {name!r}"
                           + (f" (similar: {', '.join(close)})" if close else ""))
        cfg = entry.cfg or {}
        listed = [m.get("metric") for m in (cfg.get("metric_list") or cfg.get("aggregate_metric_list") or [])]
        tasks[name] = {"metric": metric or (listed[0] if listed else "acc")}
    accuracies = all(t["metric"] in ("acc", "acc_norm") for t in tasks.values())
    return {"name": "lm-eval", "aggregate": "Avg" if accuracies else None, "tasks": tasks}


def _leaf_tasks(loaded: Any) -> list[Any]:
    """The tasks of lm-eval's loaded mapping (a group's value is a mapping of its own)."""
    if isinstance(loaded, dict):
        return [task for value in loaded.values() for task in _leaf_tasks(value)]
    return [loaded]


def fetch_tasks(names: Sequence[str], manager: Any) -> dict[str, dict[str, Any]]:
    """Build every named task or group as lm-eval does (its datasets land in the cache): per task, its
    dataset, the revision its config pins (None: the dataset's main branch) and its evaluation documents."""
    try:
        loaded = manager.load_task_or_group(list(names))
    except Exception as err:  # noqa: BLE001 (datasets' and the hub's own errors, offline most often)
        raise LRCError(f"lm-eval could not build the tasks {', '.join(names)}: {type(err).__name__}: {err} "
                       "-- fetching needs the hub (network, or a populated HF_DATASETS_CACHE)") from err
    fetched = {}
    for task in _leaf_tasks(loaded):
        config = task.config
        fetched[config.task] = {"dataset_path": config.dataset_path, "dataset_name": config.dataset_name,
                                "revision": (config.dataset_kwargs or {}).get("revision"),
                                "documents": len(list(task.eval_docs))}
    return fetched
