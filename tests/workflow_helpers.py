"""Running the Snakemake workflow from the tests and reading what it prints (test_workflow,
test_claims_workflow, test_evaluate_workflow, test_slurm), and the default config and the rules'
shell commands the config checks read (test_workflow_config, test_recompute, test_teacher_recompute)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

# What a copy of the repository for an end-to-end run leaves out.
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".snakemake", "results", "logs", "benchmarks", "checkpoints", "__pycache__", ".pytest_cache", "*.egg-info",
    ".venv", "venv"
)


def snakemake(*args, cwd=ROOT, timeout=300):
    cmd = [sys.executable, "-m", "snakemake", *map(str, args)]
    # The rules run `python -m lrc.cli`: the python of this environment, activated or not.
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                        "HF_HUB_OFFLINE": "1"}
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


def failure_report(run, repo) -> str:
    """A failed run's output tails and every job log of the repository copy ``repo``."""
    logs = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted((repo / "logs").rglob("*.log")))
    return f"{run.stdout[-5000:]}\n{run.stderr[-5000:]}\n{logs}"


def default_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def rule_shells() -> dict[str, str]:
    """Each rule's shell command as written in workflow/rules/*.smk (joined string pieces)."""
    shells = {}
    for path in (ROOT / "workflow" / "rules").glob("*.smk"):
        for name, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", path.read_text(),
                                     flags=re.DOTALL | re.MULTILINE):
            if "shell:" in body:
                pieces = re.findall(r'^\s+"(.*)"\s*$', body.split("shell:", 1)[1], flags=re.MULTILINE)
                shells[name] = "".join(pieces)
    return shells
