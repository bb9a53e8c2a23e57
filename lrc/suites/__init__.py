"""The evaluation suites, as data: ``<name>.yaml`` here, read by `lrc evaluate` and `lrc world`.

``paper.yaml`` holds the paper's nine zero-shot tasks (metric per task, "Avg9"); ``tiny.yaml``
the tiny world's four families ("Avg"); ``tiny_task.yaml`` is the lm-eval task template the
world fills in for each family. A neutral home: evaluation does not import the tiny world.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from lrc.errors import LRCError

SUITES = ("tiny", "paper")


def _read(name: str) -> dict[str, Any]:
    return yaml.safe_load((resources.files(__name__) / f"{name}.yaml").read_text())


def load_suite(name: str) -> dict[str, Any]:
    """The suite description shipped as ``lrc/suites/<name>.yaml``."""
    if name not in SUITES:
        raise LRCError(f"unknown suite {name!r}; choose one of: {', '.join(SUITES)}")
    return _read(name)


def task_template() -> dict[str, Any]:
    """The lm-eval task YAML of one tiny-world family, before `lrc world` fills it in."""
    return _read("tiny_task")
