# Shared by every rule: the config's validation, the names and wildcards, each rule's flags and
# resources, what a config asks for, and the input functions. The logic lives in lrc (names:
# lrc.names; config sections -> flags and the checks before any job runs: lrc.workflow.config).

import functools
import json
import re
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from lrc.workflow import claims
from lrc.workflow import config as wc
from lrc.errors import LRCError
from lrc.names import ARMS, CONTROL_ARMS, KNOCKOUT_SUFFIX, MAIN_ARMS, RECIPES, RUN_FORMAT, SFT_SUFFIX
from lrc.workflow.claims import CLAIMS
from lrc.workflow.revisions import floating_revisions
from lrc.workflow.value_checks import teacher_parameters as teacher_parameter_count

# ---------------------------------------------------------------- validation


# Refuse a bad config before any job runs; then let Snakemake's validate fill in the schema's
# defaults. The flag sections are checked against the commands once the rules are defined
# (check_flag_sections, called from the Snakefile).
SCHEMA_FILE = Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml"
if problems := wc.schema_problems(config, SCHEMA_FILE):
    raise WorkflowError("\n".join(f"invalid config {p}" for p in problems))
validate(config, "../schemas/config.schema.yaml")
wc.resolve_shipped_files(config, Path.cwd(), Path(workflow.basedir))  # run from a project directory too


def check_flag_sections():
    """Refuse keys a rule sets itself, unknown options, wrong types and out-of-range values of
    the flag sections, a student as wide as its teacher and a missing accelerate file."""
    shells = {r.name: r.shellcmd for r in workflow.rules if r.shellcmd and "lrc" in r.shellcmd}
    try:
        problems = wc.config_problems(config, shells, workdir=Path.cwd(), repo=REPO)
    except LRCError as err:
        problems = [str(err)]
    if problems:
        raise WorkflowError("\n".join(f"invalid config at {p}" for p in problems))
    for warning in floating_revisions(config, workdir=Path.cwd(), repo=REPO):
        print(f"warning: {warning}", file=sys.stderr)


# ---------------------------------------------------------------- names, constants, wildcards

EXPS = config["experiments"]
REPO = Path(workflow.basedir).resolve()
RUN = RUN_FORMAT

# Every rule's shell command starts with the helpers `lrc`, `lrc_launch` and `ckpt_dir`.
shell.prefix(
    f"export LRC_REPO={shlex.quote(str(REPO))}; "
    f"source {shlex.quote(str(REPO / 'workflow/scripts/shell_helpers.sh'))}; "
)


wildcard_constraints:
    exp="[^/]+",
    recipe="|".join(RECIPES),
    arm="|".join(ARMS),
    seed=r"\d+",
    tokens=r"\d+",


def settings(exp):
    """The validated settings of one experiment."""
    return EXPS[exp]


def is_world(exp):
    return settings(exp)["teacher"]["source"] == "world"


# ---------------------------------------------------------------- flags and resources


def flags_of(rule_name):
    """A params function: the flags of the config sections the rule hands its command."""
    return lambda wildcards: wc.rule_flags(settings(wildcards.exp), rule_name, **dict(wildcards.items()))


def student_hidden(wildcards):
    return settings(wildcards.exp)["student"]["hidden_size"]


@functools.cache
def teacher_parameters(exp):
    return teacher_parameter_count(exp, settings(exp), Path.cwd())


def resource(stage, key):
    """A resources function: experiments/{exp}/resources/{stage}/{key}, or the default (memory:
    scaled to the teacher's size where its config is known)."""

    def value(wildcards):
        exp = getattr(wildcards, "exp", None)
        if not exp:
            return wc.resource({}, stage, key)
        count = teacher_parameters(exp) if key == "mem_mb" and stage in wc.TEACHER_COPIES else None
        return wc.resource(settings(exp), stage, key, count)

    return value


# Options a rule builds in a params function (lrc.workflow.config refuses them in the config).
def tokenize_paths(wildcards, input):
    options = wc.tokenize_options(is_world(wildcards.exp), wildcards.kind, input.get("world"), input.get("teacher"))
    return wc.cli_flags(options, sort=False)


def eval_tasks(wildcards, input):
    if builds_tasks(wildcards.exp):
        return wc.cli_flags({"tasks_dir": input.tasks})
    return wc.cli_flags(wc.evaluate_options(is_world(wildcards.exp), input.get("world")), sort=False)


def fetch_tasks_flags(wildcards):
    return wc.cli_flags(wc.fetch_task_options(settings(wildcards.exp)), sort=False)


def builds_tasks(exp):
    """`evaluate: {suite: local}` with no tasks_dir of its own (not the tiny world): the workflow
    builds results/{exp}/tasks from the held-out corpus split (rule heldout_tasks, `lrc tasks`)."""
    section = settings(exp).get("evaluate") or {}
    return not is_world(exp) and section.get("suite") == "local" and not section.get("tasks_dir")


# ---------------------------------------------------------------- what a config asks for


def runs(exp, arms=None):
    return wc.runs(settings(exp), arms)


def sft_runs(exp):
    return wc.sft_runs(settings(exp))


def expected_settings(wildcards=None):
    """What every distillation of each experiment was given, for `lrc aggregate --expect-settings`."""
    return shlex.quote(json.dumps({exp: wc.expected_run_settings(settings(exp)) for exp in EXPS}, sort_keys=True))


def table_experiments(wildcards=None):
    """The experiments of a table: the one its path names (results/{exp}/<table>.csv), else the config's all."""
    exp = getattr(wildcards, "exp", None)
    return [exp] if exp else list(EXPS)


def table1_inputs(wildcards=None):
    out = []
    for exp in table_experiments(wildcards):
        out.append(f"results/{exp}/eval/teacher.json")
        out += [f"results/{exp}/eval/{r}.json" for r in runs(exp, MAIN_ARMS)]
    return out


def controls_inputs(wildcards=None):
    out = []
    for exp in table_experiments(wildcards):
        if any(a in CONTROL_ARMS for a in settings(exp)["distill"]["arms"]):
            out.append(f"results/{exp}/eval/teacher.json")
            out += [f"results/{exp}/eval/{r}.json" for r in runs(exp)]
    return out


def sft_inputs(wildcards=None):
    out = []
    for exp in table_experiments(wildcards):
        if sft_runs(exp):
            out.append(f"results/{exp}/eval/teacher.json")
            out += [f"results/{exp}/eval/{r}{SFT_SUFFIX}.json" for r in sft_runs(exp)]
    return out


# The tables of one experiment (results/{exp}/<table>.csv): their inputs and `lrc aggregate --table`.
EXPERIMENT_TABLES = {"table1": (table1_inputs, "table1"), "table_sft": (sft_inputs, "sft"),
                     "controls": (controls_inputs, "controls")}


def several_budgets():
    return any(len(settings(e)["distill"]["tokens"]) > 1 for e in EXPS)


def final_targets():
    out = ["results/table1.csv", "results/audit.csv"]
    if sft_inputs():
        out.append("results/table_sft.csv")
    if controls_inputs():
        out.append("results/controls.csv")
    if several_budgets():
        out += ["results/token_efficiency.png", "results/token_efficiency.pdf"]
    return out


# ---------------------------------------------------------------- input functions


def exp_pattern(hub=None, *, sources=None):
    """A regex matching exactly the experiments whose teacher.source is among ``sources``
    (``hub=True``: the hub's; ``hub=False``: the tiny world's)."""
    sources = sources or (("hub",) if hub else ("world",))
    names = [re.escape(e) for e in EXPS if settings(e)["teacher"]["source"] in sources]
    return "|".join(names) if names else "(?!)"


def local_teacher_input(wildcards):
    path = wc.local_teacher_input(settings(wildcards.exp)["teacher"])
    return {"source": path} if path else {}


def tokenize_source(wildcards):
    if is_world(wildcards.exp):
        return {"world": f"results/{wildcards.exp}/world"}
    inputs = {"teacher": f"results/{wildcards.exp}/teacher"}
    mixture = settings(wildcards.exp)["data"][wildcards.kind].get("mixture")
    if mixture:  # an input, so editing the mixture file re-runs the tokenisation
        inputs["mixture"] = mixture
    return inputs


RUN_PATTERN = RUN_FORMAT.format(recipe=f"({'|'.join(RECIPES)})", arm=f"({'|'.join(ARMS)})", seed=r"\d+", tokens=r"\d+")
EVAL_NAME = f"teacher|{RUN_PATTERN}({re.escape(SFT_SUFFIX)}|{re.escape(KNOCKOUT_SUFFIX)})?"


def eval_inputs(wildcards):
    exp, name = wildcards.exp, wildcards.name
    if name == "teacher":
        model = f"results/{exp}/teacher"
    elif name.endswith(SFT_SUFFIX):
        model = f"results/{exp}/sft/{name.removesuffix(SFT_SUFFIX)}"
    elif name.endswith(KNOCKOUT_SUFFIX):
        model = f"results/{exp}/knockout/{name.removesuffix(KNOCKOUT_SUFFIX)}"
    else:
        model = f"results/{exp}/merged/{name}"
    inputs = {
        "model": model,
        "teacher": f"results/{exp}/teacher",
        "data": f"results/{exp}/data/corpus",
    }
    if is_world(exp):
        inputs["world"] = f"results/{exp}/world"
    if builds_tasks(exp):
        inputs["tasks"] = f"results/{exp}/tasks"
    if wc.fetch_task_options(settings(exp)) is not None:  # the datasets fetched where the network is
        inputs["fetched"] = f"results/{exp}/eval_tasks.json"
    return inputs


def warmstart_input(wildcards):
    """The warm start a distillation continues from (one per seed with claims.vary_warmstart)."""
    return claims.warmstart_dir(wildcards.exp, settings(wildcards.exp), wildcards.recipe, wildcards.seed)


# ---------------------------------------------------------------- the claims (claims.smk)

CLAIM_EXPS = [e for e in EXPS if claims.has_claims(settings(e))]
# the claims some experiment asks for (claims.include): the summary's inputs
CLAIMS_ASKED = [c for c in CLAIMS if any(c in claims.included(settings(e)) for e in CLAIM_EXPS)]


def claim_inputs(claim):
    """An input function of claim_<claim> (claims.smk), its files in every experiment with a
    claims section (refused, naming the section, when there is none)."""

    def inputs(wildcards=None):
        if not CLAIM_EXPS:
            raise WorkflowError(f"results/claims/{claim}.csv needs an experiment with a `claims` section (see config/config.yaml)")
        if claim not in CLAIMS_ASKED:
            raise WorkflowError(f"results/claims/{claim}.csv: no experiment's claims.include names {claim}")
        return [path for exp in CLAIM_EXPS for path in claims.claim_inputs(exp, settings(exp), claim)]

    return inputs


def claims_summary_inputs(wildcards=None):
    """The claim tables results/claims.md summarises: those some experiment's claims section asks for."""
    if not CLAIM_EXPS:
        raise WorkflowError("results/claims.md needs an experiment with a `claims` section (see config/config.yaml)")
    return expand("results/claims/{claim}.csv", claim=CLAIMS_ASKED)


def update_energy_files(wildcards, input):
    """The coordinates claim's inputs are distill directories; it reads their update_energy.csv."""
    return " ".join(shlex.quote(f"{d}/update_energy.csv") for d in input)
