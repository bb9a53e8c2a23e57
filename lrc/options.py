"""Typed command options: keyword-only dataclasses parsed from flags or a YAML file.

Every command describes its options as a dataclass; :func:`parse_args` turns ``--field-name
value`` flags (and ``--config FILE.yaml``) into it; :func:`check_choice` checks a value against
its choices. The bottom layer of the package (it imports nothing from it but the error type).

It also guards outputs: a field declared with ``metadata={"output": "dir"}`` (a directory the
command replaces whole, through :func:`lrc.io.atomic.atomic_dir`) or ``{"output": "file"}`` is
checked here, before the command does any work: a writable place, and :func:`check_replaceable`.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import dataclasses
import os
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
    for title, names in _option_groups(cls, fields):
        group = parser if title == "options" else parser.add_argument_group(title)  # argparse's own section
        for name in names:
            _add_option(group, name, hints[name], fields[name])
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
    check_outputs(fields, values, command=prog, extra_inputs={"--config": config_file})
    _COMMAND.set(prog)
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise LRCError(f"{prog or cls.__name__}: {err}") from err


def _option_groups(cls: type, fields: dict[str, dataclasses.Field]) -> list[tuple[str, list[str]]]:
    """``--help``'s sections: the command's own options first (those its module declares), then one
    section per options class it takes from a library module (training, recipe, ...), named by it."""
    owner: dict[str, type] = {}
    for klass in reversed(cls.__mro__):  # a subclass that declares a field again owns it
        for name in vars(klass).get("__annotations__", {}):
            if name in fields:
                owner[name] = klass
    groups: dict[str, list[str]] = {}
    for name in fields:
        klass = owner.get(name, cls)
        own = klass.__module__ == cls.__module__
        title = "options" if own else f"{klass.__module__}.{klass.__name__}"
        groups.setdefault(title, []).append(name)
    return sorted(groups.items(), key=lambda item: item[0] != "options")


def _is_required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _add_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, tp: Any,
                f: dataclasses.Field) -> None:
    flag = "--" + name.replace("_", "-")
    flags = [flag] if "_" not in name else [flag, "--" + name]
    help_text = f.metadata.get("help", "")
    if f.metadata.get("positional"):
        # A positional argument may still be given as a flag (handy in YAML and rules).
        parser.add_argument(name + "_positional", metavar=name.upper(), nargs="?", type=_unwrap_optional(tp),
                            help=help_text)
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


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges are meant to be overridden
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice in one mapping (first on line {seen[key] + 1}); "
                                "YAML would keep only the last", key_node.start_mark)
            if isinstance(key, typing.Hashable):
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def read_yaml(path: str | os.PathLike, what: str = "config file") -> Any:
    """The data of a YAML file, read as UTF-8; an LRCError naming ``what`` and the file (and the line)
    for an unreadable file, text that is not UTF-8, a YAML error or a key given twice in one mapping."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise LRCError(f"cannot read {what} {path}: {err}") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise LRCError(f"invalid {what} {path}, line {line}: not UTF-8 text (byte 0x{raw[err.start]:02x}); "
                       "save it as UTF-8") from err
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        raise LRCError(f"invalid {what} {where}: {getattr(err, 'problem', None) or err}") from err


def _load_config_file(path: Path, fields: dict[str, dataclasses.Field], hints: dict[str, Any]) -> dict[str, Any]:
    data = read_yaml(path) or {}
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
        listed = isinstance(value, (list, tuple))
        return [convert_value(v, item, f"{where}[{i}]" if listed else where) for i, v in enumerate(items)]
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


# ---------------------------------------------------------------------------------------
# Outputs: a command replaces only a directory that lrc wrote

OUTPUT_MARKER = ".lrc-output"
"""The file :func:`lrc.io.atomic.atomic_dir` writes into every directory it creates; its first line
names the command. A directory holding it may be replaced by a new output; no other non-empty
directory is ever replaced. Hidden and extension-less, it is ignored by whatever reads an output
(Hugging Face loaders, token and task directories, ``*.yaml`` globs)."""

_COMMAND: contextvars.ContextVar[str | None] = contextvars.ContextVar("lrc_command", default=None)


def current_command() -> str | None:
    """The command (``"lrc merge"``) whose options :func:`parse_args` read last, or None."""
    return _COMMAND.get()


def marker_text(command: str | None) -> str:
    name = command or "lrc"
    return (f"{name}\nThis directory is an output of `{name}`. lrc replaces it on a rerun only while this file "
            "is in it, and refuses to replace a directory without it.\n")


def output_owner(path: str | os.PathLike) -> str | None:
    """The command named by the marker in directory ``path`` ("lrc" if it names none), or None: no marker."""
    try:
        return (Path(path) / OUTPUT_MARKER).read_text().partition("\n")[0].strip() or "lrc"
    except (OSError, UnicodeDecodeError):
        return None


def check_replaceable(path: str | os.PathLike, *, what: str = "output directory", command: str | None = None,
                      inputs: Sequence[tuple[str, Path]] = ()) -> None:
    """Raise an LRCError, naming ``what`` and ``path`` and saying why, unless a new output directory
    may replace ``path``: absent, an empty directory, or a directory holding lrc's marker (written
    by ``command`` when the marker and ``command`` both name one). Never the working directory, the
    git checkout lrc runs from, or a directory holding either; nor one holding (or being) an input
    of ``inputs`` (pairs of option and path), which the replacement would delete."""
    path = Path(path)
    absolute = Path(os.path.abspath(path))
    shown = f"{what} {path}" + ("" if str(path) == str(absolute) else f" ({absolute})")

    def refuse(why: str) -> LRCError:
        return LRCError(f"{shown}: refusing to replace this directory: {why}")

    place = _forbidden_place(path)
    if place is not None:
        raise refuse(place)
    for option, other in inputs:
        if _within(other, path):
            raise refuse(f"it holds {option} {other}, which the new output would delete")
    if not os.path.lexists(path):
        return
    if not path.is_dir():
        raise refuse("it is not a directory")
    try:
        empty = next(path.iterdir(), None) is None
    except OSError as err:
        raise refuse(f"it cannot be read ({err})") from err
    if empty:
        return
    owner = output_owner(path)
    if owner is None:
        raise refuse(f"it holds files that lrc did not write (it has no {OUTPUT_MARKER} marker), which the new "
                     f"output would delete. An output directory written by an earlier version of lrc has no marker "
                     f"either: if that is what it is, remove it yourself (rm -r {path}) and run again; otherwise "
                     f"choose another {what}.")
    if command and owner not in ("lrc", command):
        raise refuse(f"it is an output of `{owner}`, not of `{command}`. Remove it yourself (rm -r {path}) "
                     f"if it is to go, or choose another {what}.")


def check_outputs(fields: dict[str, dataclasses.Field], values: dict[str, Any], *, command: str | None = None,
                  extra_inputs: dict[str, Any] | None = None) -> None:
    """Check a command's outputs before it runs (:func:`parse_args` calls it). A field with
    ``metadata={"output": "dir"}`` names a directory the command replaces whole, checked by
    :func:`check_replaceable` against every other path of the options (and ``extra_inputs``,
    option -> path); with ``"parts": (names...)`` as well, the command replaces those
    subdirectories of it instead. ``{"output": "file"}``: a file written whole, which must not be a
    directory. ``values``: the options given (missing ones take their defaults)."""
    given = {"--" + n.replace("_", "-"): values[n] if n in values else _default(f) for n, f in fields.items()}
    paths = {option: _path_values(v) for option, v in (given | (extra_inputs or {})).items()}
    for name, f in fields.items():
        kind, option = f.metadata.get("output"), "--" + name.replace("_", "-")
        if kind not in (None, "dir", "file"):
            raise TypeError(f"{name}: output kind {kind!r} is neither 'dir' nor 'file'")
        for i, path in enumerate(paths[option] if kind else []):
            _check_writable(option, path)
            if kind == "file":
                if path.is_dir():
                    raise LRCError(f"{option} {path}: is a directory; {option} names a file to write")
                continue
            others = [(o, p) for o, ps in paths.items() for j, p in enumerate(ps) if (o, j) != (option, i)]
            parts = f.metadata.get("parts", ())
            if parts:
                place = _forbidden_place(path)
                if place is not None or (os.path.lexists(path) and not path.is_dir()):
                    raise LRCError(f"{option} {path}: refusing to write into it: {place or 'it is not a directory'}")
            for target in [path / part for part in parts] or [path]:
                check_replaceable(target, what=option, command=command, inputs=others)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def _check_writable(option: str, path: Path) -> None:
    """A read-only place is refused now, not after the work: the nearest existing folder above ``path``."""
    folder = Path(os.path.abspath(path)).parent
    while not folder.exists():
        folder = folder.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise LRCError(f"{option} {path}: cannot write there: {folder} is not writable")


def _path_values(value: Any) -> list[Path]:
    """The paths an option's value names: a Path, a text naming an existing file or directory, or a list of them."""
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in _path_values(v)]
    if isinstance(value, Path):
        return [value]
    if isinstance(value, str) and value and os.path.lexists(value):
        return [Path(value)]
    return []


def _forms(path: Path) -> set[Path]:
    """``path`` made absolute as written (``a/link/..`` is ``a``) and with its links resolved."""
    forms = {Path(os.path.abspath(path))}
    with contextlib.suppress(OSError, RuntimeError):  # a link loop: the written form alone
        forms.add(path.resolve())
    return forms


def _within(inner: Path, outer: Path) -> bool:
    return any(i.is_relative_to(o) for i in _forms(inner) for o in _forms(outer))


def _checkout() -> Path | None:
    """The git checkout this package runs from (the directory holding ``lrc/``), if it is one."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / ".git").exists() else None


def _forbidden_place(path: Path) -> str | None:
    """Why ``path`` may never be replaced by an output (the working directory, the checkout, or
    a directory holding either), or None."""
    places = [(Path.cwd(), "the current working directory")]
    checkout = _checkout()
    if checkout is not None:
        places.append((checkout, f"the git checkout lrc runs from ({checkout})"))
    for place, name in places:
        for form in _forms(path):
            if any(form == p for p in _forms(place)):
                return f"it is {name}"
            if any(p.is_relative_to(form) for p in _forms(place)):
                return f"it holds {name}"
    return None
