"""The model card of a merged student (``README.md`` in `lrc merge`'s output), and the teacher's
licence files beside it.

A merged student is a derivative of its teacher's weights: it inherits the teacher's licence and
its notices (Llama's community licences, for one, set conditions on derivatives' names and
notices). The card therefore names the teacher (its hub id and revision where `lrc download`
recorded them), copies the teacher's licence and notice files when the teacher directory has
them, and says what the student is: the arm, the recipe, the tokens and seed, the widths, the
merge check, and the code and command that made it. It claims nothing about quality: the
evaluation is `lrc evaluate`'s output, not the card's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from lrc.io.atomic import write_text_atomic
from lrc.io.provenance import code_identity, describe_code

CARD_FILE = "README.md"
MERGE_CHECK = "merge_check.json"  # `lrc merge`'s record of its check, beside the card
LICENCE_FILES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "NOTICE", "NOTICE.txt", "USE_POLICY.md")


def teacher_origin(teacher: Path) -> dict[str, Any]:
    """What the teacher directory's settings.json says about where it came from (may be empty)."""
    try:
        settings = json.loads((teacher / "settings.json").read_text()).get("settings", {})
    except (OSError, ValueError, AttributeError):
        return {}
    keys = ("repo_id", "revision", "gguf", "path", "package")
    return {k: settings[k] for k in keys if isinstance(settings, dict) and settings.get(k) not in (None, "")}


def copy_licence_files(teacher: Path, out: Path) -> list[str]:
    copied = []
    for name in LICENCE_FILES:
        if (teacher / name).is_file():
            shutil.copyfile(teacher / name, out / name)
            copied.append(name)
    return copied


def card_text(*, name: str, teacher: Path, state_meta: dict[str, Any], check: dict[str, Any],
              licence_files: list[str], command: str) -> str:
    origin = teacher_origin(teacher)
    base = origin.get("repo_id") or str(teacher)
    meta = state_meta.get("meta", {})
    arm = state_meta.get("arm", "?")
    licence = (f"copied here from the teacher: {', '.join(licence_files)}" if licence_files else
               "the teacher directory holds no licence file: look up the teacher's licence before you share this "
               "model")
    lines = [
        "---",
        f"base_model: {base}" if origin.get("repo_id") else "base_model: (a local teacher, see below)",
        "library_name: transformers",
        f"tags: [lrc, low-rank-clone, distillation, {arm}]",
        "license: other  # the teacher's: see below",
        "---",
        "",
        f"# {name}",
        "",
        f"A student distilled from the teacher `{base}` by Low-Rank Clone (LRC), arm `{arm}`, merged into a plain "
        "checkpoint (no LRC code is needed to load it).",
        "",
        "| | |",
        "|---|---|",
        f"| teacher | `{base}`" + (f" at revision `{origin['revision']}`" if origin.get("revision") else "")
        + (f" (from `{origin.get('gguf') or origin.get('path')}`)" if origin.get("gguf") or origin.get("path") else "")
        + " |",
        f"| arm | `{arm}` (what the arm trains: the project's docs/method.md §3) |",
        f"| recipe | `{meta.get('recipe', '?')}`, {meta.get('tokens', '?')} distillation tokens, seed "
        f"{state_meta.get('seed', '?')}, from the warm start `{meta.get('warmstart', '?')}` |",
        f"| widths | student hidden size {state_meta.get('student_hidden', '?')}, teacher's "
        f"{state_meta.get('teacher_hidden', '?')} |",
        f"| merge check | max abs logit difference to the training student {check.get('max_abs_diff', '?'):.3g} "
        f"(allowed {check.get('atol', '?')}); transformers' greedy `generate` continues as the student "
        f"({'yes' if (check.get('generation') or {}).get('passed') else 'not checked'}) |",
        f"| weights | {check.get('saved_dtype', 'fp32')}"
        + (f" (max abs logit difference after the cast {check['saved_max_abs_diff']:.3g})"
           if "saved_max_abs_diff" in check else "") + " |",
        f"| made by | {describe_code(code_identity())}: `{command}` |",
        "",
        "## Licence",
        "",
        "This model is derived from the teacher's weights and inherits the teacher's licence and its notices, "
        f"including any conditions on the names of derived models ({licence}).",
        "",
        "## Evaluation",
        "",
        "Not part of this card: `lrc evaluate` writes the scores (the workflow's `results/{exp}/eval/`).",
        "",
    ]
    return "\n".join(lines)


def write_model_card(out: Path, *, teacher: Path, state_meta: dict[str, Any], check: dict[str, Any],
                     command: str) -> None:
    copied = copy_licence_files(teacher, out)
    write_text_atomic(out / CARD_FILE, card_text(name=out.name, teacher=teacher, state_meta=state_meta, check=check,
                                                 licence_files=copied, command=command))
