"""The Snakemake workflow: lint, dry runs of every shipped config and profile, the flags each
rule hands its command, refusal of a bad config, and an end-to-end run of the whole chain."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.helpers import command_options
from tests.workflow_helpers import COPY_IGNORE, ROOT, failure_report, job_counts, shell_commands, snakemake

PAPER = sorted((ROOT / "config" / "paper").glob("*.yaml"))


@pytest.mark.slow
def test_lint_is_clean():
    result = snakemake("--lint")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


@pytest.mark.slow
def test_default_dry_run_builds_the_tiny_chain():
    result = snakemake("-n", "--forceall", "results/table1.csv")
    assert result.returncode == 0, result.stderr
    counts = job_counts(result.stdout)
    assert counts["distill"] == 3 and counts["merge"] == 3 and counts["evaluate"] == 4
    assert counts["world"] == 1 and counts["pretrain"] == 1 and "download" not in counts


@pytest.mark.slow
@pytest.mark.parametrize("config", PAPER, ids=lambda p: p.stem)
def test_paper_config_builds_its_dag(config):
    result = snakemake("-n", "--forceall", "--configfile", config)
    assert result.returncode == 0, result.stderr
    (exp, x), = yaml.safe_load(config.read_text())["experiments"].items()
    d = x["distill"]
    runs = len(d["arms"]) * len(d.get("recipes", ["lrc"])) * len(d.get("seeds", [0])) * len(d["tokens"])
    counts = job_counts(result.stdout)
    assert counts["download"] == 1 and counts["distill"] == runs and counts["merge"] == runs
    assert counts["sft"] == len(x["sft"]["arms"]) and counts["table1"] == 1 and counts["table_sft"] == 1
    # --configfile replaces the built-in tiny world rather than merging into it.
    assert "world" not in counts and "pretrain" not in counts and "results/tiny/" not in result.stdout
    assert ("controls" in counts) == bool({"confined", "randcomp"} & set(d["arms"]))


@pytest.mark.slow
def test_slurm_profile_dry_run_shows_the_sbatch_resources():
    config = ROOT / "config" / "paper" / "llama3.2-3b.yaml"
    result = snakemake("--profile", "profiles/slurm", "-n", "--forceall", "results/table1.csv", "--configfile", config)
    assert result.returncode == 0, result.stderr
    blocks = result.stdout.split("rule ")
    distill = [b for b in blocks if b.startswith("distill:")]
    assert distill and all(re.search(r"resources: .*mem_mb=480000.*runtime=2880.*gpu=8", b) for b in distill)
    assert all("lrc_launch 8 config/accelerate/ddp.yaml distill" in b for b in distill)
    evaluate = [b for b in blocks if b.startswith("evaluate:")]
    assert evaluate and all(re.search(r"resources: .*gpu=1", b) for b in evaluate)


@pytest.mark.slow
@pytest.mark.parametrize("config", [ROOT / "config" / "config.yaml", *PAPER], ids=lambda p: p.stem)
def test_every_rule_hands_its_command_options_it_has(config):
    """Each `lrc <command>` line of a dry run uses only options that command accepts."""
    result = snakemake("-n", "-p", "--forceall", "--configfile", config)
    assert result.returncode == 0, result.stderr
    checked = 0
    for cmd in shell_commands(result.stdout):
        m = re.search(r"(?:\blrc|lrc_launch \d+ \S+) ([a-z][a-z-]*)\b(.*)", cmd)
        assert m, cmd
        command, rest = m[1], re.sub(r"\$\(ckpt_dir [^)]*\)", "", m[2])
        options = command_options(command)
        flags = {f.replace("-", "_") for f in re.findall(r"(?:^|\s)--([a-z][a-z0-9-]*)", rest)}
        flags = {f.removeprefix("no_") if f.removeprefix("no_") in options else f for f in flags}
        assert flags <= options, f"`lrc {command}` does not accept {sorted(flags - options)}: {cmd}"
        checked += 1
    assert checked


def test_bad_config_is_refused_before_any_job_with_the_key(tmp_path):
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["experiments"]["tiny"]["distill"]["arms"].append("wide")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    result = snakemake("--cores", "1", "results/table1.csv", "--directory", tmp_path, "--configfile", bad)
    assert result.returncode != 0
    message = result.stdout + result.stderr
    assert "invalid config at experiments.tiny.distill.arms.3: 'wide' is not one of" in message, message
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_dry_runs_do_not_depend_on_results_in_the_checkout(tmp_path):
    """The tests above count jobs with --forceall: a finished Quick start in the checkout
    (results/ present, nothing to do) leaves the counts unchanged."""
    config = ROOT / "config" / "config.yaml"
    (tmp_path / "results" / "tiny" / "teacher").mkdir(parents=True)
    (tmp_path / "results" / "table1.csv").write_text("model\n")
    fresh = job_counts(snakemake("-n", "--forceall", "results/table1.csv", "--configfile", config).stdout)
    done = job_counts(snakemake("-n", "--forceall", "results/table1.csv", "--directory", tmp_path,
                                "--configfile", config).stdout)
    assert fresh == done and fresh["distill"] == 3


def bad_config(tmp_path, edit, base="config.yaml"):
    config = yaml.safe_load((ROOT / "config" / base).read_text())
    (exp,) = config["experiments"]
    edit(config["experiments"][exp])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def refused(tmp_path, edit):
    """Run the bad config for real in an empty directory holding one earlier result: it must
    be refused before any job runs, and the earlier result must stay."""
    earlier = tmp_path / "results" / "tiny" / "warmstart" / "lrc" / "settings.json"
    earlier.parent.mkdir(parents=True)
    earlier.write_text("{}")
    result = snakemake("--cores", "1", "results/table1.csv", "--directory", tmp_path,
                       "--configfile", bad_config(tmp_path, edit))
    assert result.returncode != 0
    assert earlier.read_text() == "{}"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "results").rglob("*") if p.is_file()) == [
        "results/tiny/warmstart/lrc/settings.json"]
    assert not (tmp_path / "logs").exists()  # no job started
    return result.stdout + result.stderr


REFUSED = [
    ("distill.train.tokens", lambda x: x["distill"]["train"].update(tokens=1000),
     "the rule `distill` sets this option itself (`--tokens {wildcards.tokens}`)"),
    ("distill.train.seed", lambda x: x["distill"]["train"].update(seed=3),
     "the rule `distill` sets this option itself (`--seed {wildcards.seed}`)"),
    ("distill.train.arm", lambda x: x["distill"]["train"].update(arm="dense"),
     "the rule `distill` sets this option itself (`--arm {wildcards.arm}`)"),
    ("loss.lrc.arm", lambda x: x["loss"]["lrc"].update(arm="dense"),
     "the rule `distill` sets this option itself (`--arm {wildcards.arm}`)"),
    ("evaluate.model", lambda x: x["evaluate"].update(model="results/tiny/teacher"),
     "the rule `evaluate` sets this option itself (`--model {input.model}`)"),
    ("warmstart.student_hidden", lambda x: x["warmstart"].update(student_hidden=8),
     "the rule `warmstart` sets this option itself (`--student-hidden {params.hidden}`)"),
    ("distill.train.lrr", lambda x: x["distill"]["train"].update(lrr=0.1), "not an option of `lrc distill`"),
    ("distill.train.lr", lambda x: x["distill"]["train"].update(lr="fast"), "expected a number, got 'fast'"),
    ("student.hidden_size", lambda x: x["student"].update(hidden_size=128),
     "128 must be below the teacher's hidden size 128"),
    ("warmstart.tokens", lambda x: x["warmstart"].update(tokens=-5), "--tokens must be >= 0, got -5"),
    ("evaluate.suite", lambda x: x["evaluate"].update(suite="nope"), "'nope' is not one of tiny, paper"),
    ("resources.distill.accelerate", lambda x: x["resources"]["distill"].update(accelerate="x; touch PWNED"),
     "'x; touch PWNED' is not an existing file"),
]


@pytest.mark.slow
@pytest.mark.parametrize("key, edit, reason", REFUSED, ids=[k for k, *_ in REFUSED])
def test_bad_flag_section_is_refused_before_any_job_naming_the_key(tmp_path, key, edit, reason):
    message = refused(tmp_path, edit)
    assert f"invalid config at experiments.tiny.{key}: {reason}" in message, message
    assert not (tmp_path / "PWNED").exists() and not (ROOT / "PWNED").exists()


@pytest.mark.slow
def test_accelerate_config_is_quoted_in_the_command(tmp_path):
    crafted = tmp_path / "acc; touch PWNED $(id).yaml"
    crafted.write_text("{}")
    config = bad_config(tmp_path, lambda x: x["resources"]["distill"].update(gpu=1, accelerate=str(crafted)))
    result = snakemake("-n", "-p", "--forceall", "results/tiny/distill/lrc-dense-s0-t800000", "--configfile", config)
    assert result.returncode == 0, result.stderr
    (cmd,) = [c for c in shell_commands(result.stdout) if " distill " in c]
    words = shlex.split(cmd)
    assert words[words.index("lrc_launch") + 2] == str(crafted), cmd  # one word, not a command


def test_yaml_syntax_error_in_the_default_config_names_file_and_line(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(
        "experiments:\n  tiny:\n    teacher: {source: world\n    student: 3\n")
    result = snakemake("-n", "--snakefile", ROOT / "Snakefile", "--directory", tmp_path)
    assert result.returncode != 0
    assert "invalid config file config/config.yaml, line 4" in result.stdout + result.stderr, (
        result.stdout + result.stderr)


@pytest.mark.slow
def test_checkpoint_key_covers_the_student_width():
    """Every setting a training rule passes (beyond paths and the wildcards in the output path)
    reaches ckpt_dir's key: a changed student.hidden_size gives the warm start a new key."""
    def warmstart_key(hidden, tmp):
        config = bad_config(tmp, lambda x: x["student"].update(hidden_size=hidden))
        result = snakemake("-n", "-p", "--forceall", "results/tiny/warmstart/lrc", "--configfile", config)
        assert result.returncode == 0, result.stderr
        (cmd,) = [c for c in shell_commands(result.stdout) if " warmstart " in c]
        return re.search(r"\$\(ckpt_dir ([^)]*)\)", cmd)[1], cmd

    import tempfile

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        key64, cmd = warmstart_key(64, Path(a))
        key32, _ = warmstart_key(32, Path(b))
    assert key64 != key32 and "64" in shlex.split(key64)
    for flag, value in re.findall(r"--([a-z-]+) (\S+)", cmd.split("--ckpt-dir", 1)[0]):
        if not value.startswith("results/"):  # paths are hashed through their content
            assert value in key64 or value in cmd.split("/warmstart/", 1)[1].split()[0], (flag, value)


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_end_to_end_chain_on_the_test_world(tmp_path):
    """The whole chain on config/test.yaml in a copy of the repository: tables, audit, report;
    a re-run does nothing; new distill settings re-run distill and what follows it, not the
    teacher; a failing job leaves the earlier results in place."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=COPY_IGNORE)
    config = "config/test.yaml"
    exp = "tiny-test"

    run = snakemake("--cores", "2", "--configfile", config, cwd=repo, timeout=1200)
    assert run.returncode == 0, failure_report(run, repo)

    results = repo / "results"
    table1 = pd.read_csv(results / "table1.csv")
    assert list(table1["arm"]) == ["teacher", "slice", "dense", "core"]
    assert table1["aggregate"].notna().all() and table1["lm_eval_version"].notna().all()
    assert table1.loc[1:, "gain_over_slice"].notna().all()
    assert list(pd.read_csv(results / "table_sft.csv")["arm"]) == ["teacher", "core"]
    assert len(pd.read_csv(results / "audit.csv")) > 0
    for stage in ["teacher", "svd", "warmstart/lrc", "distill/lrc-core-s0-t20000", "merged/lrc-core-s0-t20000",
                  "sft/lrc-core-s0-t20000"]:
        assert (results / exp / stage / "settings.json").exists(), stage
    assert (results / exp / "merged/lrc-core-s0-t20000/merge_check.json").exists()
    assert (repo / "benchmarks" / exp / "distill" / "lrc-dense-s0-t20000.tsv").exists()

    rerun = snakemake("-n", "--configfile", config, cwd=repo)
    assert rerun.returncode == 0 and "Nothing to be done" in rerun.stdout + rerun.stderr, rerun.stdout

    changed = yaml.safe_load((repo / config).read_text())
    changed["experiments"][exp]["distill"]["train"]["lr"] = 0.002
    (repo / "changed.yaml").write_text(yaml.safe_dump(changed))
    plan = snakemake("-n", "--configfile", "changed.yaml", cwd=repo)
    counts = job_counts(plan.stdout)
    assert counts.get("distill") == 3 and counts.get("merge") == 3 and counts.get("table1") == 1, plan.stdout
    assert counts.get("evaluate") == 4  # three students and one SFT student, not the teacher
    assert not {"world", "tokenize", "pretrain", "svd", "warmstart", "audit"} & set(counts), counts

    report = snakemake("--report", "report.html", "--configfile", config, cwd=repo)
    assert report.returncode == 0, report.stderr
    assert (repo / "report.html").stat().st_size > 10_000

    # A value the config check can tell is wrong is refused before any job: the output stays.
    core = f"results/{exp}/distill/lrc-core-s0-t20000"
    changed["experiments"][exp]["distill"]["train"]["lr"] = "not-a-number"
    (repo / "broken.yaml").write_text(yaml.safe_dump(changed))
    refused = snakemake("--cores", "1", core, "--configfile", "broken.yaml", cwd=repo)
    assert refused.returncode != 0
    assert (f"invalid config at experiments.{exp}.distill.train.lr: expected a number, got 'not-a-number'"
            in refused.stdout + refused.stderr)
    assert (repo / core / "settings.json").exists()  # not deleted: no job ran

    # One only the job can find (a learning rate that blows the loss up): the job fails.
    changed["experiments"][exp]["distill"]["train"]["lr"] = 1000.0
    (repo / "broken.yaml").write_text(yaml.safe_dump(changed))
    # Target the one job, so which job fails first does not depend on scheduling order.
    failed = snakemake("--cores", "1", core, "--configfile", "broken.yaml", cwd=repo)
    assert failed.returncode != 0
    # the log says why, and what the run left behind
    log = (repo / f"logs/{exp}/distill/lrc-core-s0-t20000.log").read_text()
    assert re.search(r"(non-finite value|the loss diverged:) at step \d+", log) and "stopped without saving" in log, log
    assert not (repo / core).exists()  # no partial output
    for stage in ["teacher", "svd", "warmstart/lrc"]:  # earlier results are kept
        assert (results / exp / stage / "settings.json").exists(), stage

    # Snakemake forgets the flags of the slice and dense runs (trained at lr 0.003); with lr 0.002 it
    # re-trains only core (its output is gone), and the table refuses to mix the two learning rates.
    for arm in ("slice", "dense"):
        forget = snakemake("--cleanup-metadata", f"results/{exp}/distill/lrc-{arm}-s0-t20000", cwd=repo)
        assert forget.returncode == 0, forget.stderr
    changed["experiments"][exp]["distill"]["train"]["lr"] = 0.002
    (repo / "changed.yaml").write_text(yaml.safe_dump(changed))
    mixed = snakemake("--cores", "2", "results/table1.csv", "--configfile", "changed.yaml", cwd=repo)
    assert mixed.returncode != 0
    log = (repo / "logs/aggregate/table1.log").read_text()
    assert (f"lrc-slice-s0-t20000 was trained with lr = 0.003, but experiments.{exp}.distill.train.lr is 0.002"
            in log and "lrc-dense-s0-t20000 was trained with lr = 0.003" in log and "lrc-core" not in log), log


@pytest.mark.slow
def test_each_experiment_has_its_own_tables_beside_the_configs_combined_one():
    """With two experiments in one run, results/{exp}/table1.csv aggregates that experiment alone (a
    second config cannot overwrite it); results/table1.csv keeps the mission's combined table."""
    targets = ["results/tiny-test/table1.csv", "results/tiny/table1.csv", "results/table1.csv"]
    run = snakemake("-n", "-p", "--forceall", *targets, "--configfile", "config/config.yaml", "config/test.yaml")
    assert run.returncode == 0, run.stderr[-2000:]
    aggregates = {c.split("--out ")[1].split()[0]: c for c in shell_commands(run.stdout) if "lrc aggregate" in c}
    assert set(aggregates) == set(targets)
    for exp in ("tiny", "tiny-test"):
        inputs = aggregates[f"results/{exp}/table1.csv"].split("--inputs ")[1].split(" --")[0].split()
        assert inputs and all(i.startswith(f"results/{exp}/eval/") for i in inputs), inputs
    combined = aggregates["results/table1.csv"].split("--inputs ")[1].split(" --")[0].split()
    assert {i.split("/")[1] for i in combined} == {"tiny", "tiny-test"}
