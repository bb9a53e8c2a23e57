"""`lrc claims summary`: results/claims.csv (one row per headline comparison) and claims.md.

The claim CSVs (``results/claims/{claim}.csv``) already hold everything; the summary keeps the
rows marked ``headline``, names the Snakemake rule (``claim_<CLAIM>``) and the table each came
from, and corrects the sign rows' verdicts for testing them together: Holm over the headline
rows with the sign rule (``p_holm``); ``holds`` is the row's verdict where its Holm-adjusted p is
below 5 %, inconclusive (blank) where it is not, and the row's own verdict for the other rules.
The markdown is the readable page: the table, how to read "direction" on each row,
the interval's method, the number of seeds and what the seed varies, and the time it took.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from lrc.analysis.stats import CI_METHOD, MAX_SEEDS, holm
from lrc.analysis.tables import read_csv_table
from lrc.errors import LRCError
from lrc.io.atomic import atomic_file

SUMMARY_COLUMNS = ("claim", "comparison", "paper", "miniature", "ci_low", "ci_high", "n_seeds", "seeds_for_paper_gap",
                   "p_value",
                   "p_holm", "verdict_rule", "direction_holds", "holds", "ci_excludes_zero", "rule", "table")
NEEDED = {"claim", "comparison", "paper", "miniature", "ci_low", "ci_high", "n_seeds", "seeds_for_paper_gap",
          "p_value", "verdict_rule",
          "direction_holds", "ci_excludes_zero", "headline"}
ALPHA = 0.05


def read_claim_tables(paths: Sequence[Path]) -> pd.DataFrame:
    """The headline rows of every claim CSV, with ``rule`` and ``table`` added."""
    frames = []
    for path in paths:
        path = Path(path)
        frame = read_csv_table(path, "claim table", NEEDED, hint=" (written by `lrc claims CLAIM`?)")
        frame = frame[frame["headline"].astype(str) == "True"].copy()
        frame["rule"] = "claim_" + frame["claim"].astype(str)
        frame["table"] = str(path)
        frames.append(frame)
    rows = pd.concat(frames, ignore_index=True)
    if not len(rows):
        raise LRCError("--inputs: no headline row in the claim tables given")
    if "experiment" in rows and rows["experiment"].nunique() > 1:  # claims.csv has no experiment column
        rows["comparison"] = rows["experiment"].astype(str) + ": " + rows["comparison"].astype(str)
    return rows


def summary(paths: Sequence[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(claims.csv's frame, the full headline rows for the markdown)."""
    rows = with_holm(read_claim_tables(paths))
    return rows[list(SUMMARY_COLUMNS)].copy(), rows


def with_holm(rows: pd.DataFrame) -> pd.DataFrame:
    """``p_holm`` over the sign rows (the family of directional tests) and the corrected verdict ``holds``."""
    rows = rows.copy()
    sign = (rows["verdict_rule"] == "sign").to_numpy()
    p = pd.to_numeric(rows["p_value"], errors="coerce").to_numpy()
    rows["p_holm"] = float("nan")
    rows.loc[sign, "p_holm"] = holm(p[sign])
    own = [None if _missing(v) else str(v) == "True" for v in rows["direction_holds"]]
    rows["holds"] = [verdict if not is_sign or verdict is None else (verdict if p_adj < ALPHA else None)
                     for verdict, is_sign, p_adj in zip(own, sign, rows["p_holm"])]
    return rows


def read_seconds(path: Path) -> float:
    try:
        return float(Path(path).read_text().split()[0])
    except (OSError, IndexError, ValueError) as err:
        raise LRCError(f"--time-file {path}: expected a number of seconds ({err})") from err


def markdown(rows: pd.DataFrame, *, seconds: float | None = None) -> str:
    seeds = sorted({int(n) for n in rows["n_seeds"] if not pd.isna(n)})
    lines = [
        "# The paper's claims in miniature",
        "",
        f"{len(rows)} comparisons from {rows['table'].nunique()} claim tables (`lrc claims`); "
        f"seeds per comparison: {', '.join(map(str, seeds))}."
        + (f" Time taken: {seconds / 60:.1f} min ({seconds:.0f} s)." if seconds is not None else ""),
        "",
        "| # | claim | comparison | paper | miniature [95 % CI] | seeds | seeds for the paper's gap | p (t-test) "
        "| p (Holm) | holds | rule |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows.to_dict("records"), start=1):
        lines.append(
            f"| {i} | {r['claim']} | {r['comparison']} | {_number(r['paper'])} | {_number(r['miniature'])} "
            f"{_interval(r)} | {_count(r['n_seeds'])} | {_count(r['seeds_for_paper_gap'])} | {_p(r['p_value'])} "
            f"| {_p(r['p_holm'])} | {_yes_no(r['holds'])} | `{r['rule']}` |"
        )
    lines += ["", "## How to read it", "",
              f"- Interval: {CI_METHOD} (blank for one seed). Scores are the suite's aggregate in percent; gains are "
              "paired by seed (same seed = same data order and warm start); p is the two-sided t-test of the "
              "per-seed differences (paired by seed; against the teacher's or chance's fixed score where a row "
              "compares with one).",
              "- Holds: yes only where the interval lies on the paper's side of 0 (a sign) or within the "
              "equivalence margin (a null), no where it lies on the other side (or, for a null, excludes 0), "
              f"— (inconclusive) otherwise; the sign rows' verdicts stand only where Holm's adjusted p over the "
              f"{int((rows['verdict_rule'] == 'sign').sum())} sign rows is below {ALPHA:g}. The rules: "
              "[docs/method.md §9](../docs/method.md).",
              "- The seed varies the data order, anything random in the arm and, with `claims.vary_warmstart` "
              "(the default), the warm start; it does not vary the teacher: see "
              "[docs/method.md §7, what a seed varies](../docs/method.md) and the README.",
              "- Seeds for the paper's gap: the fewest seeds at which a paired t-test (5 %, two-sided) would detect a "
              "true difference of the paper's size with 80 % power, given the row's measured spread over seeds "
              "(noncentral t; blank without a paper number or a spread).",
              "- Rows named \"KL to the teacher\" give the percent of the slice's held-out KL to the teacher that "
              "the arm removes (paired by seed; the paper has none, its accuracy gain predicts the sign).",
              "- Rows \"seeds pooled\" compare the same students item by item (per task, paired t over every "
              "item of every seed) and held-out row by row (paired bootstrap over rows): the precision of the "
              "evaluation given these students, not the seeds' spread; they give no verdict.",
              "- Paper numbers: docs/method.md §4; each claim table's `paper_setting` names the paper's setting.",
              "", "What \"direction\" means on each row, the paper's setting, and the table:", ""]
    lines += [_note(i, r) for i, r in enumerate(rows.to_dict("records"), start=1)]
    return "\n".join(lines) + "\n"


def _note(i: int, row: dict[str, Any]) -> str:
    setting = "" if _missing(row.get("paper")) else f" Paper: {row.get('paper_setting', '')}."
    return f"{i}. {row.get('direction', '')}.{setting} Table: `{row['table']}`."


def write_markdown(text: str, out: Path) -> None:
    with atomic_file(out) as tmp:
        Path(tmp).write_text(text)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def _number(value: Any) -> str:
    return "—" if _missing(value) else f"{float(value):+.2f}"


def _interval(row: dict[str, Any]) -> str:
    if _missing(row["ci_low"]) or _missing(row["ci_high"]):
        return ""
    return f"[{float(row['ci_low']):+.2f}, {float(row['ci_high']):+.2f}]"


def _count(value: Any) -> str:
    if _missing(value):
        return "—"
    return f"> {MAX_SEEDS:,}" if math.isinf(float(value)) else str(int(value))


def _p(value: Any) -> str:
    return "—" if _missing(value) else f"{float(value):.3g}"


def _yes_no(value: Any) -> str:
    if _missing(value):
        return "—"
    return "yes" if str(value) == "True" else "no"
