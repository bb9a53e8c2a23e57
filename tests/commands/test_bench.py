"""`lrc bench` on a tiny random teacher: the CSV, the baseline row, one materialisation per weight."""

from __future__ import annotations

import csv
import json

import pytest

from lrc.errors import LRCError


def _write_teacher_config(tmp_path, layers: int = 2) -> None:
    """tmp_path/teacher.json: a tiny random llama teacher for `lrc bench --teacher`."""
    cfg = {"model_type": "llama", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 96,
           "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 64, "tie_word_embeddings": True}
    (tmp_path / "teacher.json").write_text(json.dumps(cfg))


@pytest.mark.slow
def test_bench_writes_the_table_with_ratios_to_plain_kd(tmp_path):
    from lrc.commands.bench import main

    _write_teacher_config(tmp_path)
    out = tmp_path / "bench.csv"
    assert main(["--teacher", str(tmp_path / "teacher.json"), "--student-hidden", "16", "--arms", "slice", "dense",
                 "--steps", "3", "--warmup-steps", "1", "--repeats", "1", "--batch-size", "2", "--seq-len", "16",
                 "--out", str(out)]) == 0
    rows = {r["arm"]: r for r in csv.DictReader(out.open())}
    assert list(rows) == ["kd", "slice", "dense"]
    assert float(rows["kd"]["time_ratio_to_kd"]) == 1.0 and float(rows["kd"]["memory_ratio_to_kd"]) == 1.0
    for r in rows.values():
        assert float(r["step_time_ms"]) > 0 and float(r["step_cpu_ms"]) > 0 and float(r["peak_memory_mib"]) > 0
        assert (0 < float(r["optimizer_cpu_ms"]) < float(r["step_cpu_ms"])
                and 0 < float(r["optimizer_ms"]) < float(r["step_time_ms"]))
        assert int(r["measured_steps"]) == 3 and r["teacher_hidden"] == "32" and r["device"] == "cpu"
    # Each parametrised weight is materialised once per step: 2 layers x 7 matrices + embedding + head
    # for slice; dense drops the 3 MLP parametrisations per layer; kd has none.
    assert [float(rows[a]["parametrisation_calls_per_step"]) for a in ("kd", "slice", "dense")] == [0, 16, 10]
    # Trainable numbers: dense trains d_ff * r per MLP matrix where slice trains H * r.
    assert int(rows["dense"]["trainable_params"]) - int(rows["slice"]["trainable_params"]) == 2 * 3 * (96 - 32) * 16
    assert json.loads((tmp_path / "bench.csv.settings.json").read_text())["command"] == "bench"


@pytest.mark.slow
def test_bench_without_the_baseline_times_only_the_arms_asked_for(tmp_path):
    from lrc.commands.bench import main

    _write_teacher_config(tmp_path, layers=1)
    out = tmp_path / "bench.csv"
    assert main(["--teacher", str(tmp_path / "teacher.json"), "--student-hidden", "16", "--arms", "dense",
                 "--no-baseline", "--steps", "1", "--warmup-steps", "0", "--repeats", "1", "--batch-size", "2",
                 "--seq-len", "16", "--out", str(out)]) == 0
    (row,) = csv.DictReader(out.open())
    assert row["arm"] == "dense" and float(row["step_cpu_ms"]) > 0
    assert [row[k] for k in ("time_ratio_to_kd", "cpu_ratio_to_kd", "memory_ratio_to_kd")] == ["nan"] * 3


def test_bench_rejects_an_unknown_arm(tmp_path):
    from lrc.commands.bench import BenchArgs, bench

    with pytest.raises(LRCError, match="unknown arm 'nope'"):
        bench(BenchArgs(teacher=tmp_path, student_hidden=8, out=tmp_path / "x.csv", arms=["nope"]))
    with pytest.raises(LRCError, match="lazy"):
        bench(BenchArgs(teacher=tmp_path, student_hidden=8, out=tmp_path / "x.csv", arms=["core:lazy"]))


@pytest.mark.slow
def test_bench_micro_batches_and_the_core_basis_change_in_the_optimiser(tmp_path):
    from lrc.commands.bench import main

    _write_teacher_config(tmp_path)
    rows = {}
    for impl, build in (("optimizer", "auto"), ("optimizer", "micro_batch"), ("parametrized", "auto")):
        out = tmp_path / f"{impl}-{build}.csv"
        assert main(["--teacher", str(tmp_path / "teacher.json"), "--student-hidden", "16", "--arms", "core",
                     "--core-impl", impl, "--weight-build", build, "--micro-batches", "2", "--steps", "2",
                     "--warmup-steps", "1", "--repeats", "1", "--batch-size", "2", "--seq-len", "16",
                     "--out", str(out)]) == 0
        rows[impl, build] = {r["arm"]: r for r in csv.DictReader(out.open())}["core"]
    # The optimiser path rebuilds no MLP weight in the forward (as dense: 10 weights) and steps its
    # 6 MLP weights in the arm's coordinates. With 2 micro-batches the weights are built once per
    # step (auto; the tied head reads the embedding's build: 9), or once per micro-batch (20).
    calls = {k: float(r["parametrisation_calls_per_step"]) for k, r in rows.items()}
    assert calls == {("optimizer", "auto"): 9, ("optimizer", "micro_batch"): 2 * 10, ("parametrized", "auto"): 15}
    assert [r["optimizer_coordinate_maps"] for r in rows.values()] == ["6", "6", "0"]
    assert rows["optimizer", "auto"]["weight_build"] == "auto" and rows["optimizer", "auto"]["micro_batches"] == "2"
    assert len({r["trainable_params"] for r in rows.values()}) == 1


@pytest.mark.slow
def test_bench_with_activation_checkpointing_builds_each_weight_once_per_step(tmp_path):
    from lrc.commands.bench import main

    _write_teacher_config(tmp_path)
    out = tmp_path / "bench.csv"
    assert main(["--teacher", str(tmp_path / "teacher.json"), "--student-hidden", "16", "--arms", "slice",
                 "--activation-checkpointing", "--steps", "2", "--warmup-steps", "1",
                 "--repeats", "1", "--batch-size", "2", "--seq-len", "16", "--out", str(out)]) == 0
    rows = {r["arm"]: r for r in csv.DictReader(out.open())}
    # the recompute in backward reuses the weights the forward built: still 16 per step, not 16 + 14
    assert float(rows["slice"]["parametrisation_calls_per_step"]) == 16
    assert rows["slice"]["activation_checkpointing"] == "True" and "loss_impl" not in rows["slice"]


@pytest.mark.slow
def test_bench_with_two_processes_divides_the_basis_changes_and_the_weights(tmp_path):
    """--processes 2: a DDP run (torchrun, gloo) per measurement; each process runs half of
    core's 6 basis changes per step and, with --divide-weight-build, builds half the rows of each
    of its 10 weights once per step (2 micro-batches; 9 builds, the tied head reading the embedding's); the
    step takes twice the sequences."""
    from lrc.commands.bench import main

    _write_teacher_config(tmp_path)
    out = tmp_path / "bench.csv"
    assert main(["--teacher", str(tmp_path / "teacher.json"), "--student-hidden", "16", "--arms", "core",
                 "--processes", "2", "--micro-batches", "2", "--divide-weight-build", "--steps", "2",
                 "--warmup-steps", "1", "--repeats", "1", "--batch-size", "2", "--seq-len", "16",
                 "--out", str(out)]) == 0
    rows = {r["arm"]: r for r in csv.DictReader(out.open())}
    assert (rows["core"]["optimizer_coordinate_maps"], rows["core"]["basis_changes_per_process"]) == ("6", "3")
    assert rows["kd"]["basis_changes_per_process"] == "0" and rows["core"]["processes"] == "2"
    assert float(rows["core"]["parametrisation_calls_per_step"]) == 9
    assert float(rows["core"]["weight_rows_share"]) == pytest.approx(0.5, abs=0.02)
    assert float(rows["core"]["tokens_per_s"]) > 0
    for r in rows.values():  # the slowest process's times, beside process 0's
        assert (float(r["optimizer_cpu_max_ms"]) >= float(r["optimizer_cpu_ms"])
                and float(r["step_cpu_max_ms"]) >= float(r["step_cpu_ms"]))


@pytest.mark.slow
def test_interleaved_steps_alternate_the_arms_in_one_process(tmp_path):
    """scripts/interleaved_steps.py: one unmeasured round, then each measured round runs one real
    training step of every arm, in alternating order; each step splits into forward/backward and
    the optimiser step, where core's basis change runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    _write_teacher_config(tmp_path)
    out = tmp_path / "steps.csv"
    proc = subprocess.run([sys.executable, str(repo / "scripts" / "interleaved_steps.py"),
                           "--teacher", str(tmp_path / "teacher.json"), "--student-hidden", "16",
                           "--arms", "dense", "core", "--seq-len", "16", "--batch-size", "2", "--micro-batches", "2",
                           "--rounds", "4", "--project", "24", "--out", str(out)],
                          capture_output=True, text=True, cwd=repo, env=os.environ | {"PYTHONPATH": str(repo)},
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(out.open()))
    assert [(r["round"], r["arm"]) for r in rows] == [("1", "core"), ("1", "dense"), ("2", "dense"), ("2", "core"),
                                                      ("3", "core"), ("3", "dense"), ("4", "dense"), ("4", "core")]
    for r in rows:
        assert float(r["fb_cpu_s"]) + float(r["optimizer_cpu_s"]) == pytest.approx(float(r["step_cpu_s"]))
        assert 0 < float(r["optimizer_cpu_s"]) < float(r["step_cpu_s"])
    table = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()
             if line.split()[:1] in (["dense"], ["core"])}
    assert [float(x) for x in table["dense"][3:]] == [1.0, 1.0, 1.0]  # the reference arm's own ratios
    assert len(table["core"]) == 6 and all(float(x) > 0 for x in table["core"][3:])  # two paired ratios, one projection
