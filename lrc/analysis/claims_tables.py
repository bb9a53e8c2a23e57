"""The claim tables built from evaluation scores: table1, controls, cross_recipe, saturation, sft.

Every gain is paired by seed (same seed = same data order and warm start): the row's per-seed
values are the seed's differences and its interval is that of their mean. Scores are the suite's aggregate in
percent (points).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from lrc.analysis.claims_items import item_rows
from lrc.analysis.claims_rows import (
    PLATEAU,
    load_records,
    measure_row,
    paired_row,
    kl_to_teacher,
    paper,
    reduction_row,
    score,
    scores_by_seed,
    student_runs,
    teacher_record,
)
from lrc.analysis.stats import mean, paired_differences, paired_t_pvalue
from lrc.errors import LRCError
from lrc.names import ARMS, MAIN_ARMS

MIN_BUDGETS = 4


def _budgets(records, recipe: str) -> list[int]:
    return sorted({r["tokens"] for r in student_runs(records)
                   if r["recipe"] == recipe and not r["sft"] and not r.get("knockout")})


def _recipes(records) -> list[str]:
    return list(dict.fromkeys(r["recipe"] for r in student_runs(records)))


def _arms(records, recipe: str, tokens: int, *, sft: bool = False) -> list[str]:
    present = {r["arm"] for r in student_runs(records)
               if (r["recipe"], r["tokens"], r["sft"]) == (recipe, tokens, sft) and not r.get("knockout")}
    return [a for a in ARMS if a in present]


def _slice_scores(records, recipe: str, tokens: int, partner: str) -> dict[int, float]:
    base = scores_by_seed(records, recipe=recipe, arm="slice", tokens=tokens)
    if not base:
        raise LRCError(f"{recipe}-{partner} t{tokens}: no slice partner among the inputs (expected "
                       f"{recipe}-slice-s<seed>-t{tokens}.json)")
    return base


def _beside_slice(records, arms: Sequence[str]):
    """(recipe, tokens, arm) of every student of ``arms`` (slice excepted), in table order."""
    for recipe in _recipes(records):
        for tokens in _budgets(records, recipe):
            for arm in [a for a in _arms(records, recipe, tokens) if a in arms and a != "slice"]:
                yield recipe, tokens, arm


def _gains_over_slice(records, claim: str, arms: Sequence[str], headline: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    exp = records[0]["experiment"]
    for recipe, tokens, arm in _beside_slice(records, arms):
        base = _slice_scores(records, recipe, tokens, arm)
        mine = scores_by_seed(records, recipe=recipe, arm=arm, tokens=tokens)
        rows.append(paired_row(claim, f"{arm} − slice", mine, base, a_name=f"{recipe}-{arm}-t{tokens}",
                               b_name=f"{recipe}-slice-t{tokens}", ref=paper(claim, arm),
                               headline=arm in headline, experiment=exp, recipe=recipe, tokens=tokens))
    if not rows:
        raise LRCError(f"{claim}: no student of the arms {', '.join(a for a in arms if a != 'slice')} beside a "
                       "slice among the inputs")
    return rows


def _kl_removed(records, claim: str, arms: Sequence[str]) -> list[dict[str, Any]]:
    """The continuous measure beside each gain: 100·(KL_slice − KL_arm)/KL_slice, the share of the slice's
    KL to the teacher on the held-out split that the arm removes, paired by seed; no row where an
    evaluation has no KL."""
    rows = []
    for recipe, tokens, arm in _beside_slice(records, arms):
        kl = {a: scores_by_seed(records, recipe=recipe, arm=a, tokens=tokens, measure=kl_to_teacher)
              for a in (arm, "slice")}
        if any(math.isnan(v) or v <= 0 for v in kl["slice"].values()) or any(map(math.isnan, kl[arm].values())):
            continue
        rows.append(reduction_row(claim, f"{arm} − slice, KL to the teacher (% of slice's removed)", kl[arm],
                                  kl["slice"], a_name=f"{recipe}-{arm}-t{tokens}", b_name=f"{recipe}-slice-t{tokens}",
                                  ref=paper(claim, "kl"), headline=True, experiment=records[0]["experiment"],
                                  recipe=recipe, tokens=tokens))
    return rows


def table1(paths: Sequence[Path]) -> pd.DataFrame:
    """Gain of each full-reach arm (dense, core) over the matched slice, paired by seed; where the
    evaluations measured it, the share of the slice's KL to the teacher each removes; and the same
    differences item by item and row by row, the seeds pooled (:mod:`lrc.analysis.claims_items`)."""
    records = load_records(paths)
    rows = _gains_over_slice(records, "table1", MAIN_ARMS, headline=("dense", "core"))
    items = item_rows(records, "table1", list(_beside_slice(records, MAIN_ARMS)))
    return pd.DataFrame(rows + _kl_removed(records, "table1", MAIN_ARMS) + items)


def controls(paths: Sequence[Path]) -> pd.DataFrame:
    """Every arm minus slice; and core − dense, randcomp − core (the basis controls), coreortho − core
    (CORE's two readings: orthonormal coordinates against the complement path)."""
    records = load_records(paths)
    rows = _gains_over_slice(records, "controls", ARMS, headline=("confined",))
    exp = records[0]["experiment"]
    for recipe in _recipes(records):
        for tokens in _budgets(records, recipe):
            present = _arms(records, recipe, tokens)
            for a, b in (("core", "dense"), ("randcomp", "core"), ("coreortho", "core")):
                if a in present and b in present:
                    get = lambda arm: scores_by_seed(records, recipe=recipe, arm=arm, tokens=tokens)  # noqa: E731
                    rows.append(paired_row("controls", f"{a} − {b}", get(a), get(b), a_name=f"{recipe}-{a}-t{tokens}",
                                           b_name=f"{recipe}-{b}-t{tokens}", ref=paper("controls", f"{a}-{b}"),
                                           headline=True, experiment=exp, recipe=recipe, tokens=tokens))
    return pd.DataFrame(rows)


def full_arm(records) -> str:
    """The one arm other than slice among the students (the 2×2's and the ladder's full reach)."""
    arms = sorted({r["arm"] for r in student_runs(records)} - {"slice"})
    if len(arms) != 1:
        raise LRCError("--inputs: expected slice and exactly one full-reach arm, found "
                       f"{', '.join(arms) or 'none'} besides slice")
    return arms[0]


def cross_recipe(paths: Sequence[Path]) -> pd.DataFrame:
    """slice → FULL under each recipe, and the difference of the two gains (kl − lrc), paired."""
    records = load_records(paths)
    full, exp = full_arm(records), records[0]["experiment"]
    missing = {"lrc", "kl"} - set(_recipes(records))
    if missing:
        raise LRCError(f"cross_recipe: no student of the recipe(s) {', '.join(sorted(missing))} among the inputs")
    rows = []
    for tokens in sorted(set(_budgets(records, "lrc")) & set(_budgets(records, "kl"))):
        gains = {}
        for recipe in ("lrc", "kl"):
            base = _slice_scores(records, recipe, tokens, full)
            mine = scores_by_seed(records, recipe=recipe, arm=full, tokens=tokens)
            gains[recipe] = paired_differences(mine, base, a_name=f"{recipe}-{full}-t{tokens}",
                                               b_name=f"{recipe}-slice-t{tokens}")
            rows.append(paired_row("cross_recipe", f"{recipe}: {full} − slice", mine, base,
                                   a_name=f"{recipe}-{full}-t{tokens}", b_name=f"{recipe}-slice-t{tokens}",
                                   ref=paper("cross_recipe", recipe), headline=True, experiment=exp, recipe=recipe,
                                   tokens=tokens))
        rows.append(paired_row("cross_recipe", f"(kl gain) − (lrc gain), {full} − slice", gains["kl"], gains["lrc"],
                               a_name=f"kl gain t{tokens}", b_name=f"lrc gain t{tokens}",
                               ref=paper("cross_recipe", "kl-lrc"), headline=True, experiment=exp, recipe="kl − lrc",
                               tokens=tokens))
    if not rows:
        raise LRCError("cross_recipe: no token budget shared by the lrc and kl students")
    return pd.DataFrame(rows)


def area_under_curve(by_budget: dict[int, dict[int, float]]) -> dict[int, float]:
    """seed -> the mean score over the ladder, trapezoids in log tokens (a learning-speed reading),
    for the seeds scored at every budget."""
    budgets = sorted(by_budget)
    seeds = set.intersection(*(set(by_budget[t]) for t in budgets))
    logs = [math.log(t) for t in budgets]
    width = logs[-1] - logs[0]
    return {s: sum((by_budget[a][s] + by_budget[b][s]) / 2 * (lb - la)
                   for a, b, la, lb in zip(budgets, budgets[1:], logs, logs[1:])) / width for s in sorted(seeds)}


def saturation(paths: Sequence[Path]) -> pd.DataFrame:
    """Per budget: each arm's mean and interval and the paired gap; the gap at the largest budget; each
    arm's plateau evidence (the last step of its ladder, an equivalence row); learning speed (the gap in
    the area under the curves)."""
    records = load_records(paths)
    full, exp = full_arm(records), records[0]["experiment"]
    teacher = teacher_record(records)
    (recipe, *others) = _recipes(records)
    if others:
        raise LRCError(f"saturation: students of several recipes ({recipe}, {', '.join(others)}); "
                       "give one recipe's ladder")
    budgets = _budgets(records, recipe)
    if len(budgets) < MIN_BUDGETS:
        raise LRCError(f"saturation: {len(budgets)} token budget(s) ({', '.join(map(str, budgets))}); the ladder needs "
                       f"at least {MIN_BUDGETS}")
    common = dict(experiment=exp, recipe=recipe, teacher=score(teacher))
    rows, curves = [], {"slice": {}, full: {}}
    for tokens in budgets:
        base = curves["slice"][tokens] = _slice_scores(records, recipe, tokens, full)
        mine = curves[full][tokens] = scores_by_seed(records, recipe=recipe, arm=full, tokens=tokens)
        rows.append(measure_row("saturation", f"slice at {tokens} tokens", base, tokens=tokens, arm="slice",
                                measure="score", **common))
        rows.append(measure_row("saturation", f"{full} at {tokens} tokens", mine, tokens=tokens, arm=full,
                                measure="score", **common))
        rows.append(paired_row("saturation", f"{full} − slice at {tokens} tokens", mine, base,
                               a_name=f"{recipe}-{full}-t{tokens}", b_name=f"{recipe}-slice-t{tokens}", tokens=tokens,
                               arm=f"{full} − slice", measure="gap", **common))
    rows.append(paired_row("saturation",
                           f"long-budget gap: {full} − slice at the largest budget ({budgets[-1]} tokens)",
                               scores_by_seed(records, recipe=recipe, arm=full, tokens=budgets[-1]),
                               scores_by_seed(records, recipe=recipe, arm="slice", tokens=budgets[-1]),
                               a_name=f"{recipe}-{full}-t{budgets[-1]}", b_name=f"{recipe}-slice-t{budgets[-1]}",
                               ref=paper("saturation", "gap"), headline=True, tokens=budgets[-1], arm=f"{full} − slice",
                               measure="long-budget gap", **common))
    last, before = budgets[-1], budgets[-2]
    for arm, curve in curves.items():
        rows.append(paired_row("saturation", f"plateau: {arm} at {last} − at {before} tokens", curve[last],
                               curve[before], a_name=f"{recipe}-{arm}-t{last}", b_name=f"{recipe}-{arm}-t{before}",
                               ref=PLATEAU, headline=True, tokens=last, arm=arm, measure="plateau", **common))
    rows.append(paired_row("saturation", f"learning speed (not reach): area under the curve, {full} − slice, "
                           f"mean score over log tokens {budgets[0]}–{last}", area_under_curve(curves[full]),
                           area_under_curve(curves["slice"]), a_name=f"{recipe}-{full} area",
                           b_name=f"{recipe}-slice area", headline=True, arm=f"{full} − slice", measure="speed",
                           **common))
    return pd.DataFrame(rows)


def sft(paths: Sequence[Path]) -> pd.DataFrame:
    """Each student after SFT minus the teacher (over seeds) and its SFT gain (paired)."""
    records = load_records(paths)
    teacher, exp = teacher_record(records), records[0]["experiment"]
    t_score, rows = score(teacher), []
    for recipe in _recipes(records):
        for tokens in sorted({r["tokens"] for r in student_runs(records) if r["recipe"] == recipe and r["sft"]}):
            for arm in _arms(records, recipe, tokens, sft=True):
                after = scores_by_seed(records, recipe=recipe, arm=arm, tokens=tokens, sft=True)
                before = scores_by_seed(records, recipe=recipe, arm=arm, tokens=tokens)
                full = "full" if arm != "slice" else "slice"
                common = dict(experiment=exp, recipe=recipe, tokens=tokens, teacher=t_score)
                vs_teacher = {s: v - t_score for s, v in after.items()}
                rows.append(measure_row("sft", f"{arm} after SFT − teacher", vs_teacher,
                                        ref=paper("sft", f"{full}-teacher"), headline=True,
                                        p_value=paired_t_pvalue(vs_teacher.values()), model_mean=mean(after.values()),
                                        **common))
                if not before:
                    raise LRCError(f"sft: {recipe}-{arm}-t{tokens}.sft has no evaluation before SFT among the inputs")
                rows.append(paired_row("sft", f"{arm}: SFT gain (after − before)", after, before,
                                       a_name=f"{recipe}-{arm}-t{tokens}.sft", b_name=f"{recipe}-{arm}-t{tokens}",
                                       ref=paper("sft", f"{full}-gain"), **common))
    if not rows:
        raise LRCError("sft: no .sft evaluation among the inputs")
    return pd.DataFrame(rows)

