"""Training curves: each run's ``metrics.jsonl`` (written by the training loop at every log step),
one panel per logged term, one line per run against the tokens it has seen.

A run is named by its directory (``lrc-dense-s0-t800000``); its arm picks the colour of the
token-efficiency figure, so the same arm reads the same everywhere. Terms absent from a run (the
clone terms of the ``kl`` recipe) are simply not drawn for it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from lrc.analysis.figures import ARM_STYLE
from lrc.errors import LRCError
from lrc.names import parse_run_name

DEFAULT_TERMS = ("loss", "ce", "kl", "grad_norm")


def read_metrics(path: Path) -> list[dict]:
    """The records of one ``metrics.jsonl`` (or of the one inside a run directory), in step order."""
    path = Path(path)
    file = path / "metrics.jsonl" if path.is_dir() else path
    if not file.is_file():
        raise LRCError(f"{path}: no metrics.jsonl (a training output directory or the file itself)")
    records = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as err:
                raise LRCError(f"{file}:{number}: not a JSON line ({err})") from err
    if not records:
        raise LRCError(f"{file}: no logged step (the run logs every --log-every steps)")
    return sorted(records, key=lambda r: r.get("step", 0))


def run_label(path: Path) -> str:
    path = Path(path)
    return (path if path.is_dir() else path.parent).name


def draw_curves(runs: dict[str, list[dict]], terms: tuple[str, ...] = DEFAULT_TERMS):
    """One panel per term that some run logged (log scale where every value is positive)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    present = [t for t in terms if any(t in r for records in runs.values() for r in records)]
    if not present:
        raise LRCError(f"none of the terms {', '.join(terms)} was logged by these runs")
    cols = min(len(present), 3)
    rows = math.ceil(len(present) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, term in zip(axes.flat, present):
        positive = True
        for label, records in runs.items():
            points = [(r["tokens"], r[term]) for r in records if term in r and "tokens" in r]
            if not points:
                continue
            positive &= all(v > 0 for _, v in points)
            parsed = parse_run_name(label)
            color = ARM_STYLE.get(parsed["arm"], (None, None))[0] if parsed else None
            ax.plot(*zip(*points), label=label, color=color, linewidth=1.2,
                    linestyle="-" if not parsed or parsed["recipe"] == "lrc" else "--")
        ax.set_title(term)
        ax.set_xlabel("tokens")
        ax.xaxis.set_major_formatter(EngFormatter())  # 300k, not 300000
        if positive:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    return fig
