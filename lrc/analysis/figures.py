"""`lrc figure`: the token-efficiency figure (aggregate score against distillation tokens).

Drawn from a results table (``results/table1.csv``, see :mod:`lrc.commands.aggregate`): one panel per
experiment, one line per recipe and arm over the token budgets (log scale), the teacher as a
dashed reference line, the suite's chance level as a floor kept in view, each line's number of seeds
(n) in its label, and seeds' spread as error bars when there are several.
:func:`draw_saturation` draws the saturation claim's figure (`lrc claims saturation
--figure`): slice and the full-reach arm with their 95 % t bands over seeds.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lrc.io.atomic import atomic_file

ARM_STYLE = {
    "slice": ("tab:gray", "o"),
    "dense": ("tab:blue", "s"),
    "core": ("tab:red", "D"),
    "coreortho": ("tab:orange", "P"),
    "confined": ("tab:olive", "v"),
    "randcomp": ("tab:purple", "^"),
}


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
            n = int(line["n_seeds"].min())
            ax.errorbar(
                line["tokens"], line["aggregate"], yerr=spread, color=color, marker=marker,
                linestyle="-" if recipe == "lrc" else "--", capsize=3, label=f"{arm} ({recipe}, n = {n})",
            )
        teacher = rows[rows["arm"] == "teacher"]
        if len(teacher) and not math.isnan(teacher["aggregate"].iloc[0]):
            ax.axhline(teacher["aggregate"].iloc[0], color="black", linestyle=":", label="teacher")
        chance = rows["chance"].dropna() if "chance" in rows else pd.Series(dtype=float)
        if len(chance):  # lines near chance are not trends: show the floor, and keep it in view
            ax.axhline(chance.iloc[0], color="gray", linestyle="-.", label="chance")
            low, high = ax.get_ylim()
            ax.set_ylim(min(low, chance.iloc[0] - 5), max(high, chance.iloc[0] + 5))
        _style_axes(ax, str(exp), f"{name} (%)")
    fig.tight_layout()
    return fig


def draw_saturation(claim: pd.DataFrame):
    """The saturation claim table's ``score`` rows, one panel per experiment: one curve per arm
    over the budgets (log scale) with its 95 % t band over seeds (none for one seed), and the
    teacher's line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    experiments = list(dict.fromkeys(claim["experiment"]))
    fig, axes = plt.subplots(1, len(experiments), figsize=(5.5 * len(experiments), 3.8), squeeze=False)
    for ax, exp in zip(axes[0], experiments):
        rows = claim[claim["experiment"] == exp]
        scores = rows[rows["measure"] == "score"]
        for arm, line in scores.groupby("arm", sort=False):
            line = line.sort_values("tokens")
            color, marker = ARM_STYLE.get(arm, (None, "x"))
            n = int(line["n_seeds"].min())
            ax.plot(line["tokens"], line["miniature"], color=color, marker=marker,
                    label=f"{arm} (mean of {n} seed{'s' * (n > 1)})")
            if line["ci_low"].notna().all():
                ax.fill_between(line["tokens"], line["ci_low"], line["ci_high"], color=color, alpha=0.2,
                                label=f"{arm}: 95 % t interval")
        teacher = rows["teacher"].dropna() if "teacher" in rows else pd.Series(dtype=float)
        if len(teacher):
            ax.axhline(teacher.iloc[0], color="black", linestyle=":", label="teacher")
        _style_axes(ax, f"saturation ({exp})", "aggregate score (%)")
    fig.tight_layout()
    return fig


def _style_axes(ax, title: str, ylabel: str) -> None:
    """Both figures' axes: log-scale tokens, a grid, a small legend."""
    ax.set_xscale("log")
    ax.set_title(title)
    ax.set_xlabel("distillation tokens (log scale)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")


def _aggregate_name(table: pd.DataFrame) -> str:
    if "aggregate_name" in table and table["aggregate_name"].nunique() == 1:
        return str(table["aggregate_name"].iloc[0])
    return "aggregate"


def save(figure, path: Path, dpi: int) -> None:
    """Save atomically: to a temporary name with the same suffix, then rename."""
    with atomic_file(path) as tmp:
        figure.savefig(tmp, dpi=dpi)
