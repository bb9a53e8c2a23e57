"""The workflow config's flags checked against each command's own argument dataclass.

:func:`lrc.workflow.config.config_problems` finds a job's command dataclass with
:func:`command_args_class` (through ``lrc.cli.COMMANDS``, importing the command module only
when a check runs), names the rule's positional arguments (:func:`name_positionals`), and
builds the dataclass with the values the rule would pass (:func:`build_problem`): unknown
options, wrong types and the dataclass's own validation are reported with the config key.
The student width is checked against the teacher's where that is known before any job runs
(:func:`width_problems`). Split from :mod:`lrc.workflow.config`, which imports these back.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import typing
from pathlib import Path
from typing import Any

from lrc.cli import COMMANDS
from lrc.errors import LRCError
from lrc.names import teacher_config_places
from lrc.options import args_class, build_args, convert_value


def command_args_class(command: str) -> type:
    """The argument dataclass of ``lrc <command>``, through lrc.cli.COMMANDS."""
    module = importlib.import_module(COMMANDS[command][0])
    entry = getattr(module, f"main_{command}", None) or module.main
    return args_class(entry)


def name_positionals(cls: type, sets: dict[str, str]) -> dict[str, str]:
    """The rule's positional arguments under the names of the fields that take them."""
    sets = dict(sets)
    positional = sets.pop("_positional", "").split()
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.metadata.get("positional")]
    sets.update(zip(names, positional))
    return sets


def build_problem(cls: type, command: str, sets: dict[str, Any], sections: list[tuple[str, dict]]) -> str | None:
    """The first problem of building ``cls`` from the rule's own options ``sets`` and the
    config's flag ``sections`` (naming the key that causes it), or None."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    values = dict(sets)
    hints = _hints(cls)
    origin: dict[str, str] = {}
    for where, flags in sections:
        for key, value in (flags or {}).items():
            name = key.replace("-", "_")
            if name in sets or value is None:
                continue  # reported as set by the rule / left out like the command line does
            if name not in fields:
                return f"{where}.{key}: not an option of `lrc {command}` (see `lrc {command} --help`)"
            try:
                values[name] = convert_value(value, hints[name], f"{where}.{key}")
            except LRCError as err:
                return str(err)
            origin[name] = f"{where}.{key}"
    for name in [n for n in fields if n in values and n not in origin and n in sets]:
        try:
            values[name] = convert_value(values[name], hints[name], f"the rule's --{name.replace('_', '-')}")
        except LRCError:
            values[name] = str(values[name])
    try:
        build_args(cls, values, f"lrc {command}")
    except LRCError as err:
        message = str(err).removeprefix(f"lrc {command}: ")
        culprit = next((o for n, o in origin.items()
                        if re.search(rf"(--{n.replace('_', '-')}|\b{n})\b", message)), None)
        where = culprit or " / ".join(w for w, f in sections if f) or f"the options of `lrc {command}`"
        return f"{where}: {message}"
    return None


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# ------------------------------------------------------------------ the student width


def teacher_hidden_size(exp: str, settings: dict, workdir: Path | str = ".",
                        world_class: type | None = None) -> tuple[int, str] | None:
    """The teacher's hidden size and where it was read, when knowable before any job runs."""
    if settings["teacher"]["source"] == "world":
        world_class = world_class or command_args_class("world")
        flags = _converted(world_class, settings.get("world") or {})
        args = world_class(**(flags | {"out": Path("world")}))
        sizes = getattr(args, "teacher_sizes", None)  # lrc world's resolved teacher sizes
        return (int(sizes()["hidden_size"]), "the teacher sizes of the world section") if sizes else None
    for path in teacher_config_places(exp, settings["teacher"], workdir):
        if path.is_file():
            try:
                hidden = json.loads(path.read_text())["hidden_size"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise LRCError(f"{path}: not a model config with a hidden_size ({err})") from err
            return int(hidden), str(path)
    return None


def _converted(cls: type, flags: dict) -> dict:
    hints = _hints(cls)
    return {k: convert_value(v, hints[k], k) for k, v in flags.items() if k in hints and v is not None}


def width_problems(exp: str, settings: dict, classes: dict[str, type], workdir: Path | str) -> list[str]:
    """The student must be narrower than its teacher, where the teacher's width is known."""
    r = settings["student"]["hidden_size"]
    try:
        known = teacher_hidden_size(exp, settings, workdir, classes.get("world"))
    except LRCError as err:
        return [f"experiments.{exp}.world: {err}" if settings["teacher"]["source"] == "world" else str(err)]
    if known is None or r < known[0]:
        return []
    return [f"experiments.{exp}.student.hidden_size: {r} must be below the teacher's hidden size "
            f"{known[0]} (from {known[1]})"]
