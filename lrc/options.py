"""Typed command options: keyword-only dataclasses parsed from flags or a YAML file.

Every command describes its options as a dataclass; :func:`parse_args` turns
``--field-name value`` flags (and ``--config FILE.yaml``) into it, and :func:`check_choice`
is the one check of a value against its allowed choices. This module is the bottom layer of
the package (it imports nothing from it but the error type), so the method, the loop and
the commands can all use it without importing the command line.
"""

from __future__ import annotations

import argparse
import contextvars
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, Sequence, TypeVar

import yaml

from lrc.errors import LRCError

T = TypeVar("T")


def parse_args(cls: type[T], argv: Sequence[str] | None = None, prog: str | None = None) -> T:
    """Parse ``--field-name value`` flags into the keyword-only dataclass ``cls``.

    Field help comes from ``field(metadata={"help": ...})``; ``metadata={"positional": True}``
    also accepts the value as a positional argument. ``--config FILE.yaml``
    supplies values for any fields (keys are field names); flags given on the command
    line win. Unknown keys and wrong types are errors that name the key.
    """
    if _CAPTURE.get():
        raise _Captured(cls)
    parser = argparse.ArgumentParser(prog=prog, description=(cls.__doc__ or "").strip())
    parser.add_argument("--config", type=Path, help="YAML file with values for any of the options below")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for name, f in fields.items():
        _add_option(parser, name, hints[name], f)
    ns = vars(parser.parse_args(list(argv) if argv is not None else None))
    values: dict[str, Any] = {}
    config_file = ns.pop("config")
    if config_file is not None:
        values.update(_load_config_file(config_file, fields, hints))
    for key in [k for k in ns if k.endswith("_positional")]:
        value = ns.pop(key)
        if value is not None:
            ns[key.removesuffix("_positional")] = value
    values.update({k: v for k, v in ns.items() if v is not None})
    missing = [n for n, f in fields.items() if n not in values and _is_required(f)]
    if missing:
        parser.error("missing required option(s): " + ", ".join("--" + m.replace("_", "-") for m in missing))
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise LRCError(f"{prog or cls.__name__}: {err}") from err


def _is_required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _add_option(parser: argparse.ArgumentParser, name: str, tp: Any, f: dataclasses.Field) -> None:
    flag = "--" + name.replace("_", "-")
    flags = [flag] if "_" not in name else [flag, "--" + name]
    help_text = f.metadata.get("help", "")
    if f.metadata.get("positional"):
        # A positional argument may still be given as a flag (handy in YAML and rules).
        parser.add_argument(name + "_positional", metavar=name.upper(), nargs="?", type=_unwrap_optional(tp), help=help_text)
    if not _is_required(f):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text += f" (default: {default})"
    else:
        help_text += " (required)"
    tp = _unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if tp is bool:
        parser.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
    elif origin is Literal:
        choices = typing.get_args(tp)
        parser.add_argument(*flags, dest=name, type=type(choices[0]), choices=choices, default=None, help=help_text)
    elif origin in (list, tuple):
        (item,) = typing.get_args(tp)[:1]
        parser.add_argument(*flags, dest=name, type=_item_type(item), nargs="*", default=None, help=help_text)
    else:
        parser.add_argument(*flags, dest=name, type=tp, default=None, help=help_text)


def _item_type(item: Any) -> Any:
    if typing.get_origin(item) is Literal:
        return type(typing.get_args(item)[0])
    return item


def _load_config_file(path: Path, fields: dict[str, dataclasses.Field], hints: dict[str, Any]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise LRCError(f"cannot read config file {path}: {err}") from err
    if not isinstance(data, dict):
        raise LRCError(f"config file {path} must hold a mapping of option names to values")
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            raise LRCError(f"config file {path}: unknown key {key!r}")
        out[name] = convert_value(value, hints[name], f"config file {path}: {key}")
    return out


def convert_value(value: Any, tp: Any, where: str) -> Any:
    """``value`` (as YAML read it) converted to the option type ``tp`` the way the command line
    would read its text: ``"1e-4"`` (a string to YAML) is the float 1e-4, ``2048.7`` is no
    int, ``"yes"`` is no bool. A wrong value is an LRCError that starts with ``where``."""
    optional = tp is not _unwrap_optional(tp)
    tp = _unwrap_optional(tp)
    if value is None:
        if optional:
            return None
        raise LRCError(f"{where}: needs a value ({_type_name(tp)}), got null")
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        (item,) = typing.get_args(tp)[:1] or (Any,)
        items = value if isinstance(value, (list, tuple)) else [value]
        return [convert_value(v, item, f"{where}[{i}]" if isinstance(value, (list, tuple)) else where) for i, v in enumerate(items)]
    if isinstance(value, (list, tuple, dict)):
        raise LRCError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        try:
            value = _scalar(value, type(choices[0]))
        except (TypeError, ValueError):
            pass
        if value not in choices:
            raise LRCError(f"{where}: {value!r} is not one of {', '.join(map(str, choices))}")
        return value
    if tp in (bool, int, float, str, Path):
        try:
            return _scalar(value, tp)
        except (TypeError, ValueError):
            raise LRCError(f"{where}: expected {_type_name(tp)}, got {value!r}") from None
    return value


def _scalar(value: Any, tp: type) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise TypeError
    if isinstance(value, bool):  # a flag's value where a number or a text belongs
        raise TypeError
    if tp is int:
        if isinstance(value, float):
            raise TypeError
        return int(value)
    if tp is float:
        return float(value)
    return tp(str(value))


def _type_name(tp: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a text", Path: "a path"}
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    if typing.get_origin(tp) in (list, tuple):
        return "a list"
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def build_args(cls: type[T], values: dict[str, Any], where: str) -> T:
    """``cls`` from option values as YAML read them (a workflow config's flag section), checked
    as the command would check them: unknown options, wrong types, and the dataclass's own
    validation, each an LRCError naming ``where`` and the key."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    converted = {}
    for key, value in values.items():
        if key not in fields:
            raise LRCError(f"{where}.{key}: not an option of this command")
        converted[key] = convert_value(value, hints[key], f"{where}.{key}")
    try:
        return cls(**converted)
    except (TypeError, ValueError, LRCError) as err:
        raise LRCError(f"{where}: {err}") from err


class _Captured(Exception):
    def __init__(self, cls: type):
        super().__init__(cls.__name__)
        self.cls = cls


_CAPTURE: contextvars.ContextVar[bool] = contextvars.ContextVar("lrc_options_capture", default=False)


def args_class(entry: Any) -> type:
    """The argument dataclass a command's entry point (``main(argv)``) parses: its call of
    :func:`parse_args` is stopped before parsing and reports the class. Nothing else of the
    command runs (an entry point's only work before parsing is its imports)."""
    token = _CAPTURE.set(True)
    try:
        entry([])
    except _Captured as captured:
        return captured.cls
    finally:
        _CAPTURE.reset(token)
    raise LRCError(f"{getattr(entry, '__qualname__', entry)} does not parse its options with lrc.options.parse_args")


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """Raise an LRCError naming ``name`` when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise LRCError(f"unknown {name} {value!r}; choose one of: {', '.join(map(str, choices))}")
