# Shared helpers: config validation, paths, run names, config sections -> command-line flags.

import itertools
import re
import shlex
from pathlib import Path

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate


# Refuse a bad config before any job runs, naming every offending key and the reason; then let
# Snakemake's validate fill in the schema's defaults.
def config_errors(config, schema_file):
    schema = yaml.safe_load(Path(schema_file).read_text())
    errors = jsonschema.Draft202012Validator(schema).iter_errors(config)
    return [
        f"at {'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}"
        for e in sorted(errors, key=lambda e: [str(p) for p in e.absolute_path])
    ]


SCHEMA_FILE = Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml"
if problems := config_errors(config, SCHEMA_FILE):
    raise WorkflowError("invalid config " + "\ninvalid config ".join(problems))
validate(config, "../schemas/config.schema.yaml")


EXPS = config["experiments"]
ARM_PATTERN = "slice|dense|core|confined|randcomp"
MAIN_ARMS = ("slice", "dense", "core")
CONTROL_ARMS = ("confined", "randcomp")
REPO = Path(workflow.basedir).resolve()

# Every rule's shell command starts with the helpers `lrc`, `lrc_launch` and `ckpt_dir`.
shell.prefix(
    f"export LRC_REPO={shlex.quote(str(REPO))}; "
    f"source {shlex.quote(str(REPO / 'workflow/scripts/shell_helpers.sh'))}; "
)


wildcard_constraints:
    exp="[^/]+",
    recipe="lrc|kl",
    arm=ARM_PATTERN,
    seed=r"\d+",
    tokens=r"\d+",


RUN = "{recipe}-{arm}-s{seed}-t{tokens}"


def run_name(recipe, arm, seed, tokens):
    return RUN.format(recipe=recipe, arm=arm, seed=seed, tokens=tokens)


def cli_args(section):
    """A config section as shell-quoted flags: {"lr": 1e-4, "clone_terms": ["q", "k"]} ->
    "--clone-terms q k --lr 0.0001"; booleans become --flag / --no-flag, None is left out. Keys
    are sorted, so reordering a config's keys changes no job's params (and re-runs nothing)."""
    parts = []
    for key, value in sorted((section or {}).items()):
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


def _text(value):
    return str(value).lower() if isinstance(value, bool) else str(value)


def X(exp):
    """The validated settings of one experiment."""
    return EXPS[exp]


def section(*keys):
    """A params function: the flags of config section experiments/{exp}/<keys...>."""

    def flags(wildcards):
        node = X(wildcards.exp)
        for key in keys:
            node = node.get(key, {})
        return cli_args(node)

    return flags


def recipe_flags(wildcards):
    return cli_args(X(wildcards.exp).get("loss", {}).get(wildcards.recipe))


def warmstart_flags(wildcards):
    return " ".join(filter(None, [cli_args(X(wildcards.exp)["warmstart"]), recipe_flags(wildcards)]))


def distill_flags(wildcards):
    return " ".join(filter(None, [cli_args(X(wildcards.exp)["distill"].get("train")), recipe_flags(wildcards)]))


# Resources come from experiments/{exp}/resources/{stage}, with the schema's defaults.
RESOURCE_DEFAULTS = {"threads": 1, "gpu": 0, "mem_mb": 4000, "runtime": 60, "accelerate": "config/accelerate/ddp.yaml"}


def res(stage, key):
    def value(wildcards):
        exp = getattr(wildcards, "exp", None)
        per_stage = X(exp).get("resources", {}).get(stage, {}) if exp else {}
        return per_stage.get(key, RESOURCE_DEFAULTS[key])

    return value


# ---------------------------------------------------------------- what a config asks for


def runs(exp, arms=None):
    d = X(exp)["distill"]
    arms = d["arms"] if arms is None else [a for a in d["arms"] if a in arms]
    return [
        run_name(r, a, s, t)
        for r, a, s, t in itertools.product(d["recipes"], arms, d["seeds"], d["tokens"])
    ]


def sft_runs(exp):
    s = X(exp).get("sft", {})
    if not s.get("enabled", True):
        return []
    return runs(exp, s.get("arms"))


def table1_inputs(wildcards=None):
    out = []
    for exp in EXPS:
        out.append(f"results/{exp}/eval/teacher.json")
        out += [f"results/{exp}/eval/{r}.json" for r in runs(exp, MAIN_ARMS)]
    return out


def controls_inputs(wildcards=None):
    out = []
    for exp in EXPS:
        if any(a in CONTROL_ARMS for a in X(exp)["distill"]["arms"]):
            out.append(f"results/{exp}/eval/teacher.json")
            out += [f"results/{exp}/eval/{r}.json" for r in runs(exp)]
    return out


def sft_inputs(wildcards=None):
    out = []
    for exp in EXPS:
        if sft_runs(exp):
            out.append(f"results/{exp}/eval/teacher.json")
            out += [f"results/{exp}/eval/{r}.sft.json" for r in sft_runs(exp)]
    return out


def several_budgets():
    return any(len(X(e)["distill"]["tokens"]) > 1 for e in EXPS)


def final_targets():
    out = ["results/table1.csv", "results/audit.csv"]
    if sft_inputs():
        out.append("results/table_sft.csv")
    if controls_inputs():
        out.append("results/controls.csv")
    if several_budgets():
        out += ["results/token_efficiency.png", "results/token_efficiency.pdf"]
    return out


def is_world(exp):
    return X(exp)["teacher"]["source"] == "world"


def exp_pattern(hub):
    """A regex matching exactly the experiments whose teacher comes from the hub (or not)."""
    names = [re.escape(e) for e in EXPS if is_world(e) != hub]
    return "|".join(names) if names else "(?!)"


def tokenize_source(wildcards):
    if is_world(wildcards.exp):
        return {"world": f"results/{wildcards.exp}/world"}
    inputs = {"teacher": f"results/{wildcards.exp}/teacher"}
    mixture = X(wildcards.exp)["data"][wildcards.kind].get("mixture")
    if mixture:  # an input, so editing the mixture file re-runs the tokenisation
        inputs["mixture"] = mixture
    return inputs


def tokenize_paths(wildcards, input):
    """The tiny world's text files and tokenizer; a hub teacher's tokenizer (the config names
    the dataset as `source`). The chat set is always tokenised as chat (loss on answers)."""
    chat = " --chat" if wildcards.kind == "sft" else ""
    if is_world(wildcards.exp):
        text = f"{input.world}/{wildcards.kind}"
        return (
            f"--tokenizer {input.world}/tokenizer --source {text}/train.jsonl"
            f" --valid-source {text}/valid.jsonl{chat}"
        )
    return f"--tokenizer {input.teacher}{chat}"


EVAL_NAME = rf"teacher|(lrc|kl)-({ARM_PATTERN})-s\d+-t\d+(\.sft)?"


def eval_inputs(wildcards):
    exp, name = wildcards.exp, wildcards.name
    if name == "teacher":
        model = f"results/{exp}/teacher"
    elif name.endswith(".sft"):
        model = f"results/{exp}/sft/{name.removesuffix('.sft')}"
    else:
        model = f"results/{exp}/merged/{name}"
    inputs = {
        "model": model,
        "teacher": f"results/{exp}/teacher",
        "data": f"results/{exp}/data/corpus",
    }
    if is_world(exp):
        inputs["world"] = f"results/{exp}/world"
    return inputs


def eval_tasks(wildcards, input):
    return f"--tasks-dir {input.world}/tasks" if "world" in input.keys() else ""
