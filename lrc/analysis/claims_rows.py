"""The pieces every claim table is made of: the paper's numbers, scores by seed, and rows.

A claim table (`lrc claims CLAIM`) has one row per comparison, with the same leading columns
(``ROW_COLUMNS``): the paper's number and which of its settings it is, the miniature's mean,
its 95 % t interval over seeds, the seeds and per-seed values, the paired p-value, the seeds a
paired t-test would need to detect the paper's gap at 80 % power given the row's spread, what
"direction" means for the row, its verdict rule (``verdict_rule``: sign, equivalence, size, chance
or no-paper) and whether it holds (:func:`direction_holds`; docs/method.md §9). ``headline`` marks
the rows that `lrc claims summary` carries into ``results/claims.csv``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

from lrc.analysis.stats import (
    CI_METHOD,
    EQUIVALENCE_LEVEL,
    Interval,
    mean,
    paired_differences,
    paired_t_pvalue,
    per_seed_text,
    seeds_for_power,
    t_interval,
)
from lrc.analysis.tables import load_evaluations
from lrc.errors import LRCError

PAPER_SOURCE = "docs/method.md §4"
ROW_COLUMNS = (
    "claim", "comparison", "experiment", "recipe", "tokens", "paper", "paper_setting", "paper_source",
    "miniature", "ci_low", "ci_high", "n_seeds", "seeds", "per_seed", "p_value", "seeds_for_paper_gap",
    "direction", "verdict_rule", "direction_holds", "ci_excludes_zero", "ci90_low", "ci90_high", "headline",
    "ci_method",
)


@dataclass(frozen=True)
class Paper:
    """The paper's number for one comparison (None: it has none) and how to read the direction.

    ``sign``: the paper found an effect of this sign; ``equivalence``: the paper found no effect (the
    rules: :func:`direction_holds`); ``size``: a size to set beside the paper's, no
    direction; ``chance``: the knockout rule (see :func:`lrc.analysis.claims_measures`); ``no-paper``:
    nothing to compare with. ``expect`` is the sign a ``sign`` row expects where the paper has no number
    of its own for the measure (the KL rows: the paper's accuracy gain predicts a student closer to
    the teacher).
    """

    value: float | None
    setting: str
    kind: Literal["sign", "equivalence", "size", "chance", "no-paper"] = "sign"
    expect: float | None = None

    @property
    def sign(self) -> float | None:
        """The direction a sign row expects: the paper's number, else ``expect``."""
        return self.value if self.value else self.expect


# The null's equivalence margin, in points of the aggregate (a choice: about the size of the
# paper's own "within evaluation noise", 66.21 vs 66.18 and 64.02 vs 64.04).
EQUIVALENCE_MARGIN = 1.0


NO_PAPER = Paper(None, "the paper has no number for this", "no-paper")
# The ladder's plateau evidence: not a claim of the paper, a condition for reading the others.
PLATEAU = Paper(None, "not a paper number: an arm has plateaued when its score moves by less than the margin "
                      "between the ladder's last two budgets", "equivalence")
LLAMA_1B5 = "Llama-3.2-3B → 1.5B, 10B tokens"
# METHOD.md §4 (the same text as docs/method.md §4). Differences of two published scores are
# marked "derived".
PAPER = {
    ("table1", "dense"): Paper(2.23, f"{LLAMA_1B5}, strictly matched dense arm (+2.71 Llama-3.1-8B → 2.7B, "
                                     "+6.39 Qwen2.5-3B → 1.7B)"),
    ("table1", "core"): Paper(2.36, f"{LLAMA_1B5}, teacher-spectral arm (+10.45 Qwen2.5-3B → 1.7B)"),
    ("table1", "kl"): Paper(None, "the paper reports no KL to the teacher; its accuracy gains (+2.23 dense, +2.36 "
                                  "spectral) predict a full-reach student closer to the teacher than LRC's slice",
                            expect=1.0),
    ("controls", "dense"): Paper(2.23, f"{LLAMA_1B5}, strictly matched dense arm"),
    ("controls", "core"): Paper(2.36, f"{LLAMA_1B5}, teacher-spectral arm"),
    ("controls", "randcomp"): Paper(1.72, f"{LLAMA_1B5}: random completion 64.76 − plain LRC 63.04 "
                                          "(= 65.40 − 2.36), derived"),
    ("controls", "confined"): Paper(-0.02, f"{LLAMA_1B5}: equal-parameter slice-confined 64.02 vs "
                                           "plain LRC 64.04 (a null)", "equivalence"),
    ("controls", "core-dense"): Paper(0.13, f"{LLAMA_1B5}: spectral 65.40 − dense 65.27, derived"),
    ("controls", "randcomp-core"): Paper(-0.64, f"{LLAMA_1B5}: random completion 64.76 − spectral 65.40, derived"),
    ("cross_recipe", "lrc"): Paper(1.82, "the controls' backbone, 2B tokens, slice → full under the LRC recipe"),
    ("cross_recipe", "kl"): Paper(2.86, "the controls' backbone, 2B tokens, slice → full under the KL-only recipe"),
    ("cross_recipe", "kl-lrc"): Paper(1.04, "2B tokens: +2.86 (KL-only) − +1.82 (LRC), derived"),
    ("saturation", "gap"): Paper(2.54, "Llama-3.2-3B → 1.5B: full 65.40 at 10B tokens − plain LRC's plateau 62.86 at "
                                       "50B (the paper: ~2.5)"),
    ("knockout", "outside"): Paper(7.4, "the full-reach student's weight energy outside the teacher's spaces: 7.4 %",
                                   "size"),
    ("knockout", "chance"): Paper(0.0, "removing that complement collapses the full-reach student to chance", "chance"),
    ("sft", "full-teacher"): Paper(0.03, "1.5B student (the paper's teacher-spectral arm) 66.21 after SFT vs its "
                                         "teacher Llama-3.2-3B 66.18, derived"),
    ("sft", "full-gain"): Paper(0.81, "1.5B student (the paper's teacher-spectral arm) 66.21 after SFT − "
                                      "65.40 before, derived"),
    ("sft", "slice-gain"): Paper(1.00, "original LRC-1.5B 63.48 after SFT − its base 62.48, derived"),
}


def paper(claim: str, key: str) -> Paper:
    return PAPER.get((claim, key), NO_PAPER)


# ----------------------------------------------------------------------------- evaluation scores


def experiment_of_input(path: Path) -> str:
    """The experiment of a claim's input: results/{exp}/eval/x.json, results/{exp}/occupancy/x.csv,
    results/{exp}/distill/{run}/update_energy.csv (a claim CSV or another file: its folder)."""
    path = Path(path)
    if path.name == "update_energy.csv":
        return path.parent.parent.parent.name
    return path.parent.parent.name if path.parent.name in ("eval", "occupancy") else path.parent.name


def by_experiment(paths: Sequence[Path]) -> dict[str, list[Path]]:
    """The inputs grouped by experiment, in the order the experiments first appear."""
    groups: dict[str, list[Path]] = {}
    for path in paths:
        groups.setdefault(experiment_of_input(Path(path)), []).append(Path(path))
    return groups


def load_records(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Evaluation JSONs (lrc.commands.aggregate's reader), all of one experiment."""
    records = load_evaluations(paths)
    experiments = sorted({r["experiment"] for r in records})
    if len(experiments) != 1:
        raise LRCError(f"--inputs: evaluation files of {len(experiments)} experiments ({', '.join(experiments)}); "
                       "give one experiment's")
    return records


def score(record: dict[str, Any]) -> float:
    """The record's aggregate in percent (NaN where the suite has none)."""
    value = record["data"]["aggregate"].get("value")
    return float("nan") if value is None else 100.0 * float(value)


def kl_to_teacher(record: dict[str, Any]) -> float:
    """The record's mean per-token KL(teacher ‖ model) on the held-out split (NaN where not measured)."""
    value = record["data"].get("extra", {}).get("kl_to_teacher")
    return float("nan") if value is None else float(value)


def records_by_seed(records: list[dict[str, Any]], *, recipe: str, arm: str, tokens: int | None,
                    sft: bool = False, knockout: bool = False) -> dict[int, dict[str, Any]]:
    """seed -> the record of the run matching; a seed given twice is an error."""
    out: dict[int, dict[str, Any]] = {}
    for r in records:
        if (r["recipe"], r["arm"], r["sft"], r.get("knockout", False)) != (recipe, arm, sft, knockout):
            continue
        if tokens is not None and r["tokens"] != tokens or r["seed"] is None:
            continue
        if r["seed"] in out:
            raise LRCError(f"{recipe}-{arm} t{tokens}: seed {r['seed']} given twice (second: {r['file']})")
        out[r["seed"]] = r
    return dict(sorted(out.items()))


def scores_by_seed(records: list[dict[str, Any]], *, recipe: str, arm: str, tokens: int | None,
                   sft: bool = False, knockout: bool = False,
                   measure: Callable[[dict[str, Any]], float] = score) -> dict[int, float]:
    """seed -> ``measure`` (default: the aggregate, percent) of the runs matching; a seed given twice is an
    error."""
    found = records_by_seed(records, recipe=recipe, arm=arm, tokens=tokens, sft=sft, knockout=knockout)
    return {seed: measure(r) for seed, r in found.items()}


def teacher_record(records: list[dict[str, Any]], *, required: bool = True) -> dict[str, Any] | None:
    found = [r for r in records if r["arm"] == "teacher"]
    if not found and required:
        raise LRCError("--inputs: no teacher.json among the evaluation files")
    return found[0] if found else None


def chance_level(record: dict[str, Any]) -> float:
    """The suite's chance score in percent: the mean of the tasks' chance (the aggregate is the
    mean over tasks), NaN where a task does not know its chance."""
    chances = [t.get("chance") for t in record["data"]["tasks"].values()]
    if not chances or any(c is None for c in chances):
        return float("nan")
    return 100.0 * sum(chances) / len(chances)


def student_runs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["arm"] != "teacher" and r["seed"] is not None]


# ----------------------------------------------------------------------------- rows


def measure_row(claim: str, comparison: str, values: Mapping[int, float], *, ref: Paper = NO_PAPER,
                headline: bool = False, **extra: Any) -> dict[str, Any]:
    """A row for one measured quantity (its mean and interval over seeds, no test)."""
    return _row(claim, comparison, dict(values), float("nan"), ref, headline, extra)


def paired_row(claim: str, comparison: str, a: Mapping[int, float], b: Mapping[int, float], *, a_name: str,
               b_name: str, ref: Paper = NO_PAPER, headline: bool = False, **extra: Any) -> dict[str, Any]:
    """A row for ``a - b`` paired by seed: mean difference, its interval, paired p-value."""
    diffs = paired_differences(a, b, a_name=a_name, b_name=b_name)
    return _row(claim, comparison, diffs, paired_t_pvalue(diffs.values()), ref, headline,
                {**_both_arms(a, b, a_name, b_name), **extra})


def reduction_row(claim: str, comparison: str, model: Mapping[int, float], baseline: Mapping[int, float], *,
                  a_name: str, b_name: str, ref: Paper = NO_PAPER, headline: bool = False,
                  **extra: Any) -> dict[str, Any]:
    """A row for the share of ``baseline`` that ``model`` removes, ``100·(b − a)/b`` per seed (paired by
    seed): its mean, interval and t-test against 0."""
    removed = paired_differences(baseline, model, a_name=b_name, b_name=a_name)
    values = {seed: 100.0 * d / float(baseline[seed]) for seed, d in removed.items()}
    return _row(claim, comparison, values, paired_t_pvalue(values.values()), ref, headline,
                {**_both_arms(model, baseline, a_name, b_name), **extra})


def _both_arms(a: Mapping[int, float], b: Mapping[int, float], a_name: str, b_name: str) -> dict[str, Any]:
    """The columns naming a paired row's two sides, with their means and per-seed values."""
    return {"model": a_name, "model_mean": mean(a.values()), "model_per_seed": per_seed_text(a), "baseline": b_name,
            "baseline_mean": mean(b.values()), "baseline_per_seed": per_seed_text(b)}


def _row(claim, comparison, values, p_value, ref: Paper, headline, extra) -> dict[str, Any]:
    iv = t_interval(values.values())
    row = {
        "claim": claim, "comparison": comparison, "experiment": extra.pop("experiment", ""),
        "recipe": extra.pop("recipe", ""), "tokens": extra.pop("tokens", None),
        "paper": ref.value, "paper_setting": ref.setting, "paper_source": PAPER_SOURCE if ref.value is not None else "",
        "miniature": iv.mean, "ci_low": iv.low, "ci_high": iv.high, "n_seeds": iv.n,
        "seeds": " ".join(map(str, sorted(values))), "per_seed": per_seed_text(values), "p_value": p_value,
        "seeds_for_paper_gap": seeds_for_power(ref.value, iv.sd) if ref.kind == "sign" and ref.value else float("nan"),
        "direction": extra.pop("direction", None) or direction_text(ref), "verdict_rule": ref.kind,
        "direction_holds": extra.pop("direction_holds", None), "ci_excludes_zero": iv.excludes_zero,
        "ci90_low": float("nan"), "ci90_high": float("nan"), "headline": headline, "ci_method": CI_METHOD,
    }
    iv90 = t_interval(values.values(), EQUIVALENCE_LEVEL)
    if ref.kind == "equivalence":
        row["ci90_low"], row["ci90_high"] = iv90.low, iv90.high
    if row["direction_holds"] is None:
        row["direction_holds"] = direction_holds(ref, iv, iv90)
    return {**row, **extra}


def direction_text(ref: Paper) -> str:
    if ref.kind == "sign" and ref.value is None:
        return ("the sign the paper's accuracy gain predicts (positive): holds if the 95 % interval lies above 0, "
                "fails if it lies below, blank (inconclusive) if it holds 0")
    if ref.kind == "sign":
        return (f"the paper's sign ({ref.value:+.2f}): holds if the 95 % interval lies on that side of 0, fails if "
                "it lies on the other side, blank (inconclusive) if it holds 0")
    if ref.kind == "equivalence" and ref.value is None:
        return (f"no change (a plateau): holds if the 90 % interval lies within ±{EQUIVALENCE_MARGIN:g} points, "
                "else fails if the 95 % interval excludes 0, blank (inconclusive) otherwise")
    if ref.kind == "equivalence":
        return (f"no effect, as in the paper ({ref.value:+.2f}): holds if the 90 % interval lies within "
                f"±{EQUIVALENCE_MARGIN:g} points (equivalence), else fails if the 95 % interval excludes 0, "
                "blank (inconclusive) otherwise")
    if ref.kind == "size":
        return f"a size beside the paper's {ref.value:g}, no direction to hold"
    return "no paper number to compare with"


def direction_holds(ref: Paper, iv: Interval, iv90: Interval | None = None) -> bool | None:
    """The verdict of a row from its 95 % interval ``iv`` (and, for a null, its 90 % interval ``iv90``);
    None is "inconclusive", and so is every row without an interval (one seed).

    sign: yes when the interval lies on the paper's side of 0, no when it lies on the other side,
    inconclusive when it holds 0 — a mean of the right sign alone is never a yes. equivalence (a null):
    yes when the 90 % interval lies within ±``EQUIVALENCE_MARGIN`` (two one-sided tests at 5 %), else no
    when the 95 % interval excludes 0, else inconclusive — an interval that merely holds 0 is a
    lack of evidence, not a null. Other kinds: None."""
    if iv.excludes_zero is None:
        return None
    if ref.kind == "sign" and ref.sign:
        return (iv.low > 0) == (ref.sign > 0) if iv.excludes_zero else None
    if ref.kind == "equivalence":
        if iv90 is not None and -EQUIVALENCE_MARGIN <= iv90.low and iv90.high <= EQUIVALENCE_MARGIN:
            return True
        return False if iv.excludes_zero else None
    return None
