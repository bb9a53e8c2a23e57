"""The workflow's config: which sections each rule hands its command as flags, and the checks
that refuse a bad config before any job runs (and so before Snakemake deletes any output).

`workflow/rules/common.smk` builds every rule's flags with :func:`rule_flags` and, once all
rules are defined, calls :func:`config_problems` with the rules' own shell commands. The
checks, per experiment and per job the config asks for:

* a key that the rule sets itself (``distill.train.tokens``: the rule passes ``--tokens
  {wildcards.tokens}`` and argparse would keep the config's, later value) is refused, naming
  the rule's own setting. What a rule sets is read from its shell command, the one place it is
  written, plus the options a rule builds in a params function (:data:`DYNAMIC`, passed in);
* every flag section is checked against its command's own argument dataclass (found through
  ``lrc.cli.COMMANDS``), constructed with the values the rule would pass: unknown options,
  wrong types and the dataclass's own validation (ranges, choices) are reported with the key;
* the student width against the teacher's, where the teacher's config is known before any job
  runs (the tiny world's sizes; a hub teacher's downloaded ``config.json`` or
  ``config/teachers/<experiment>.json``);
* ``resources.<stage>.accelerate`` names an existing file;
* values that only a job would refuse otherwise (:mod:`lrc.workflow.value_checks`): the student
  width against the teacher's heads, ``seq_len`` against its positions, batch sizes against the
  GPUs, budgets that buy no step, record fields and the document separator, where knowable.

It imports no Snakemake and nothing heavy at import time (commands are imported to find their
dataclasses when a check runs). The checks against the commands' dataclasses, and the width
check, live in :mod:`lrc.workflow.option_checks`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lrc.errors import LRCError
from lrc.names import RECIPES, parse_run_name, run_name
from lrc.options import read_yaml
from lrc.workflow.claims import all_claim_runs, claims_problems, included, varies_warmstart
from lrc.workflow.option_checks import build_problem, command_args_class, name_positionals, width_problems
from lrc.workflow.value_checks import value_problems

# The flag sections of each rule (rule name = `lrc` command name), in the order they are
# appended to its command line; "loss" stands for loss.<the job's recipe>.
RULE_SECTIONS: dict[str, tuple[tuple[str, ...], ...]] = {
    "world": (("world",),),
    "download": (("teacher", "hub"),),
    "import_teacher": (("teacher", "local"), ("teacher", "gguf")),  # the one the source names
    "tokenize": (("data", "{kind}"),),
    "pretrain": (("teacher", "pretrain"),),
    "svd": (("svd",),),
    "warmstart": (("warmstart",), ("loss", "{recipe}")),
    "distill": (("distill", "train"), ("loss", "{recipe}")),
    "merge": (("merge",),),
    "sft": (("sft", "train"),),
    "tasks": (("tasks",),),
    "evaluate": (("evaluate",),),
    "audit": (("audit",),),
    "probe": (("probe",),),
}
STAGES = tuple(RULE_SECTIONS)
# Rules that run another rule's command on other paths, with that rule's flags and resources.
RULE_ALIASES = {"warmstart_seeded": "warmstart", "knockout_audit": "audit", "heldout_tasks": "tasks"}
# teacher.source -> the rule that makes results/{exp}/teacher (the tiny world's: pretrain).
TEACHER_RULES = {"world": "pretrain", "hub": "download", "local": "import_teacher", "gguf": "import_teacher"}
RESOURCE_DEFAULTS = {"threads": 1, "gpu": 0, "mem_mb": 4000, "runtime": 60, "accelerate": "config/accelerate/ddp.yaml"}


def cli_flags(section: dict | None, sort: bool = True) -> str:
    """A config section as shell-quoted flags: {"lr": 1e-4, "clone_terms": ["q", "k"]} ->
    "--clone-terms q k --lr 0.0001"; booleans become --flag / --no-flag, None is left out. Keys
    are sorted, so reordering a config's keys changes no job's params (and re-runs nothing)."""
    parts = []
    items = sorted((section or {}).items()) if sort else (section or {}).items()
    for key, value in items:
        if value is None:
            continue
        name = key.replace("_", "-")
        flag = f"--{name}"
        if isinstance(value, bool):
            parts.append(flag if value else f"--no-{name}")
        elif isinstance(value, (list, tuple)):
            parts.append(" ".join([flag] + [shlex.quote(_text(v)) for v in value]))
        else:
            parts.append(f"{flag} {shlex.quote(_text(value))}")
    return " ".join(parts)


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def flag_sections(settings: dict, rule: str, **wildcards: str) -> list[tuple[str, dict]]:
    """(dotted key, flags) of each config section that ``rule`` hands its command."""
    out = []
    for keys in RULE_SECTIONS.get(RULE_ALIASES.get(rule, rule), ()):
        keys = tuple(k.format(**wildcards) for k in keys)
        node: Any = settings
        for key in keys:
            node = (node or {}).get(key) or {}
        out.append((".".join(keys), node))
    return out


def tokenize_options(world: bool, kind: str, world_dir: Any, teacher_dir: Any) -> dict[str, Any]:
    """The options the tokenize rule builds itself: the tiny world's text files and tokenizer,
    or a hub teacher's tokenizer (the config names the dataset as `source`). The chat set is
    always tokenised as chat (loss on answers)."""
    chat = {"chat": True} if kind == "sft" else {}
    if world:
        text = f"{world_dir}/{kind}"
        return {"tokenizer": f"{world_dir}/tokenizer", "source": f"{text}/train.jsonl",
                "valid_source": f"{text}/valid.jsonl", **chat}
    return {"tokenizer": str(teacher_dir), **chat}


def local_teacher_input(teacher: dict) -> str | None:
    """The file or directory a local (``local``/``gguf``) teacher is read from, for the rule's
    input (so a changed file re-runs the import); None when not known before the job (a
    package that is not installed: the job then names the problem)."""
    flags = teacher.get(teacher["source"]) or {}
    if flags.get("path") or flags.get("file"):
        return str(flags.get("path") or flags.get("file"))
    if flags.get("package"):
        # The same lookup as lrc.commands.import_teacher.packaged_gguf (a command: not importable here).
        from importlib import metadata

        try:
            files = [f for f in metadata.distribution(flags["package"]).files or [] if str(f).endswith(".gguf")]
        except metadata.PackageNotFoundError:
            return None
        return str(files[0].locate()) if len(files) == 1 else None
    return None


def fetch_task_options(settings: dict) -> dict[str, Any]:
    """`lrc fetch-tasks`'s options from the evaluate section, when its suite's datasets come from the
    hub (paper, lm-eval); None for an offline suite (nothing to fetch)."""
    section = settings.get("evaluate") or {}
    if section.get("suite") not in ("paper", "lm-eval"):
        return None
    return {k: section[k] for k in ("suite", "tasks", "include_path") if k in section}


def evaluate_options(world: bool, world_dir: Any) -> dict[str, Any]:
    """The options the evaluate rule builds itself: the tiny world's tasks."""
    return {"tasks_dir": f"{world_dir}/tasks"} if world else {}


def built_options(settings: dict, exp: str, rule: str, wildcards: dict[str, str]) -> dict[str, Any]:
    """The options ``rule`` builds in a params function (beside its shell command's), with the
    rule's input paths."""
    world = settings["teacher"]["source"] == "world"
    world_dir, teacher_dir = f"results/{exp}/world", f"results/{exp}/teacher"
    if rule == "tokenize":
        return tokenize_options(world, wildcards["kind"], world_dir, teacher_dir)
    if rule == "evaluate":
        return evaluate_options(world, world_dir)
    return {}


def expected_run_settings(settings: dict) -> dict[str, dict[str, Any]]:
    """recipe -> {dotted config key: value}: the flags every distillation of that recipe is given
    (`lrc aggregate --expect-settings` compares them with what each run recorded)."""
    return {recipe: {f"{dotted}.{key}": value for dotted, flags in flag_sections(settings, "distill", recipe=recipe)
                     for key, value in flags.items() if value is not None}
            for recipe in RECIPES}


def rule_flags(settings: dict, rule: str, **wildcards: str) -> str:
    """The flags ``rule`` appends to its command for one job: its sections' flags, in order."""
    return " ".join(filter(None, (cli_flags(flags) for _, flags in flag_sections(settings, rule, **wildcards))))


def resolve_shipped_files(config: dict, workdir: Path | str, repo: Path | str) -> None:
    """Make the config's file paths that name a file shipped with the workflow absolute, in place: a
    relative ``data.<kind>.mixture`` found in the checkout but not in ``workdir`` (where the jobs run).
    A project directory outside the checkout then uses the shipped mixtures by their usual names, and
    its own files of the same name win."""
    for settings in config["experiments"].values():
        for section in (settings.get("data") or {}).values():
            path = (section or {}).get("mixture")
            if path and not Path(path).is_absolute() and not (Path(workdir) / path).exists() \
                    and (Path(repo) / path).is_file():
                section["mixture"] = str(Path(repo) / path)


# The stages that hold the teacher in host memory, and how many fp32 copies of its weights at once
# (import: the source and the reloaded check; merge: the teacher, the student and the reloaded merge).
TEACHER_COPIES = {"import_teacher": 2.0, "svd": 1.5, "warmstart": 1.5, "distill": 1.5, "merge": 2.0,
                  "evaluate": 1.5, "audit": 1.5, "probe": 1.5}
BASE_MEM_MB = 2000  # the interpreter, torch and the libraries


def resource(settings: dict, stage: str, key: str, teacher_parameters: int | None = None) -> Any:
    """resources.<stage>.<key> of one experiment, or the default: for ``mem_mb`` of a stage that holds
    the teacher, scaled to the teacher's size when its parameter count is known (never below 4000)."""
    given = (settings.get("resources") or {}).get(stage, {}).get(key)
    if given is not None:
        return given
    if key == "mem_mb" and stage in TEACHER_COPIES and teacher_parameters:
        scaled = BASE_MEM_MB + TEACHER_COPIES[stage] * teacher_parameters * 4 / 2**20
        return max(RESOURCE_DEFAULTS["mem_mb"], int(math.ceil(scaled / 1000) * 1000))
    return RESOURCE_DEFAULTS[key]


def schema_problems(config: dict, schema_file: Path | str) -> list[str]:
    """Every violation of the config schema, each naming its key and the reason."""
    import jsonschema
    import yaml

    schema = yaml.safe_load(Path(schema_file).read_text())
    errors = jsonschema.Draft202012Validator(schema).iter_errors(config)
    return [
        f"at {'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}"
        for e in sorted(errors, key=lambda e: [str(p) for p in e.absolute_path])
    ]


def yaml_syntax_problem(path: Path | str) -> str | None:
    """A config file's YAML error, a key given twice in one mapping (YAML keeps the last silently) or
    text that is not UTF-8, naming the file and line (:func:`lrc.options.read_yaml`, the reader of an
    `lrc --config` file too); None if it reads, or if the file is missing (Snakemake's message says so)."""
    if not Path(path).is_file():
        return None
    try:
        read_yaml(path)
    except LRCError as err:
        return str(err)
    return None


# ------------------------------------------------------------------ what a rule sets itself

_COMMAND = re.compile(r"\blrc(?:_launch \S+ \S+)? ([a-z]+(?:-[a-z]+)*)\b(.*?)(?:>|$)")
_FLAG = re.compile(r"--([a-z][a-z0-9-]*)(?:\s+((?:\$\([^)]*\)|(?!--)\S)+))?")


def rule_options(shell: str) -> tuple[str, dict[str, str]]:
    """The `lrc` command a rule's shell command runs and the options it sets itself, each with
    its setting as written: ``{"arm": "{wildcards.arm}", "out": "{output}", ...}``; positional
    arguments come as ``"_positional": "{input.teacher} ..."``. ``{params.*}`` placeholders that
    expand to flags (the config sections) are not options the rule sets."""
    m = _COMMAND.search(shell)
    if m is None:
        raise LRCError(f"no `lrc <command>` in the shell command {shell!r}")
    command, rest = m[1], m[2]
    options: dict[str, str] = {}
    head = rest.split("--", 1)[0].split()
    positional = [t for t in head if not re.fullmatch(r"\{params\.\w+\}", t)]
    if positional:
        options["_positional"] = " ".join(positional)
    for flag, value in _FLAG.findall(rest):
        options[flag.replace("-", "_")] = value
    return command, options


# ------------------------------------------------------------------ the jobs a config asks for


@dataclasses.dataclass
class Job:
    """One job kind of one experiment: its rule and the wildcards that bear on its flags."""

    rule: str
    wildcards: dict[str, str]


def runs(settings: dict, arms: Iterable[str] | None = None) -> list[str]:
    """The distillation runs of an experiment (all its arms, or those among ``arms``)."""
    d = settings["distill"]
    chosen = d["arms"] if arms is None else [a for a in d["arms"] if a in arms]
    return [run_name(r, a, s, t)
            for r, a, s, t in itertools.product(d.get("recipes", ["lrc"]), chosen, d.get("seeds", [0]), d["tokens"])]


def sft_runs(settings: dict) -> list[str]:
    s = settings.get("sft") or {}
    if not s.get("enabled", True):
        return []
    return runs(settings, s.get("arms"))


def jobs(settings: dict) -> list[Job]:
    """One job per rule and distinct wildcards that bear on a check (not every evaluation)."""
    world = settings["teacher"]["source"] == "world"
    d = settings["distill"]
    out = [Job("world", {})] if world else []
    out.append(Job(TEACHER_RULES[settings["teacher"]["source"]], {}))
    out.append(Job("tokenize", {"kind": "corpus"}))
    if sft_runs(settings):
        out.append(Job("tokenize", {"kind": "sft"}))
    out.append(Job("svd", {}))
    distills = [{"recipe": r, "arm": a, "seed": str(s), "tokens": str(t)}
                for r, a, s, t in itertools.product(d.get("recipes", ["lrc"]), d["arms"], d.get("seeds", [0]),
                                                    d["tokens"])]
    distills += [{k: str(v) for k, v in parse_run_name(r).items() if k in ("recipe", "arm", "seed", "tokens")}
                 for r in all_claim_runs(settings)]
    for recipe in dict.fromkeys(w["recipe"] for w in distills):
        out.append(Job("warmstart", {"recipe": recipe}))
        if varies_warmstart(settings):
            out.append(Job("warmstart_seeded", {"recipe": recipe, "seed": "1"}))
    out += [Job("distill", w) for w in distills]
    out.append(Job("merge", {}))
    if sft_runs(settings):
        out.append(Job("sft", {}))
    out += [Job("evaluate", {"name": "teacher"}), Job("audit", {}), Job("probe", {})]
    return out + ([Job("knockout_audit", {})] if "knockout" in included(settings) else [])


# ------------------------------------------------------------------ the checks

# Placeholders of a rule's shell command that stand for config values, not paths.
def _placeholders(settings: dict, wildcards: dict[str, str]) -> dict[str, Any]:
    values = {f"wildcards.{k}": v for k, v in wildcards.items()}
    values["params.hidden"] = settings["student"]["hidden_size"]
    return values


def _resolve(setting: str, values: dict[str, Any]) -> Any:
    if setting == "":
        return True  # a flag without a value (--chat)
    m = re.fullmatch(r"\{([\w.]+)(?::q)?\}", setting)
    if m and m[1] in values:
        return values[m[1]]
    return setting  # a path (or a $(...) expansion): its text is a fine placeholder


def config_problems(
    config: dict,
    shells: dict[str, str],
    workdir: Path | str = ".",
    repo: Path | str | None = None,
) -> list[str]:
    """Every problem of a (schema-valid) workflow config, each naming its key: first the keys
    a rule sets itself, then the rest. ``shells``: rule name -> its shell command as written;
    relative paths resolve against ``workdir`` (where the jobs run), then ``repo``."""
    set_by_rule: list[str] = []
    problems: list[str] = []
    classes: dict[str, type] = {}
    for exp, settings in config["experiments"].items():
        seen: set[tuple] = set()
        for job in jobs(settings):
            if job.rule not in shells:
                continue
            command, sets = rule_options(shells[job.rule])
            sets |= {k: _shown(v) for k, v in built_options(settings, exp, job.rule, job.wildcards).items()}
            if command not in classes:
                classes[command] = command_args_class(command)
            sets = name_positionals(classes[command], sets)
            sections = [(f"experiments.{exp}.{where}", flags)
                        for where, flags in flag_sections(settings, job.rule, **job.wildcards)]
            set_by_rule += [p for p in _rule_set_keys(job.rule, sets, sections) if p not in set_by_rule]
            key = (job.rule, tuple(sorted(job.wildcards.items())))
            if key in seen:
                continue
            seen.add(key)
            values = {k: _resolve(v, _placeholders(settings, job.wildcards)) for k, v in sets.items()}
            problem = build_problem(classes[command], command, values, sections)
            if problem and problem not in problems:
                problems.append(problem)
        problems += claims_problems(exp, settings) + width_problems(exp, settings, classes, workdir)
        budgets = sorted({int(j.wildcards["tokens"]) for j in jobs(settings) if j.rule == "distill"})
        problems += [p for p in value_problems(exp, settings, classes, workdir, budgets) if p not in problems]
        problems += _accelerate_problems(exp, settings, [workdir] + ([repo] if repo is not None else []))
    return set_by_rule + problems


def _shown(value: Any) -> str:
    return "" if value is True else str(value)


def _rule_set_keys(rule: str, sets: dict[str, str], sections: list[tuple[str, dict]]) -> list[str]:
    problems = []
    owner: dict[str, str] = {}
    for where, flags in sections:
        for key in flags or {}:
            name = key.replace("-", "_")
            if name in sets:
                shown = f"--{name.replace('_', '-')} {sets[name]}".strip()
                problems.append(f"{where}.{key}: the rule `{rule}` sets this option itself (`{shown}`); "
                                "remove it from the config")
            elif name in owner:
                problems.append(f"{where}.{key}: also set in {owner[name]}.{key}; the job would use only one of "
                                "them, set it in one place")
            owner.setdefault(name, where)
    return problems


# ------------------------------------------------------------------ resources


def _accelerate_problems(exp: str, settings: dict, roots: list[Path | str]) -> list[str]:
    """The accelerate config of every stage listed under resources must be an existing file
    (the value becomes an argument of `accelerate launch`); relative to the working directory
    or the checkout, as `lrc_launch` resolves it."""
    problems = []
    for stage in settings.get("resources") or {}:
        value = resource(settings, stage, "accelerate")
        if not any((Path(root) / value).is_file() for root in roots):
            problems.append(f"experiments.{exp}.resources.{stage}.accelerate: {value!r} is not an existing file "
                            "(an accelerate config, e.g. config/accelerate/ddp.yaml)")
    return problems
