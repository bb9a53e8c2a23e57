"""Experiment trackers fed from the same records as ``metrics.jsonl``, through accelerate's tracker classes.

``auto`` (the default) is TensorBoard when the package is installed, else none: a run never fails for
a missing optional package it was not asked for. A tracker named explicitly (``tensorboard``,
``wandb``, or any other accelerate knows) must be installed, or the run is refused before it starts.
TensorBoard writes under ``<ckpt_dir>/tb``, next to ``metrics.jsonl``; resumed runs continue the same
curves (the step is the optimiser step). Only the main process logs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Sequence

from lrc.errors import LRCError

# accelerate's tracker names and the package each needs
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "comet_ml": "comet_ml",
            "aim": "aim", "clearml": "clearml", "dvclive": "dvclive"}
CHOICES = ("auto", "none", *PACKAGES)


def resolve(names: Sequence[str]) -> list[str]:
    """The trackers to open: ``auto`` -> TensorBoard if installed; ``none`` -> none. Refuses unknown or
    uninstalled ones (naming the package)."""
    chosen: list[str] = []
    for name in names:
        if name not in CHOICES:
            raise LRCError(f"--trackers {name!r}: choose from {', '.join(CHOICES)}")
        if name == "auto":
            chosen += ["tensorboard"] if importlib.util.find_spec("tensorboard") else []
        elif name != "none":
            if importlib.util.find_spec(PACKAGES[name]) is None:
                raise LRCError(f"--trackers {name}: the {PACKAGES[name]} package is not installed "
                               f"(pip install {PACKAGES[name]}), or choose none")
            chosen.append(name)
    if "none" in names and len(set(names)) > 1:
        raise LRCError(f"--trackers {' '.join(names)}: none excludes the others")
    return list(dict.fromkeys(chosen))


def open_trackers(names: Sequence[str], ckpt_dir: Path, run_name: str, config: dict[str, Any]) -> list[Any]:
    """accelerate's tracker objects, started with the run's settings as their configuration."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    trackers = []
    for name in names:
        kwargs = {"logging_dir": str(ckpt_dir / "tb")} if name == "tensorboard" else {}
        tracker = LOGGER_TYPE_TO_CLASS[name](run_name, **kwargs)
        if hasattr(tracker, "start"):
            tracker.start()
        tracker.store_init_configuration(config)
        trackers.append(tracker)
    return trackers
