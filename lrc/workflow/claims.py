"""What the `claims` section of a workflow config asks for: the runs each claim of METHOD.md §4
reads, the files its rule takes as inputs, and the checks of the section.

`workflow/rules/common.smk` turns these lists into the input functions of the rules
`claim_<CLAIM>` and `claims` (workflow/rules/claims.smk); `lrc.workflow.config` adds the claims'
runs to the jobs whose flags it checks. Pure functions of the validated settings of one
experiment: no Snakemake, nothing heavy.

The seed of a run varies its data order and anything random in the arm (randcomp's basis);
it does not vary the teacher, the tiny world or the SVD bases. With ``claims.vary_warmstart``
(the default) it varies the warm start too: seed 0 continues from the experiment's common warm
start (the quick start's), every other seed from one of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from lrc.names import (
    ARMS,
    CLAIMS,
    FULL_REACH_ARMS,
    KNOCKOUT_SUFFIX,
    MAIN_ARMS,
    RECIPES,
    SFT_SUFFIX,
    run_name,
)


def has_claims(settings: dict) -> bool:
    return bool(settings.get("claims"))


def included(settings: dict) -> tuple[str, ...]:
    """The claims the section asks for (``claims.include``; every claim by default), in CLAIMS' order;
    none without a claims section."""
    if not has_claims(settings):
        return ()
    asked = settings["claims"].get("include") or CLAIMS
    return tuple(c for c in CLAIMS if c in asked)


def _product(recipes: Iterable[str], arms: Iterable[str], seeds: Iterable[int], tokens: Iterable[int]) -> list[str]:
    return [run_name(r, a, s, t) for r, a, s, t in itertools.product(recipes, arms, seeds, tokens)]


def claim_runs(settings: dict, claim: str) -> list[str]:
    """The distillation runs (run names) whose outputs ``claim`` reads."""
    c = settings["claims"]
    seeds, tokens, full = c["seeds"], [c["tokens"]], c.get("full_arm")  # full_arm: only the claims that read it
    if claim == "table1":
        return _product(["lrc"], MAIN_ARMS, seeds, tokens)
    if claim in ("controls", "coordinates"):
        return _product(["lrc"], [a for a in ARMS if a in c.get("arms", ARMS)], seeds, tokens)
    if claim == "cross_recipe":
        return _product(RECIPES, ["slice", full], seeds, tokens)
    if claim == "saturation":
        return _product(["lrc"], ["slice", full], seeds, c["ladder"])
    if claim == "knockout":
        return _product(["lrc"], FULL_REACH_ARMS, seeds, tokens)
    if claim == "sft":
        return _product(["lrc"], ["slice", full], seeds, tokens)
    if claim == "capacity":
        return []  # the teacher's probe, no distillation
    raise KeyError(f"unknown claim {claim!r}; one of {', '.join(CLAIMS)}")


def all_claim_runs(settings: dict) -> list[str]:
    """Every run the claims read, each once, in the order the claims first name them."""
    if not has_claims(settings):
        return []
    return list(dict.fromkeys(r for claim in included(settings) for r in claim_runs(settings, claim)))


def claim_inputs(exp: str, settings: dict, claim: str) -> list[str]:
    """The files (and, for coordinates, the distill directories) the rule claim_<claim> reads
    for one experiment; [] for an experiment without a claims section or one that leaves the claim out."""
    if not has_claims(settings) or claim not in included(settings):
        return []
    if claim == "capacity":
        return [f"results/{exp}/probe.csv"]
    runs = claim_runs(settings, claim)
    eval_dir, teacher = f"results/{exp}/eval", f"results/{exp}/eval/teacher.json"
    if claim == "coordinates":
        return [f"results/{exp}/distill/{r}" for r in runs]
    evals = [f"{eval_dir}/{r}.json" for r in runs]
    if claim == "cross_recipe":
        return evals  # no teacher: FULL is the one arm besides slice among the inputs
    if claim == "knockout":
        knocked = [f"{eval_dir}/{r}{KNOCKOUT_SUFFIX}.json" for r in runs]
        return [teacher, *evals, *knocked, *(f"results/{exp}/occupancy/{r}.csv" for r in runs)]
    if claim == "sft":
        return [teacher, *evals, *(f"{eval_dir}/{r}{SFT_SUFFIX}.json" for r in runs)]
    return [teacher, *evals]


def varies_warmstart(settings: dict) -> bool:
    return bool((settings.get("claims") or {}).get("vary_warmstart"))


def warmstart_dir(exp: str, settings: dict, recipe: str, seed: int | str) -> str:
    """The warm start a run continues from: the recipe's common one (trained with seed 0), or,
    with ``claims.vary_warmstart`` and a seed other than 0, one of the seed's own."""
    if varies_warmstart(settings) and str(seed) != "0":
        return f"results/{exp}/warmstart/{recipe}-s{seed}"
    return f"results/{exp}/warmstart/{recipe}"


def claims_problems(exp: str, settings: dict) -> list[str]:
    """What the schema cannot say about a claims section, each naming its key."""
    c = settings.get("claims")
    if not c:
        return []
    where = f"experiments.{exp}"
    problems = []
    asked = included(settings)
    if "saturation" in asked:
        problems += _ladder_problems(where, c)
    if "coordinates" in asked and not ((settings.get("distill") or {}).get("train") or {}).get("update_energy_every"):
        problems.append(
            f"{where}.distill.train.update_energy_every: the coordinates claim reads each run's "
            "update_energy.csv; set it to a number of optimizer steps > 0 (e.g. 50), or leave coordinates out "
            "of claims.include"
        )
    arms = c.get("arms", ARMS)
    if {"controls", "coordinates"} & set(asked) and "slice" not in arms:
        problems.append(f"{where}.claims.arms: the controls are gains over slice; add slice to {list(arms)}")
    return problems


def _ladder_problems(where: str, c: dict) -> list[str]:
    ladder, tokens = c.get("ladder"), c["tokens"]
    if not ladder:
        return [f"{where}.claims.ladder: the saturation claim needs the budgets of its ladder (at least 4, "
                f"the largest at least 4x claims.tokens), or leave saturation out of claims.include"]
    problems = []
    if max(ladder) < 4 * tokens:
        problems.append(
            f"{where}.claims.ladder: the largest budget {max(ladder)} must be at least 4x claims.tokens "
            f"({4 * tokens}): the saturation claim is about the long-budget gap"
        )
    if list(ladder) != sorted(ladder):
        problems.append(f"{where}.claims.ladder: list the budgets in increasing order, got {list(ladder)}")
    return problems
