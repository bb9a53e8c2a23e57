"""The Snakemake workflow: lint, dry runs of every shipped config and profile, the flags each
rule hands its command, refusal of a bad config, and an end-to-end run of the whole chain."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.helpers import command_options

ROOT = Path(__file__).resolve().parents[1]
PAPER = sorted((ROOT / "config" / "paper").glob("*.yaml"))


def snakemake(*args, cwd=ROOT, timeout=300):
    cmd = [sys.executable, "-m", "snakemake", *map(str, args)]
    # The rules run `python -m lrc.cli`: the python of this environment, activated or not.
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> number of jobs."""
    counts = {}
    table = output.split("Job stats:", 1)[1] if "Job stats:" in output else ""
    for line in table.splitlines()[3:]:
        m = re.fullmatch(r"(\w+)\s+(\d+)", line.strip())
        if not m:
            break
        counts[m[1]] = int(m[2])
    return counts


def shell_commands(output: str) -> list[str]:
    commands = [line.split("Shell command:", 1)[1].strip() for line in output.splitlines() if "Shell command:" in line]
    return [c for c in commands if c != "None"]  # rule all has none


def test_lint_is_clean():
    result = snakemake("--lint")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


def test_default_dry_run_builds_the_tiny_chain():
    result = snakemake("-n", "results/table1.csv")
    assert result.returncode == 0, result.stderr
    counts = job_counts(result.stdout)
    assert counts["distill"] == 3 and counts["merge"] == 3 and counts["evaluate"] == 4
    assert counts["world"] == 1 and counts["pretrain"] == 1 and "download" not in counts


@pytest.mark.parametrize("config", PAPER, ids=lambda p: p.stem)
def test_paper_config_builds_its_dag(config):
    result = snakemake("-n", "--configfile", config)
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


def test_slurm_profile_dry_run_shows_the_sbatch_resources():
    config = ROOT / "config" / "paper" / "llama3.2-3b.yaml"
    result = snakemake("--profile", "profiles/slurm", "-n", "results/table1.csv", "--configfile", config)
    assert result.returncode == 0, result.stderr
    blocks = result.stdout.split("rule ")
    distill = [b for b in blocks if b.startswith("distill:")]
    assert distill and all(re.search(r"resources: .*mem_mb=480000.*runtime=2880.*gpu=8", b) for b in distill)
    assert all("lrc_launch 8 config/accelerate/ddp.yaml distill" in b for b in distill)
    evaluate = [b for b in blocks if b.startswith("evaluate:")]
    assert evaluate and all(re.search(r"resources: .*gpu=1", b) for b in evaluate)


@pytest.mark.parametrize("config", [ROOT / "config" / "config.yaml", *PAPER], ids=lambda p: p.stem)
def test_every_rule_hands_its_command_options_it_has(config):
    """Each `lrc <command>` line of a dry run uses only options that command accepts."""
    result = snakemake("-n", "-p", "--configfile", config)
    assert result.returncode == 0, result.stderr
    checked = 0
    for cmd in shell_commands(result.stdout):
        m = re.search(r"(?:\blrc|lrc_launch \d+ \S+) ([a-z]+)\b(.*)", cmd)
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


# ----------------------------------------------------------------------------- end to end

COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".snakemake", "results", "logs", "benchmarks", "checkpoints", "__pycache__", ".pytest_cache", "*.egg-info", ".venv", "venv"
)


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
    assert run.returncode == 0, _failure(run, repo)

    results = repo / "results"
    table1 = pd.read_csv(results / "table1.csv")
    assert list(table1["arm"]) == ["teacher", "slice", "dense", "core"]
    assert table1["aggregate"].notna().all() and table1["lm_eval_version"].notna().all()
    assert table1.loc[1:, "gain_over_slice"].notna().all()
    assert list(pd.read_csv(results / "table_sft.csv")["arm"]) == ["teacher", "core"]
    assert len(pd.read_csv(results / "audit.csv")) > 0
    for stage in ["teacher", "svd", "warmstart/lrc", "distill/lrc-core-s0-t20000", "merged/lrc-core-s0-t20000", "sft/lrc-core-s0-t20000"]:
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

    changed["experiments"][exp]["distill"]["train"]["lr"] = "not-a-number"
    (repo / "broken.yaml").write_text(yaml.safe_dump(changed))
    # Target the one job, so which job fails first does not depend on scheduling order.
    core = f"results/{exp}/distill/lrc-core-s0-t20000"
    failed = snakemake("--cores", "1", core, "--configfile", "broken.yaml", cwd=repo)
    assert failed.returncode != 0
    assert "--lr" in (repo / f"logs/{exp}/distill/lrc-core-s0-t20000.log").read_text()  # the log names the option
    assert not (repo / core).exists()  # no partial output
    for stage in ["teacher", "svd", "warmstart/lrc"]:  # earlier results are kept
        assert (results / exp / stage / "settings.json").exists(), stage


def _failure(run, repo) -> str:
    logs = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted((repo / "logs").rglob("*.log")))
    return f"{run.stdout[-5000:]}\n{run.stderr[-5000:]}\n{logs}"
