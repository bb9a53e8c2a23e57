"""`lrc aggregate`: the results tables, built from evaluation JSONs (or audit CSVs).

Each evaluation JSON is named after the model it scores (see docs/architecture.md):
``results/{exp}/eval/teacher.json``, ``.../{recipe}-{arm}-s{seed}-t{tokens}.json`` for a
distilled student, ``....sft.json`` for its fine-tuned version. A table has one row per
experiment, recipe, arm and token budget (seeds averaged, their spread given) and the
teacher's row for reference. Scores are in percent; ``gain_over_slice`` is the row's
aggregate minus that of plain LRC (arm ``slice``) with the same experiment, recipe and budget;
``vs_teacher`` is the row's aggregate minus the teacher's. Uncertainty over seeds
(:mod:`lrc.analysis.stats`, Student's t, 95 %): ``aggregate_ci_low``/``_high`` and the per-seed
aggregates (``aggregate_per_seed``, in seed order); ``gain_ci_low``/``_high`` and
``gain_p_value`` (two-sided paired t-test) for the gain over slice, paired by seed where the
row and its slice hold the same seeds (blank otherwise, and blank for one seed). The held-out measures get gains
over slice too, in nats per token, positive where the row is better than slice:
``perplexity_gain_over_slice`` = ln(slice perplexity / row perplexity) (the held-out NLL
reduction) and ``kl_gain_over_slice`` = slice KL - row KL. So an evaluation without tasks
(``lrc evaluate --suite none``: no aggregate) still gives a table with gains. Every row
states the evaluation settings (lm-eval version, few-shot count, batch size, limit) and the
suite, and each task column names its metric, so a table cannot be read without them.

Other file names than the workflow's are accepted: a stem that is an arm name (``dense.json``,
as from a hand-run ``lrc evaluate``) is that arm with no recipe, seed or budget (its slice is
``slice.json`` of the same experiment); any other stem is a row of its own, named by it (and
compared with that ``slice.json`` too).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from lrc.analysis.stats import (
    mean,
    paired_differences,
    paired_t_pvalue,
    per_seed_text,
    sample_sd,
    t_interval,
)
from lrc.errors import LRCError
from lrc.io.atomic import atomic_file
from lrc.names import ARMS, RECIPES, RUN_FORMAT, SFT_SUFFIX, parse_run_name

ARM_ORDER = ("teacher", *ARMS)
SETTINGS = ("lm_eval_version", "num_fewshot", "batch_size", "limit")
EXTRAS = ("perplexity", "kl_to_teacher", "answer_logprob")


# ----------------------------------------------------------------------------- reading


def experiment_of(path: Path) -> str:
    """results/{exp}/eval/x.json -> exp (and results/{exp}/audit.csv -> exp)."""
    parent = path.parent
    return parent.parent.name if parent.name == "eval" else parent.name


def describe_model(name: str) -> dict[str, Any]:
    """Split an evaluation file's stem into recipe, arm, seed, tokens and sft: 'teacher',
    a run name (lrc.names.RUN_FORMAT, maybe + SFT_SUFFIX), an arm name (maybe + SFT_SUFFIX), or
    any other name (a row of its own)."""
    if name == "teacher":
        return {"recipe": "", "arm": "teacher", "seed": None, "tokens": None, "sft": False, "knockout": False}
    parsed = parse_run_name(name)
    if parsed is not None:
        return parsed
    # A name that starts like a run name but does not parse is a typo, not a model of its own.
    if not name or name.startswith(".") or any(name.startswith(f"{recipe}-") for recipe in RECIPES):
        raise LRCError(f"evaluation file name {name!r}: expected 'teacher', "
                       f"'{RUN_FORMAT}[{SFT_SUFFIX}]' or a model name")
    sft = name.endswith(SFT_SUFFIX)
    return {"recipe": "", "arm": name.removesuffix(SFT_SUFFIX) if sft else name, "seed": None, "tokens": None,
            "sft": sft, "knockout": False}


def load_evaluations(paths: Sequence[Path]) -> list[dict[str, Any]]:
    records = []
    for path in paths:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise LRCError(f"cannot read evaluation file {path}: {err}") from err
        for key in ("tasks", "aggregate", "lm_eval"):
            if not isinstance(data.get(key), dict):
                raise LRCError(f"evaluation file {path}: missing or malformed {key!r}")
        name = path.name.removesuffix(".json")
        records.append({"experiment": experiment_of(path), "file": str(path), **describe_model(name), "data": data})
    return records


# ----------------------------------------------------------------------------- tables


def _task_columns(records: list[dict[str, Any]]) -> dict[str, str]:
    """task -> column header 'task (metric)'; one metric per task across the table."""
    metrics: dict[str, str] = {}
    for rec in records:
        for task, entry in rec["data"]["tasks"].items():
            metric = entry.get("metric", "")
            if metrics.setdefault(task, metric) != metric:
                raise LRCError(f"task {task!r} is scored with {metrics[task]!r} in one file and "
                               f"{metric!r} in {rec['file']}")
    return {task: f"{task} ({metric})" for task, metric in metrics.items()}


def _chance(record: dict[str, Any]) -> float:
    """The suite's chance score in percent (the mean of its tasks'), NaN where a task does not know it."""
    chances = [t.get("chance") for t in record["data"]["tasks"].values()]
    return float("nan") if not chances or None in chances else 100.0 * sum(chances) / len(chances)


def _percent(value: Any) -> float:
    return float("nan") if value is None else 100.0 * float(value)


def _one_or_all(values: list[Any]) -> Any:
    """A setting shared by every seed, or all of them joined (so a mismatch is visible)."""
    distinct = list(dict.fromkeys("" if v is None else v for v in values))
    return distinct[0] if len(distinct) == 1 else " | ".join(map(str, distinct))


def results_table(records: list[dict[str, Any]], *, sft: bool) -> pd.DataFrame:
    """Rows: the teacher and each (experiment, recipe, arm, tokens), seeds averaged."""
    # Knocked-out students (`lrc claims knockout`) are no row of these tables.
    chosen = [r for r in records if not r.get("knockout") and (r["arm"] == "teacher" or r["sft"] == sft)]
    if not any(r["arm"] != "teacher" for r in chosen):
        raise LRCError(f"no {'SFT' if sft else 'distilled'} student among the {len(records)} evaluation files")
    tasks = _task_columns(chosen)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for rec in chosen:
        key = (rec["experiment"], rec["recipe"], rec["arm"], rec["tokens"])
        groups.setdefault(key, []).append(rec)

    rows = []
    for (exp, recipe, arm, tokens), group in groups.items():
        seeds = sorted(r["seed"] for r in group if r["seed"] is not None)
        if len(set(seeds)) != len(seeds):
            raise LRCError(f"{exp} {recipe}-{arm} t{tokens}: seed listed twice among {[r['file'] for r in group]}")
        aggs = [_percent(r["data"]["aggregate"].get("value")) for r in group]
        row: dict[str, Any] = {
            "experiment": exp,
            "model": _model_name(recipe, arm, tokens, sft),
            "recipe": recipe,
            "arm": arm,
            "tokens": tokens,
            "seeds": " ".join(map(str, seeds)),
            "n_seeds": len(group),
        }
        for task, column in tasks.items():
            values = [_percent(r["data"]["tasks"].get(task, {}).get("value")) for r in group]
            row[column] = mean(values)
        row["aggregate"] = mean(aggs)
        row["aggregate_sd"] = sample_sd(aggs)
        row.update(_seed_columns(group, aggs))
        for extra in EXTRAS:
            row[extra] = mean([_float(r["data"].get("extra", {}).get(extra)) for r in group])
        row["aggregate_name"] = _one_or_all([r["data"]["aggregate"].get("name") for r in group])
        row["suite"] = _one_or_all([r["data"].get("suite") for r in group])
        lm = [r["data"]["lm_eval"] for r in group]
        row["lm_eval_version"] = _one_or_all([e.get("version") for e in lm])
        for key in SETTINGS[1:]:
            row[key] = _one_or_all([e.get(key) for e in lm])
        row["chance"] = mean([_chance(r) for r in group])
        rows.append(row)

    frame = pd.DataFrame(rows)
    frame.insert(frame.columns.get_loc("aggregate_per_seed") + 1, "gain_over_slice",
                 [_gain(frame, i) for i in frame.index])
    gain_cis = pd.DataFrame([_paired_gain(frame, i) for i in frame.index],
                            columns=["gain_ci_low", "gain_ci_high", "gain_p_value"])
    for offset, column in enumerate(gain_cis.columns, start=1):
        frame.insert(frame.columns.get_loc("gain_over_slice") + offset, column, gain_cis[column].to_numpy())
    frame.insert(frame.columns.get_loc("gain_p_value") + 1, "vs_teacher", [_vs_teacher(frame, i) for i in frame.index])
    at = frame.columns.get_loc("answer_logprob") + 1
    frame.insert(at, "perplexity_gain_over_slice", [_gain(frame, i, "perplexity", _nll_gain) for i in frame.index])
    frame.insert(at + 1, "kl_gain_over_slice",
                 [_gain(frame, i, "kl_to_teacher", lambda row, base: base - row) for i in frame.index])
    frame["_arm"] = frame["arm"].map(lambda a: ARM_ORDER.index(a) if a in ARM_ORDER else len(ARM_ORDER))
    frame["_tokens"] = frame["tokens"].fillna(-1)
    frame = (frame.sort_values(["experiment", "_arm", "recipe", "_tokens"], kind="stable")
             .drop(columns=["_arm", "_tokens", "_per_seed"]))
    frame["tokens"] = frame["tokens"].astype("Int64")
    return frame.reset_index(drop=True)


def _model_name(recipe: str, arm: str, tokens: int | None, sft: bool) -> str:
    if arm == "teacher":
        return "teacher"
    name = f"{recipe}-{arm}-t{tokens}" if tokens is not None else arm  # a hand-named file: its own name
    return name + (SFT_SUFFIX if sft else "")


def _nll_gain(row: float, base: float) -> float:
    """ln(base / row) of two perplexities: the reduction of held-out NLL in nats per token."""
    return math.log(base / row) if row > 0 and base > 0 else float("nan")


def _gain(frame: pd.DataFrame, i: int, column: str = "aggregate", gain=lambda row, base: row - base) -> float:
    """``gain(row value, slice value)`` against the slice row of the same experiment, recipe and budget."""
    row = frame.loc[i]
    if row["arm"] == "teacher":
        return float("nan")
    base = _slice_of(frame, row)
    if base is None or pd.isna(row[column]) or pd.isna(base[column]):
        return float("nan")
    return float(gain(float(row[column]), float(base[column])))


def _slice_of(frame: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """The slice row of the same experiment, recipe and budget, or None."""
    same_tokens = frame["tokens"].isna() if pd.isna(row["tokens"]) else frame["tokens"] == row["tokens"]
    base = frame[(frame["experiment"] == row["experiment"]) & (frame["recipe"] == row["recipe"]) & same_tokens
                 & (frame["arm"] == "slice")]
    return base.iloc[0] if len(base) else None


def _seed_columns(group: list[dict[str, Any]], aggs: list[float]) -> dict[str, Any]:
    """The aggregate's t interval over seeds, its per-seed values, and (hidden) seed -> value."""
    interval = t_interval(aggs)
    # A hand-named file has no seed: its position stands in (it has no partner to pair with).
    per_seed = {r["seed"] if r["seed"] is not None else -1 - k: a for k, (r, a) in enumerate(zip(group, aggs))}
    return {"aggregate_ci_low": interval.low, "aggregate_ci_high": interval.high,
            "aggregate_per_seed": per_seed_text(per_seed), "_per_seed": per_seed}


def _paired_gain(frame: pd.DataFrame, i: int) -> tuple[float, float, float]:
    """(ci_low, ci_high, p) of the row's aggregate minus its slice's, paired by seed; NaN when
    the seeds differ (no pairing) or one seed is all there is."""
    nan = (float("nan"),) * 3
    row = frame.loc[i]
    if row["arm"] in ("teacher", "slice"):
        return nan
    base, mine = _slice_of(frame, row), row["_per_seed"]
    if base is None or set(mine) != set(base["_per_seed"]) or min(mine) < 0:
        return nan
    diffs = paired_differences(mine, base["_per_seed"])
    interval = t_interval(diffs.values())
    return interval.low, interval.high, paired_t_pvalue(diffs.values())


def _vs_teacher(frame: pd.DataFrame, i: int) -> float:
    row = frame.loc[i]
    teacher = frame[(frame["experiment"] == row["experiment"]) & (frame["arm"] == "teacher")]
    if row["arm"] == "teacher" or not len(teacher):
        return float("nan")
    return float(row["aggregate"] - teacher["aggregate"].iloc[0])


def _float(value: Any) -> float:
    return float("nan") if value is None else float(value)


def read_csv_table(path: Path, what: str, needed: Sequence[str] = (), hint: str = "") -> pd.DataFrame:
    """A CSV as a frame, with an error naming ``what``, the file and any missing column."""
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise LRCError(f"cannot read {what} {path}: {err}") from err
    missing = set(needed) - set(frame.columns)
    if missing:
        raise LRCError(f"{what} {path}: missing column(s) {', '.join(sorted(missing))}{hint}")
    return frame


def audit_table(paths: Sequence[Path]) -> pd.DataFrame:
    frames = []
    for path in paths:
        path = Path(path)
        frame = read_csv_table(path, "audit CSV")
        if "experiment" not in frame.columns:
            frame.insert(0, "experiment", experiment_of(path))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def write_csv(frame: pd.DataFrame, out: Path) -> Path:
    """Write atomically (temporary name, then rename), numbers rounded to 4 decimals."""
    with atomic_file(out) as tmp:
        frame.round(4).to_csv(tmp, index=False)
    return Path(out)
