"""The claims' item-level rows: each full-reach arm against slice on the same lm-eval items and the
same held-out rows, seed by seed (seed s's arm against seed s's slice), pooled over the seeds.

A row over seeds (:mod:`lrc.analysis.claims_tables`) has one value per seed, and with 3 seeds its
interval is wide. These rows use every item: per task, the per-item differences of all seeds
together, with the paired t interval over them; per held-out measure, the per-row sums of all
seeds together, with the paired bootstrap over rows (:mod:`lrc.analysis.paired_items`). Their
interval is that of the evaluation's sampling of items and text, given these trained students:
it leaves out the seed-to-seed spread that the row over seeds carries, so it gives no verdict
(``verdict_rule`` "items") and is read beside the row over seeds, not instead of it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from lrc.analysis.claims_rows import records_by_seed
from lrc.analysis.paired_items import paired_scores
from lrc.analysis.stats import paired_bootstrap, paired_t_pvalue, per_seed_text, t_interval
from lrc.errors import LRCError
from lrc.io.lm_eval_records import summary_records

ITEMS_RULE = "items"
# held-out measure kept per row by `lrc evaluate` -> (its name in a comparison, the unit of a difference)
HELDOUT = {"kl_to_teacher": "KL to the teacher (nats per token)", "nll": "cross-entropy (nats per token)"}


def _records(record: dict[str, Any]) -> Path:
    return summary_records(record["file"], record["data"])


def item_rows(records: list[dict[str, Any]], claim: str, pairs: Sequence[tuple[str, int, str]]) -> list[dict[str, Any]]:
    """For each (recipe, tokens, arm) in ``pairs``: per task, ``arm − slice`` per item in points, and
    per held-out measure, ``arm − slice`` per token, over the seeds both have, pooled."""
    rows = []
    for recipe, tokens, arm in pairs:
        mine = records_by_seed(records, recipe=recipe, arm=arm, tokens=tokens)
        base = records_by_seed(records, recipe=recipe, arm="slice", tokens=tokens)
        seeds = sorted(set(mine) & set(base))
        if not seeds:
            continue
        common = dict(claim=claim, experiment=records[0]["experiment"], recipe=recipe, tokens=tokens,
                      model=f"{recipe}-{arm}-t{tokens}", baseline=f"{recipe}-slice-t{tokens}", seeds=seeds)
        logged = all(_records(r).is_dir() for r in [*mine.values(), *base.values()])  # hand-made JSONs have none
        for task in _shared_tasks(mine[seeds[0]], base[seeds[0]]) if logged else []:
            metric = mine[seeds[0]]["data"]["tasks"][task]["metric"]
            per_seed = {s: [100.0 * (y - x) for y, x in paired_scores(
                (f"{arm} s{s}", _records(mine[s])), (f"slice s{s}", _records(base[s])), task, metric)]
                for s in seeds}
            rows.append(_items_row(f"{arm} − slice, {task} per item (points, seeds pooled)", per_seed, **common))
        for measure, label in HELDOUT.items():
            a = [base[s]["data"].get("extra", {}).get("heldout_rows") for s in seeds]
            b = [mine[s]["data"].get("extra", {}).get("heldout_rows") for s in seeds]
            if all(x and measure in x for x in a + b):
                rows.append(_heldout_row(f"{arm} − slice, {label}, held-out rows (seeds pooled)", measure, a, b,
                                         **common))
    return rows


def _shared_tasks(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    ta, tb = a["data"]["tasks"], b["data"]["tasks"]
    return [t for t in ta if t in tb and ta[t].get("metric") == tb[t].get("metric")]


def _items_row(comparison: str, per_seed: dict[int, list[float]], **common: Any) -> dict[str, Any]:
    differences = [d for s in sorted(per_seed) for d in per_seed[s]]
    iv = t_interval(differences)
    means = {s: sum(v) / len(v) for s, v in per_seed.items() if v}
    return _row(comparison, iv.mean, iv.low, iv.high, paired_t_pvalue(differences), len(differences), means,
                "paired t over items, the seeds' items pooled", **common)


def _heldout_row(comparison: str, measure: str, a: list[dict], b: list[dict], **common: Any) -> dict[str, Any]:
    for x, y in zip(a, b):
        if x["tokens"] != y["tokens"]:
            raise LRCError(f"{comparison}: arm and slice were not measured on the same held-out rows "
                           "(evaluate both with the same --heldout and --heldout-rows)")
    boot = paired_bootstrap([v for x in a for v in x[measure]], [v for y in b for v in y[measure]],
                            [w for x in a for w in x["tokens"]])
    means = {s: (sum(y[measure]) - sum(x[measure])) / sum(x["tokens"]) for s, x, y in zip(common["seeds"], a, b)}
    return _row(comparison, boot.difference, boot.low, boot.high, boot.p, boot.rows, means,
                "paired bootstrap over held-out rows, the seeds' rows pooled", **common)


def _row(comparison, value, low, high, p, n_items, per_seed, ci_method, *, claim, experiment, recipe, tokens, model,
         baseline, seeds) -> dict[str, Any]:
    excludes = None if math.isnan(low) else bool(low > 0 or high < 0)
    return {
        "claim": claim, "comparison": comparison, "experiment": experiment, "recipe": recipe, "tokens": tokens,
        "paper": None, "paper_setting": "", "paper_source": "", "miniature": value, "ci_low": low, "ci_high": high,
        "n_seeds": len(seeds), "seeds": " ".join(map(str, seeds)), "per_seed": per_seed_text(per_seed),
        "p_value": p, "seeds_for_paper_gap": float("nan"), "items": n_items,
        "direction": ("the evaluation's precision given these students: the interval covers the sampling of items "
                      "(or held-out rows), not the seeds' spread; no verdict, read beside the row over seeds"),
        "verdict_rule": ITEMS_RULE, "direction_holds": None, "ci_excludes_zero": excludes,
        "ci90_low": float("nan"), "ci90_high": float("nan"), "headline": True, "ci_method": ci_method,
        "model": model, "baseline": baseline,
    }
