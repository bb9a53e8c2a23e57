"""`lrc figure`: the token-efficiency figure (aggregate score against distillation tokens).

Drawn from a results table (``results/table1.csv``, see :mod:`lrc.aggregate`): one panel per
experiment, one line per recipe and arm over the token budgets (log scale), the teacher as a
dashed reference line, and seeds' spread as error bars when there are several.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from lrc.atomic import atomic_file
from lrc.errors import LRCError
from lrc.options import parse_args

ARM_STYLE = {
    "slice": ("tab:gray", "o"),
    "dense": ("tab:blue", "s"),
    "core": ("tab:red", "D"),
    "confined": ("tab:olive", "v"),
    "randcomp": ("tab:purple", "^"),
}


@dataclass(kw_only=True)
class FigureArgs:
    """Draw aggregate score against distillation tokens (log scale), one panel per experiment."""

    table: Path = field(metadata={"help": "results table CSV written by `lrc aggregate` (table1 or controls)"})
    out: list[Path] = field(metadata={"help": "image files to write; the suffix picks the format (.png, .pdf, .svg)"})
    dpi: int = field(default=150, metadata={"help": "resolution of raster formats"})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(FigureArgs, argv, prog="lrc figure")
    if not args.out:
        raise LRCError("--out: no image file given")
    try:
        table = pd.read_csv(args.table)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise LRCError(f"cannot read results table {args.table}: {err}") from err
    missing = {"experiment", "arm", "recipe", "tokens", "aggregate"} - set(table.columns)
    if missing:
        raise LRCError(f"results table {args.table}: missing column(s) {', '.join(sorted(missing))}")
    figure = draw(table)
    for path in args.out:
        save(figure, Path(path), args.dpi)
    return 0


def draw(table: pd.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    experiments = list(dict.fromkeys(table["experiment"]))
    fig, axes = plt.subplots(1, len(experiments), figsize=(4.5 * len(experiments), 3.6), squeeze=False)
    name = _aggregate_name(table)
    for ax, exp in zip(axes[0], experiments):
        rows = table[table["experiment"] == exp]
        students = rows[rows["arm"] != "teacher"]
        for (recipe, arm), line in students.groupby(["recipe", "arm"], sort=False):
            line = line.sort_values("tokens")
            color, marker = ARM_STYLE.get(arm, (None, "x"))
            spread = line["aggregate_sd"] if "aggregate_sd" in line else None
            ax.errorbar(
                line["tokens"], line["aggregate"], yerr=spread, color=color, marker=marker,
                linestyle="-" if recipe == "lrc" else "--", capsize=3, label=f"{arm} ({recipe})",
            )
        teacher = rows[rows["arm"] == "teacher"]
        if len(teacher) and not math.isnan(teacher["aggregate"].iloc[0]):
            ax.axhline(teacher["aggregate"].iloc[0], color="black", linestyle=":", label="teacher")
        ax.set_xscale("log")
        ax.set_title(str(exp))
        ax.set_xlabel("distillation tokens (log scale)")
        ax.set_ylabel(f"{name} (%)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def _aggregate_name(table: pd.DataFrame) -> str:
    if "aggregate_name" in table and table["aggregate_name"].nunique() == 1:
        return str(table["aggregate_name"].iloc[0])
    return "aggregate"


def save(figure, path: Path, dpi: int) -> None:
    """Save atomically: to a temporary name with the same suffix, then rename."""
    with atomic_file(path) as tmp:
        figure.savefig(tmp, dpi=dpi)
