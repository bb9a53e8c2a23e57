"""The test config's chain on a real single-node SLURM cluster, through `--profile profiles/slurm`.

Opt-in (`pytest -m slurm`; the default run deselects it): it needs root for
`scripts/slurm-local start`, which installs (apt, once) and starts munge, slurmctld and slurmd
on this machine, localhost only. Every rule of config/test.yaml then runs as its own sbatch
job (the SLURM executor plugin; `srun` inside each job), in a copy of the repository. The
local cluster has no accounting database, so jobs are followed with `squeue` (the plugin's
`--slurm-status-command squeue`) and submitted without an account (`--slurm-no-account`);
the profile itself is the real cluster's, unchanged. About 10-15 minutes on two cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.workflow_helpers import COPY_IGNORE, ROOT

pytestmark = pytest.mark.slurm

# Local-cluster settings given on the command line; the profile is left as the cluster's.
LOCAL_FLAGS = ["--slurm-status-command", "squeue", "--slurm-no-account", "--slurm-init-seconds-before-status-checks",
               "5", "--seconds-between-status-checks", "5", "--latency-wait", "10", "--jobs", "2",
               "--slurm-keep-successful-logs"]


def cluster_up() -> bool:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%a %T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and any(s.startswith("up ") and s.split()[1].startswith(("idle", "mix", "alloc"))
                                       for s in out.stdout.splitlines())


@pytest.fixture(scope="module")
def slurm():
    if not cluster_up():
        if os.geteuid() != 0:
            pytest.skip("no SLURM cluster up, and starting one (scripts/slurm-local start) needs root")
        subprocess.run([str(ROOT / "scripts" / "slurm-local"), "start"], check=True, timeout=900)
    assert cluster_up(), "scripts/slurm-local start did not bring the node up"


def test_test_chain_through_the_slurm_profile(slurm, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=COPY_IGNORE)
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                        "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", *LOCAL_FLAGS, "results/table1.csv",
           "--configfile", "config/test.yaml"]
    run = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=2400, env=env)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    stats = log.split("Job stats:", 1)[1].split("\n\n", 1)[0] if "Job stats:" in log else ""
    submitted = [line for line in log.splitlines() if "has been submitted with SLURM jobid" in line]
    jobs = sum(int(line.split()[-1]) for line in stats.splitlines()[3:]
               if line.split() and line.split()[-1].isdigit() and line.split()[0] != "total")
    print("Job stats:" + stats)
    print(f"{len(submitted)} sbatch submissions, e.g. {submitted[0].strip() if submitted else None}")
    print("\n".join(log.splitlines()[-4:]))
    assert jobs > 10 and len(submitted) == jobs  # every job went through sbatch
    table1 = pd.read_csv(repo / "results" / "table1.csv")
    print(table1.to_string())
    assert list(table1["arm"]) == ["teacher", "slice", "dense", "core"]
    assert table1["aggregate"].notna().all() and table1.loc[1:, "gain_over_slice"].notna().all()
    # Every job ran under SLURM: the plugin keeps one log directory per rule and job.
    slurm_logs = list((repo / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert any("distill" in str(p) for p in slurm_logs), slurm_logs[:5]
