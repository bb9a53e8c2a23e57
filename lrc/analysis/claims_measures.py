"""The claim tables built from the audit's, the probe's and the training's measurements: capacity,
knockout, coordinates.

capacity: the teacher's MLP capacity that a width-r slice leaves stranded (``results/{exp}/probe.csv``,
`lrc probe`): the top-r energy of the MLP inputs, the slice's held-out error on the teacher's own MLP
map, and the share of it a free MLP removes, over layers. One teacher: a size with no interval, the
context the other claims are read in (docs/method.md §10).

knockout: per full-reach arm, the MLP energy outside the teacher's column/row spaces
(``results/{exp}/occupancy/{run}.csv``, energy-weighted over layers and weights), the score
before and after removing it (``{run}.json``, ``{run}.knockout.json``), the drop (paired by
seed) and the knocked-out score against the suite's chance level.

coordinates: per arm and logged step, the share of the update energy ‖W(t) − W(0)‖² inside the
teacher's subspace (``results/{exp}/distill/{run}/update_energy.csv``), energy-weighted over
layers and weights; the paper has no number for it, the tiny world measures it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from lrc.analysis.claims_rows import (
    Paper,
    chance_level,
    experiment_of_input,
    load_records,
    measure_row,
    paired_row,
    paper,
    scores_by_seed,
    student_runs,
    teacher_record,
)
from lrc.analysis.stats import mean, paired_t_pvalue
from lrc.analysis.tables import read_csv_table
from lrc.errors import LRCError
from lrc.names import ARMS, parse_run_name

# The knockout "collapses to chance" when the knocked-out student keeps at most this share of
# its margin above chance (means over seeds).
CHANCE_MARGIN = 0.25
OCCUPANCY_COLUMNS = {"layer", "weight", "energy", "outside"}
PROBE_COLUMNS = {"layer", "energy", "slice_error", "free_error", "stranded"}  # of `lrc probe`'s CSV
UPDATE_COLUMNS = {"step", "tokens", "layer", "weight", "energy", "inside"}


def _run_of(name: str, path: Path) -> dict[str, Any]:
    run = parse_run_name(name)
    if run is None or run["sft"] or run["knockout"]:
        raise LRCError(f"{path}: {name!r} is not a run name ({{recipe}}-{{arm}}-s{{seed}}-t{{tokens}})")
    return run


def _share(frame: pd.DataFrame, part: str) -> float:
    """100 × Σ part / Σ energy: the energy-weighted share over layers and weights."""
    total = float(frame["energy"].sum())
    return 100.0 * float(frame[part].sum()) / total if total > 0 else float("nan")


CAPACITY = Paper(None, "the paper reports no probe; an outside audit of SmolLM2-135M at r = H/2 (docs/method.md "
                        "§10): top-r energy 89.8–95.3 %, slice error 5–15 %, 6–10 % of it stranded", "no-paper")


def capacity(paths: Sequence[Path]) -> pd.DataFrame:
    """One probe CSV: its layers' mean top-r energy and slice error (percent of the MLP output's
    energy), and the share of the mean slice error that the free MLP removes (stranded)."""
    if len(paths) != 1:
        raise LRCError(f"capacity: one probe.csv per experiment, got {len(paths)}: {', '.join(map(str, paths))}")
    frame = read_csv_table(paths[0], "probe table", PROBE_COLUMNS)
    if frame.empty:
        raise LRCError(f"probe table {paths[0]}: no layer rows")
    layers = " ".join(str(int(v)) for v in frame["layer"])
    mean_of = {c: 100.0 * float(frame[c].mean()) for c in ("energy", "slice_error", "free_error")}
    removed = mean_of["slice_error"] - mean_of["free_error"]
    measures = [
        ("energy", "top-r energy of the teacher's MLP inputs (%)", mean_of["energy"]),
        ("slice_error", "the slice's held-out error on the teacher's MLP map (%)", mean_of["slice_error"]),
        ("stranded", "stranded: the share of that error a free MLP removes (%)",
         100.0 * removed / mean_of["slice_error"] if mean_of["slice_error"] > 0 else math.nan),
    ]
    return pd.DataFrame([
        measure_row("capacity", f"{text}, over layers {layers} (per layer: {_percents(frame[column])})",
                    {0: value}, ref=CAPACITY, headline=True, experiment=experiment_of_input(paths[0]),
                    measure=column, layers=layers)
        for column, text, value in measures])


def _percents(values: pd.Series) -> str:
    return " / ".join(f"{100.0 * float(v):.3g}" for v in values)


def knockout(paths: Sequence[Path]) -> pd.DataFrame:
    paths = [Path(p) for p in paths]
    if not any(p.suffix == ".json" for p in paths):
        raise LRCError("knockout: no evaluation JSON among --inputs (the runs', their .knockout's and teacher.json)")
    records = load_records([p for p in paths if p.suffix == ".json"])
    occupancy = {}
    for path in (p for p in paths if p.suffix == ".csv"):
        run = _run_of(path.stem, path)
        occupancy[(run["recipe"], run["arm"], run["tokens"], run["seed"])] = _share(
            read_csv_table(path, "occupancy CSV", OCCUPANCY_COLUMNS), "outside")
    reference = teacher_record(records, required=False) or records[0]
    chance, exp = chance_level(reference), records[0]["experiment"]
    groups = sorted({(r["recipe"], r["arm"], r["tokens"]) for r in student_runs(records) if r.get("knockout")},
                    key=lambda g: (g[0], ARMS.index(g[1]), g[2]))
    if not groups:
        raise LRCError("knockout: no {run}.knockout.json among the inputs")
    rows = []
    for recipe, arm, tokens in groups:
        name, common = f"{recipe}-{arm}-t{tokens}", dict(experiment=exp, recipe=recipe, tokens=tokens, arm=arm)
        after = scores_by_seed(records, recipe=recipe, arm=arm, tokens=tokens, knockout=True)
        before = scores_by_seed(records, recipe=recipe, arm=arm, tokens=tokens)
        if not before:
            raise LRCError(f"knockout: {name}.knockout has no evaluation before the knockout "
                           f"({recipe}-{arm}-s<seed>-t{tokens}.json)")
        outside = {seed: v for (r, a, t, seed), v in occupancy.items() if (r, a, t) == (recipe, arm, tokens)}
        if not outside:
            raise LRCError(f"knockout: no occupancy CSV of {name} among the inputs "
                           f"(results/{{exp}}/occupancy/{recipe}-{arm}-s<seed>-t{tokens}.csv)")
        missing = sorted(set(after) - set(outside))
        if missing:
            raise LRCError(f"knockout: {name}: seed(s) {', '.join(map(str, missing))} knocked out but "
                           "without an occupancy CSV")
        rows.append(measure_row("knockout", f"{arm}: MLP energy outside the teacher's spaces (%)", outside,
                                ref=paper("knockout", "outside"), headline=True, **common))
        rows.append(paired_row("knockout", f"{arm}: score drop from the knockout (before − after)", before, after,
                               a_name=name, b_name=f"{name}.knockout", chance=chance, **common))
        rows.append(_chance_row(after, before, chance, common))
    return pd.DataFrame(rows)


def _chance_row(after: dict[int, float], before: dict[int, float], chance: float,
                common: dict[str, Any]) -> dict[str, Any]:
    """The knocked-out score above chance (its interval over seeds) and the paper's rule."""
    ref: Paper = paper("knockout", "chance")
    above = {s: v - chance for s, v in after.items()}
    mean_after = mean(after.values())
    mean_before = mean(before[s] for s in after if s in before)
    holds = (None if math.isnan(chance) or math.isnan(mean_after) or math.isnan(mean_before)
             else bool(mean_after - chance <= CHANCE_MARGIN * (mean_before - chance)))
    return measure_row(
        "knockout", f"{common['arm']}: score after the knockout − chance", above, ref=ref, headline=True,
        p_value=paired_t_pvalue(above.values()),
        direction=(f"removal collapses to chance: the knocked-out student keeps at most {100 * CHANCE_MARGIN:.0f} % "
                   "of its margin above chance (means); "
                   "an interval that excludes 0 says it is measurably above chance"),
        direction_holds=holds, score_before=mean_before, score_after=mean_after, chance=chance, **common,
    )


def coordinates(paths: Sequence[Path]) -> pd.DataFrame:
    per_run = []
    for path in map(Path, paths):
        run = _run_of(path.parent.name, path)
        frame = read_csv_table(path, "update-energy CSV", UPDATE_COLUMNS)
        for step, at in frame.groupby("step"):
            per_run.append({**run, "step": int(step), "seen": float(at["tokens"].iloc[0]),
                            "share": _share(at, "inside"), "exp": experiment_of_input(path)})
    if not per_run:
        raise LRCError("coordinates: the update-energy CSVs hold no step")
    data = pd.DataFrame(per_run)
    rows, final = [], {}
    note = "no paper number: the tiny world's measurement of where AdamW's updates go"
    for (recipe, arm, tokens), group in sorted(data.groupby(["recipe", "arm", "tokens"]),
                                               key=lambda g: (g[0][0], ARMS.index(g[0][1]), g[0][2])):
        seeds = sorted(group["seed"].unique())
        # the last step every seed logged (a run cut short does not hide behind the others)
        last = min(int(g["step"].max()) for _, g in group.groupby("seed"))
        for step, at in group.groupby("step"):
            values = dict(zip(at["seed"].astype(int), at["share"]))
            rows.append(measure_row("coordinates",
                                    f"{arm}: update energy inside the teacher's subspace (%) at step {step}", values,
                                    direction=note, experiment=group["exp"].iloc[0], recipe=recipe, tokens=tokens,
                                    arm=arm, step=int(step), tokens_seen=float(at["seen"].mean()), final=False))
        at = group[group["step"] == last]
        final[(recipe, arm, tokens)] = dict(zip(at["seed"].astype(int), at["share"]))
        rows.append(measure_row("coordinates",
                                f"{arm}: update energy inside the teacher's subspace (%) at the end (step {last})",
                                final[(recipe, arm, tokens)], headline=True, direction=note,
                                experiment=group["exp"].iloc[0], recipe=recipe, tokens=tokens, arm=arm, step=last,
                                tokens_seen=float(at["seen"].mean()), final=True))
        if len(seeds) != len(final[(recipe, arm, tokens)]):
            raise LRCError(f"coordinates: {recipe}-{arm}-t{tokens}: not every seed logged step {last}")
    rows += _arm_differences(final, data["exp"].iloc[0])
    return pd.DataFrame(rows)


def _arm_differences(final: dict[tuple, dict[int, float]], experiment: str) -> list[dict[str, Any]]:
    """dense − core (and any other pair present) of the final share, paired by seed."""
    rows = []
    for (recipe, a, tokens), va in final.items():
        for (recipe_b, b, tokens_b), vb in final.items():
            if (recipe_b, tokens_b) == (recipe, tokens) and (a, b) in (("dense", "core"), ("dense", "randcomp"),
                                                                       ("core", "randcomp")):
                rows.append(paired_row("coordinates", f"{a} − {b}: final share inside the teacher's subspace (points)",
                                       va, vb, a_name=f"{recipe}-{a}-t{tokens}", b_name=f"{recipe}-{b}-t{tokens}",
                                       recipe=recipe, tokens=tokens, direction="the paper has no number for it",
                                       experiment=experiment, final=True))
    return rows
