"""`lrc fetch-tasks`: the evaluation datasets into the local cache ahead of the run (:mod:`lrc.io.lm_eval_tasks`).

On a cluster whose compute nodes are offline, the workflow runs this where the network is (a local
rule) before any evaluation job; the JSON it writes names each task's dataset, the revision its
lm-eval config pins and its number of evaluation documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

from lrc.errors import LRCError
from lrc.io.atomic import write_json_atomic
from lrc.io.lm_eval_tasks import fetch_tasks, open_suite, task_index
from lrc.io.provenance import library_versions, provenance
from lrc.io.suites import load_suite, selected_tasks
from lrc.options import parse_args


@dataclass(kw_only=True)
class FetchTasksArgs:
    """Load the datasets of an evaluation's lm-eval tasks into the cache, so evaluation can run offline."""

    out: Path = field(metadata={"help": "JSON file to write: per task its dataset, revision and documents",
                                "output": "file"})
    suite: Literal["paper", "lm-eval"] = field(default="paper", metadata={
        "help": "paper (the paper's nine tasks) or lm-eval (the tasks named in --tasks)"})
    tasks: list[str] | None = field(default=None, metadata={
        "help": "only these tasks of the suite; suite lm-eval: the tasks or groups (task or task:metric)"})
    include_path: list[Path] | None = field(default=None, metadata={
        "help": "suite lm-eval: directories of task YAMLs added to lm-eval's own"})

    def __post_init__(self) -> None:
        if self.suite == "lm-eval" and not self.tasks:
            raise LRCError("--suite lm-eval fetches the tasks you name: give --tasks")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(FetchTasksArgs, argv, prog="lrc fetch-tasks")
    manager = task_index(args.include_path)
    names = list(open_suite(args.tasks, manager)["tasks"] if args.suite == "lm-eval"
                 else selected_tasks(load_suite("paper"), args.tasks))
    fetched = fetch_tasks(names, manager)
    write_json_atomic(args.out, {"suite": args.suite, "tasks": fetched, "lm_eval": library_versions()["lm_eval"],
                                 "settings": provenance("fetch-tasks", args)})
    print(f"fetched {len(fetched)} tasks ({sum(t['documents'] for t in fetched.values()):,} documents) -> {args.out}")
    return 0
