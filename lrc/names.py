"""The project's names, in one dependency-free place: arms, recipes, and the run name.

The workflow (`workflow/rules/common.smk`), the JSON schema's enums (checked by a test),
the method modules and `lrc aggregate` all read them from here, so adding an arm or a
recipe is one edit.
"""

from __future__ import annotations

import re
from pathlib import Path

# docs/method.md §3: plain LRC, the two full-reach arms, then the controls: `coreortho` is CORE's
# other reading (orthonormal coordinates), `confined` and `randcomp` the subspace and basis controls.
ARMS = ("slice", "dense", "core", "coreortho", "confined", "randcomp")
MAIN_ARMS = ("slice", "dense", "core")
CONTROL_ARMS = ("coreortho", "confined", "randcomp")
# The arms whose deployed MLP matrices train everywhere (the others stay in the teacher's slice).
FULL_REACH_ARMS = ("dense", "core", "coreortho", "randcomp")
# The claims of METHOD.md §4, in its order (`lrc claims`; the workflow's rules claim_<claim>).
CLAIMS = ("capacity", "table1", "controls", "cross_recipe", "saturation", "knockout", "sft", "coordinates")
RECIPES = ("lrc", "kl")
KL_REDUCTIONS = ("batchmean", "token")
MLP_KINDS = ("gate", "up", "down")
# The attribute through which an arm (lrc.method.reach) hands a weight's optimiser coordinates to
# CoordinateAdamW (lrc.training.optim): the one name the method and the training loop share.
COORDINATES_ATTR = "optimizer_coordinates"

RUN_FORMAT = "{recipe}-{arm}-s{seed}-t{tokens}"
SFT_SUFFIX = ".sft"
# A student with its MLP energy outside the teacher's spaces removed (`lrc audit --knockout`).
KNOCKOUT_SUFFIX = ".knockout"
_RUN_PATTERN = re.compile(
    r"^(?P<recipe>{})-(?P<arm>{})-s(?P<seed>\d+)-t(?P<tokens>\d+)(?P<suffix>{}|{})?$".format(
        "|".join(RECIPES), "|".join(ARMS), re.escape(SFT_SUFFIX), re.escape(KNOCKOUT_SUFFIX)
    )
)


def run_name(recipe: str, arm: str, seed: int | str, tokens: int | str) -> str:
    """The name of one distillation run: ``lrc-dense-s0-t800000``."""
    return RUN_FORMAT.format(recipe=recipe, arm=arm, seed=seed, tokens=tokens)


def parse_run_name(name: str) -> dict | None:
    """``run_name``'s inverse (plus at most one of ``.sft`` / ``.knockout``), or None for another name."""
    m = _RUN_PATTERN.match(name)
    if m is None:
        return None
    return {
        "recipe": m["recipe"], "arm": m["arm"], "seed": int(m["seed"]), "tokens": int(m["tokens"]),
        "sft": m["suffix"] == SFT_SUFFIX, "knockout": m["suffix"] == KNOCKOUT_SUFFIX,
    }


def teacher_config_places(exp: str, teacher: dict, root: Path | str = ".") -> list[Path]:
    """Where a (non-world) teacher's ``config.json`` can be read before any job runs, in order: the
    imported or downloaded teacher, ``config/teachers/<exp>.json`` (the project's, then the checkout's),
    a local teacher's own directory (``teacher.local.path``, relative to ``root`` unless absolute)."""
    root, shipped = Path(root), Path(__file__).resolve().parents[1] / "config" / "teachers" / f"{exp}.json"
    places = [root / "results" / exp / "teacher" / "config.json", root / "config" / "teachers" / f"{exp}.json"]
    places += [shipped] if shipped != places[-1].resolve() else []  # the checkout's, run from elsewhere
    local = (teacher.get("local") or {}).get("path") if teacher.get("source") == "local" else None
    if local:
        places.append(root / local / "config.json")  # an absolute `local` stays itself under `/`
    return places
