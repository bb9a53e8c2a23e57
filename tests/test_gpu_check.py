"""scripts/gpu-check runs end to end in its dry mode (`--device cpu`, tiny widths), in this
environment (`--no-venv`): bench of plain KD and two arms (their planned peaks, core/dense), svd,
the merge round trip, the CSV and the table; a small budget makes it skip the all-layers stage,
and the skip is in the CSV."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_mode_on_the_cpu(tmp_path):
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [str(REPO / "scripts" / "gpu-check"), "--device", "cpu", "--no-venv", "--out", str(tmp_path / "out"),
           "--budget-s", "30", "--arms", "dense", "core"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "out" / "gpu-check.csv")))
    bench = {r["arm"]: r for r in rows if r["stage"] == "bench"}
    assert set(bench) == {"kd", "dense", "core"} and all(r["status"] == "ok" and r["layers"] == "2"
                                                         for r in bench.values())
    assert all(float(r["tokens_per_s"]) > 0 and float(r["peak_memory_mib"]) > 0 for r in bench.values())
    assert bench["kd"]["mfu"] == ""  # no GPU peak to divide by
    # the planner's prediction beside the measured peak: for the arm, not for plain KD (no plan)
    assert float(bench["core"]["planned_peak_mib"]) > 0 and float(bench["core"]["peak_vs_plan"]) > 0
    assert bench["kd"]["planned_peak_mib"] == "" and bench["kd"]["peak_vs_plan"] == ""
    ratio = float(bench["core"]["step_time_ms"]) / float(bench["dense"]["step_time_ms"])
    assert (float(bench["core"]["time_ratio_to_dense"]) == pytest.approx(ratio, rel=1e-3)
            and float(bench["dense"]["time_ratio_to_dense"]) == 1.0)
    stages = {r["stage"]: r for r in rows}
    assert stages["svd"]["status"] == "ok"
    assert stages["merge"]["status"] == "ok" and float(stages["merge"]["max_abs_diff"]) <= 1e-5
    assert any(r["stage"] == "bench-4l-b" and r["status"].startswith("skipped") for r in rows)  # the budget held
    assert "stage" in proc.stdout and "wrote" in proc.stdout  # the table
    assert not any(p.is_dir() for p in (tmp_path / "out").iterdir())  # the teacher, bases, states: in the scratch


@pytest.mark.slow
def test_gpu_check_builds_its_venv_from_a_venv_python_offline(tmp_path):
    """The wrapper's own venv (a fresh clone of HEAD) made from a python that is itself a venv's,
    as the GPU image's python3 is, with no package index: the parent venv's torch stays
    visible, pip's failures fall back to PYTHONPATH, and lrc imports from the clone (--setup-only:
    the check itself is the dry-mode test's)."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PIP_NO_INDEX": "1"}
    cmd = [str(REPO / "scripts" / "gpu-check"), "--device", "cpu", "--python", sys.executable,
           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--setup-only"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"lrc from {tmp_path / 'work' / 'src' / 'lrc'}" in proc.stdout
    assert "torch 2." in proc.stdout and not (tmp_path / "out" / "gpu-check.csv").exists()
