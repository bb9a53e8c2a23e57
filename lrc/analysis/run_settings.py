"""Were the students of a table trained with the settings its config names? (`lrc aggregate
--expect-settings`).

A table row is a student the config names by its run (``{recipe}-{arm}-s{seed}-t{tokens}``);
the config's flags for that run are not in the name. Snakemake re-runs a job whose flags
changed, but only while it remembers them: after ``--cleanup-metadata``, or outputs copied in
from elsewhere, a table could mix students trained with two learning rates. So the table
rules hand ``lrc aggregate`` the flags every distillation of each experiment and recipe was
given (``lrc.workflow.config.expected_run_settings``), and it compares them with the settings
each run recorded (``results/{exp}/distill/{run}/settings.json``, the student behind an
evaluation, before SFT or knockout), refusing the table on any difference, naming the run, the
config key and both values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from lrc.errors import LRCError
from lrc.names import KNOCKOUT_SUFFIX, SFT_SUFFIX


def distill_settings_file(eval_file: Path) -> Path:
    """results/{exp}/eval/{run}[.sft|.knockout].json -> results/{exp}/distill/{run}/settings.json."""
    run = eval_file.name.removesuffix(".json").removesuffix(SFT_SUFFIX).removesuffix(KNOCKOUT_SUFFIX)
    return eval_file.parent.parent / "distill" / run / "settings.json"


def same_value(a: Any, b: Any) -> bool:
    """Equal as settings: lists element-wise, numbers as floats (YAML's ``3e-3`` is a string that
    the command line reads as 0.003), anything else as text."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same_value(x, y) for x, y in zip(a, b)))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def recorded_settings(file: Path) -> dict[str, Any]:
    try:
        record = json.loads(file.read_text())
    except FileNotFoundError:
        raise LRCError(f"cannot check the settings of {file.parent}: it has no settings.json (a student this "
                       "workflow did not train?)") from None
    except (OSError, json.JSONDecodeError) as err:
        raise LRCError(f"cannot read {file}: {err}") from err
    settings = record.get("settings") if isinstance(record, dict) else None
    if not isinstance(settings, dict):
        raise LRCError(f"{file}: no 'settings' object")
    return settings


def settings_mismatches(records: list[dict[str, Any]], expected: Mapping[str, Mapping[str, Mapping[str, Any]]]
                        ) -> list[str]:
    """Every disagreement between the runs' recorded settings and ``expected``
    (experiment -> recipe -> {dotted config key: value}); runs of experiments or recipes that
    ``expected`` does not name are not checked."""
    problems, seen = [], set()
    for rec in records:
        want = expected.get(rec["experiment"], {}).get(rec["recipe"]) if rec["seed"] is not None else None
        file = distill_settings_file(Path(rec["file"]))
        if want is None or file in seen:
            continue
        seen.add(file)
        recorded = recorded_settings(file)
        for dotted, value in want.items():
            key = dotted.rsplit(".", 1)[-1]
            where = f"experiments.{rec['experiment']}.{dotted}"
            if key not in recorded:
                problems.append(f"{file.parent.name}: its settings.json records no {key!r} ({where} is {value!r})")
            elif not same_value(recorded[key], value):
                problems.append(f"{file.parent.name} was trained with {key} = {recorded[key]!r}, but {where} is "
                                f"{value!r} ({file})")
    return problems


def check_settings(records: list[dict[str, Any]], expected_json: str) -> None:
    """Refuse a table whose students disagree with ``expected_json`` (see the module doc)."""
    try:
        expected = json.loads(expected_json)
    except json.JSONDecodeError as err:
        raise LRCError(f"--expect-settings: not JSON ({err})") from err
    if not isinstance(expected, dict):
        raise LRCError("--expect-settings: expected a JSON object experiment -> recipe -> {config key: value}")
    problems = settings_mismatches(records, expected)
    if problems:
        raise LRCError("the table would mix students trained with other settings than the config names; re-run "
                       "them (snakemake --forcerun distill, or delete their outputs):\n  " + "\n  ".join(problems))
