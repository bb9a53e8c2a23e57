"""Results tables and the token-efficiency figure from small hand-made evaluation JSONs."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from lrc import cli
from lrc.analysis import tables
from lrc.analysis.figures import draw as tables_figure
from lrc.commands import aggregate, figure
from lrc.errors import LRCError

LM_EVAL = {"version": "0.4.13", "num_fewshot": 0, "batch_size": 16, "limit": None}


def write_eval(root, exp, name, scores, aggregate, metric="acc", extra=None):
    path = root / exp / "eval" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "model": name,
        "suite": "tiny",
        "tasks": {t: {"metric": metric, "value": v, "stderr": 0.01, "chance": 0.25} for t, v in scores.items()},
        "aggregate": {"name": "Avg", "value": aggregate},
        "extra": extra or {"perplexity": 10.0, "kl_to_teacher": 0.5, "answer_logprob": -1.0},
        "lm_eval": LM_EVAL,
        "settings": {},
    }
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def evals(tmp_path):
    """Teacher; slice (2 seeds), dense (2 seeds), core (1 seed) at 1000 tokens; SFT of slice."""
    w = lambda *a, **k: write_eval(tmp_path / "results", *a, **k)  # noqa: E731
    return [
        w("tiny", "teacher", {"a": 0.9, "b": 0.7}, 0.8),
        w("tiny", "lrc-slice-s0-t1000", {"a": 0.5, "b": 0.3}, 0.4),
        w("tiny", "lrc-slice-s1-t1000", {"a": 0.7, "b": 0.3}, 0.5),
        w("tiny", "lrc-dense-s0-t1000", {"a": 0.6, "b": 0.4}, 0.5),
        w("tiny", "lrc-dense-s1-t1000", {"a": 0.8, "b": 0.4}, 0.6),
        w("tiny", "lrc-core-s0-t1000", {"a": 0.9, "b": 0.5}, 0.7),
        w("tiny", "lrc-slice-s0-t1000.sft", {"a": 0.95, "b": 0.35}, 0.65),
    ]


def test_table1_means_seeds_and_gains_over_slice(evals, tmp_path):
    out = tmp_path / "table1.csv"
    assert aggregate.main(["--table", "table1", "--inputs", *map(str, evals), "--out", str(out)]) == 0
    t = pd.read_csv(out).set_index("arm")
    assert list(t.index) == ["teacher", "slice", "dense", "core"]  # SFT rows are not in table 1
    assert t.loc["slice", "aggregate"] == pytest.approx(45.0)
    assert t.loc["slice", "a (acc)"] == pytest.approx(60.0)
    assert t.loc["slice", "aggregate_sd"] == pytest.approx(math.sqrt(50.0), abs=1e-3)  # 40, 50
    assert t.loc["dense", "gain_over_slice"] == pytest.approx(10.0)
    assert t.loc["core", "gain_over_slice"] == pytest.approx(25.0)
    assert t.loc["core", "vs_teacher"] == pytest.approx(-10.0)
    assert math.isnan(t.loc["teacher", "gain_over_slice"])
    assert t.loc["slice", "seeds"] == "0 1" and t.loc["core", "n_seeds"] == 1
    assert t.loc["dense", "tokens"] == 1000
    # The evaluation settings travel with every row.
    assert (t["lm_eval_version"] == "0.4.13").all() and (t["num_fewshot"] == 0).all()
    assert (t["batch_size"] == 16).all() and t["limit"].isna().all()
    assert t.loc["dense", "kl_to_teacher"] == pytest.approx(0.5)


def test_sft_table_holds_the_fine_tuned_students_and_the_teacher(evals, tmp_path):
    frame = tables.results_table(tables.load_evaluations(evals), sft=True)
    assert list(frame["arm"]) == ["teacher", "slice"]
    assert frame.loc[1, "model"] == "lrc-slice-t1000.sft"
    assert frame.loc[1, "aggregate"] == pytest.approx(65.0)
    assert frame.loc[1, "gain_over_slice"] == pytest.approx(0.0)


def test_experiments_and_recipes_get_their_own_baseline(tmp_path):
    root = tmp_path / "results"
    files = [
        write_eval(root, "a", "lrc-slice-s0-t10", {"x": 0.5}, 0.5),
        write_eval(root, "a", "lrc-core-s0-t10", {"x": 0.6}, 0.6),
        write_eval(root, "a", "kl-slice-s0-t10", {"x": 0.2}, 0.2),
        write_eval(root, "a", "kl-core-s0-t10", {"x": 0.5}, 0.5),
        write_eval(root, "b", "lrc-slice-s0-t10", {"x": 0.1}, 0.1),
        write_eval(root, "b", "lrc-core-s0-t10", {"x": 0.3}, 0.3),
    ]
    t = tables.results_table(tables.load_evaluations(files), sft=False)
    gain = {(r.experiment, r.recipe, r.arm): r.gain_over_slice for r in t.itertuples()}
    assert gain[("a", "lrc", "core")] == pytest.approx(10.0)
    assert gain[("a", "kl", "core")] == pytest.approx(30.0)
    assert gain[("b", "lrc", "core")] == pytest.approx(20.0)


def test_bad_inputs_are_refused_with_the_culprit(tmp_path):
    root = tmp_path / "results"
    bad_name = write_eval(root, "a", "lrc-slice-0", {"x": 0.5}, 0.5)
    with pytest.raises(LRCError, match="lrc-slice-0"):
        tables.load_evaluations([bad_name])
    broken = root / "a" / "eval" / "teacher.json"
    broken.write_text("{not json")
    with pytest.raises(LRCError, match="teacher.json"):
        tables.load_evaluations([broken])
    one = write_eval(root, "a", "lrc-slice-s0-t10", {"x": 0.5}, 0.5, metric="acc")
    other = write_eval(root, "a", "lrc-core-s0-t10", {"x": 0.5}, 0.5, metric="acc_norm")
    with pytest.raises(LRCError, match="'x'.*acc_norm"):
        tables.results_table(tables.load_evaluations([one, other]), sft=False)


def test_audit_table_concatenates_with_the_experiment(tmp_path):
    for exp in ("a", "b"):
        (tmp_path / exp).mkdir()
        (tmp_path / exp / "audit.csv").write_text("weight,reachable\nmlp.gate,8\n")
    out = tmp_path / "audit.csv"
    aggregate.main(["--table", "audit", "--inputs", str(tmp_path / "a/audit.csv"), str(tmp_path / "b/audit.csv"),
                    "--out", str(out)])
    t = pd.read_csv(out)
    assert list(t["experiment"]) == ["a", "b"] and list(t.columns) == ["experiment", "weight", "reachable"]


def test_token_efficiency_figure_writes_png_and_pdf(tmp_path):
    root = tmp_path / "results"
    files = [write_eval(root, "tiny", "teacher", {"x": 0.9}, 0.9)]
    for tokens, (s, d) in {100: (0.3, 0.35), 1000: (0.4, 0.5), 10000: (0.45, 0.6)}.items():
        files.append(write_eval(root, "tiny", f"lrc-slice-s0-t{tokens}", {"x": s}, s))
        files.append(write_eval(root, "tiny", f"lrc-dense-s0-t{tokens}", {"x": d}, d))
    table = tmp_path / "table1.csv"
    aggregate.main(["--table", "table1", "--inputs", *map(str, files), "--out", str(table)])
    png, pdf = tmp_path / "fig.png", tmp_path / "fig.pdf"
    assert figure.main(["--table", str(table), "--out", str(png), str(pdf)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pdf.read_bytes()[:5] == b"%PDF-"
    # the chance floor (the tasks' chance 0.25: 25 %) is drawn and kept in view; each line names its seeds
    frame = pd.read_csv(table)
    assert (frame["chance"] == 25.0).all()
    ax = tables_figure(frame).axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert "chance" in labels and "teacher" in labels and ax.get_ylim()[0] <= 20.0
    assert "slice (lrc, n = 1)" in ax.get_legend_handles_labels()[1]
    with pytest.raises(LRCError, match="missing column"):
        (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
        figure.main(["--table", str(tmp_path / "bad.csv"), "--out", str(png)])


def test_heldout_gains_over_slice_beside_the_task_aggregate(evals, tmp_path):
    root = tmp_path / "results"
    write_eval(root, "tiny", "lrc-dense-s0-t1000", {"a": 0.6, "b": 0.4}, 0.5,
               extra={"perplexity": 5.0, "kl_to_teacher": 0.2})
    write_eval(root, "tiny", "lrc-dense-s1-t1000", {"a": 0.8, "b": 0.4}, 0.6,
               extra={"perplexity": 5.0, "kl_to_teacher": 0.4})
    out = tmp_path / "table1.csv"
    aggregate.main(["--table", "table1", "--inputs", *map(str, evals), "--out", str(out)])
    t = pd.read_csv(out).set_index("arm")
    # slice: perplexity 10, KL 0.5 (both seeds); dense: 5 and 0.3 on average.
    assert t.loc["dense", "perplexity_gain_over_slice"] == pytest.approx(math.log(2.0), abs=1e-4)
    assert t.loc["dense", "kl_gain_over_slice"] == pytest.approx(0.2)
    assert t.loc["slice", "kl_gain_over_slice"] == pytest.approx(0.0)
    assert math.isnan(t.loc["teacher", "perplexity_gain_over_slice"])
    # The tiny world's columns are all still there, in their order; the new ones are added.
    old = ["experiment", "model", "recipe", "arm", "tokens", "seeds", "n_seeds", "a (acc)", "b (acc)", "aggregate",
           "aggregate_sd", "gain_over_slice", "vs_teacher", "perplexity", "kl_to_teacher", "answer_logprob",
           "aggregate_name", "lm_eval_version", "num_fewshot", "batch_size", "limit"]
    columns = list(pd.read_csv(out).columns)
    assert [c for c in columns if c in old] == old
    assert set(columns) - set(old) == {"perplexity_gain_over_slice", "kl_gain_over_slice", "suite", "aggregate_ci_low",
                                       "aggregate_ci_high", "aggregate_per_seed", "gain_ci_low", "gain_ci_high",
                                       "gain_p_value", "chance"}


def test_heldout_only_evaluations_under_hand_given_names(tmp_path):
    """`lrc evaluate --suite none` records (no task, no aggregate) named after the arm or anything."""
    root = tmp_path / "results"
    files = []
    for name, ppl, kl in (("teacher", 16.0, None), ("slice", 22049.0, 7.23), ("dense", 10665.0, 6.48),
                          ("core", 11073.0, 6.53), ("my-student", 99.0, 3.0)):
        path = write_eval(root, "smol", name, {}, None, extra={"perplexity": ppl, "kl_to_teacher": kl})
        data = json.loads(path.read_text())
        data["suite"], data["aggregate"]["name"] = "none", None
        path.write_text(json.dumps(data))
        files.append(path)
    t = tables.results_table(tables.load_evaluations(files), sft=False).set_index("arm")
    assert list(t.index) == ["teacher", "slice", "dense", "core", "my-student"]
    assert t.loc["dense", "model"] == "dense" and t.loc["my-student", "model"] == "my-student"
    assert t.loc["dense", "perplexity_gain_over_slice"] == pytest.approx(math.log(22049 / 10665), abs=1e-6)
    assert t.loc["core", "kl_gain_over_slice"] == pytest.approx(0.7)
    assert t.loc["my-student", "kl_gain_over_slice"] == pytest.approx(4.23)  # against slice.json too
    assert t["aggregate"].isna().all() and math.isnan(t.loc["dense", "gain_over_slice"])
    assert (t["suite"] == "none").all()
    # A near-miss of a run name is a typo, refused with the culprit.
    typo = write_eval(root, "smol", "lrc-dense-s0", {}, None)
    with pytest.raises(LRCError, match="lrc-dense-s0"):
        tables.load_evaluations([typo])


def test_table1_rows_carry_t_intervals_per_seed_values_and_a_paired_gain(tmp_path):
    """Three seeds; slice 40/50/60, dense 43/52/64: paired gains 3, 2, 4 (hand-computed)."""
    root = tmp_path / "results"
    files = [write_eval(root, "tiny", "teacher", {"a": 0.9}, 0.9)]
    for seed, (s, d) in enumerate(((0.40, 0.43), (0.50, 0.52), (0.60, 0.64))):
        files.append(write_eval(root, "tiny", f"lrc-slice-s{seed}-t1000", {"a": s}, s))
        files.append(write_eval(root, "tiny", f"lrc-dense-s{seed}-t1000", {"a": d}, d))
    files.append(write_eval(root, "tiny", "lrc-core-s0-t1000", {"a": 0.7}, 0.7))  # one seed: no pairing
    files.append(write_eval(root, "tiny", "lrc-dense-s0-t1000.knockout", {"a": 0.3}, 0.3))  # not a table-1 row
    out = tmp_path / "table1.csv"
    assert aggregate.main(["--table", "table1", "--inputs", *map(str, files), "--out", str(out)]) == 0
    t = pd.read_csv(out).set_index("arm")
    half = 4.302653 * 10.0 / math.sqrt(3)  # slice: mean 50, sd 10, t_{0.975,2} = 4.3027
    assert t.loc["slice", "aggregate_ci_low"] == pytest.approx(50 - half, abs=1e-3)
    assert t.loc["slice", "aggregate_ci_high"] == pytest.approx(50 + half, abs=1e-3)
    assert t.loc["dense", "aggregate_per_seed"] == "43.0000 52.0000 64.0000"
    assert t.loc["dense", "gain_over_slice"] == pytest.approx(3.0)
    gain_half = 4.302653 * 1.0 / math.sqrt(3)  # gains 3, 2, 4: sd 1
    assert t.loc["dense", "gain_ci_low"] == pytest.approx(3 - gain_half, abs=1e-3)
    assert t.loc["dense", "gain_ci_high"] == pytest.approx(3 + gain_half, abs=1e-3)
    # t = 3 / (1 / sqrt 3) = 5.196 on 2 df: p = 0.0351 (scipy.stats.ttest_rel gives the same)
    assert t.loc["dense", "gain_p_value"] == pytest.approx(0.0351, abs=1e-4)
    # One seed, or seeds that do not match the slice's: a gain without an interval.
    assert t.loc["core", "gain_over_slice"] == pytest.approx(20.0)
    assert math.isnan(t.loc["core", "gain_ci_low"]) and math.isnan(t.loc["core", "aggregate_ci_low"])
    assert math.isnan(t.loc["slice", "gain_p_value"]) and t.loc["slice", "n_seeds"] == 3


def test_a_table_refuses_students_trained_with_other_settings_than_the_config_names(evals, tmp_path, capsys):
    """--expect-settings (the workflow's table rules): every student's distill settings.json must
    record the config's value of each flag; one run at another lr is named with the key."""
    results = tmp_path / "results"
    for run in ("lrc-slice-s0-t1000", "lrc-slice-s1-t1000", "lrc-dense-s0-t1000", "lrc-dense-s1-t1000",
                "lrc-core-s0-t1000"):
        lr = 0.001 if run == "lrc-dense-s1-t1000" else 0.003
        (results / "tiny" / "distill" / run).mkdir(parents=True)
        (results / "tiny" / "distill" / run / "settings.json").write_text(
            json.dumps({"settings": {"lr": lr, "betas": [0.9, 0.95], "alpha": 0.2}}))
    out = tmp_path / "table1.csv"

    def table(expected):
        return cli.main(["aggregate", "--table", "table1", "--inputs", *map(str, evals), "--expect-settings",
                               json.dumps({"tiny": {"lrc": expected}}), "--out", str(out)])

    # YAML reads 3e-3 as a string; the command line as 0.003: the same setting
    assert table({"distill.train.lr": "3e-3", "distill.train.betas": [0.9, 0.95], "loss.lrc.alpha": 0.2}) == 2
    err = capsys.readouterr().err
    assert ("lrc-dense-s1-t1000 was trained with lr = 0.001, but experiments.tiny.distill.train.lr is '3e-3'" in err
            and err.count("was trained with") == 1 and not out.exists())
    (results / "tiny" / "distill" / "lrc-dense-s1-t1000" / "settings.json").write_text(
        json.dumps({"settings": {"lr": 0.003, "betas": [0.9, 0.95], "alpha": 0.2}}))
    assert table({"distill.train.lr": "3e-3", "distill.train.betas": [0.9, 0.95], "loss.lrc.alpha": 0.2}) == 0
    assert table({"distill.train.betas": [0.9, 0.99]}) == 2  # lists element-wise
    assert "betas = [0.9, 0.95], but experiments.tiny.distill.train.betas is [0.9, 0.99]" in capsys.readouterr().err
    assert table({"distill.train.warmup": 0.1}) == 2  # a key the run did not record is named too
    assert "records no 'warmup' (experiments.tiny.distill.train.warmup is 0.1)" in capsys.readouterr().err
    (results / "tiny" / "distill" / "lrc-core-s0-t1000" / "settings.json").unlink()
    assert table({"distill.train.lr": 0.003}) == 2
    assert "lrc-core-s0-t1000: it has no settings.json" in capsys.readouterr().err


def test_a_claim_table_refuses_students_trained_with_other_settings_too(evals, tmp_path, capsys):
    """The claim rules pass the same --expect-settings to `lrc claims`: one run at another lr refuses it."""
    for run in ("lrc-slice-s0-t1000", "lrc-slice-s1-t1000", "lrc-dense-s0-t1000", "lrc-dense-s1-t1000",
                "lrc-core-s0-t1000"):
        (tmp_path / "results" / "tiny" / "distill" / run).mkdir(parents=True)
        lr = 0.001 if run == "lrc-core-s0-t1000" else 0.003
        (tmp_path / "results" / "tiny" / "distill" / run / "settings.json").write_text(
            json.dumps({"settings": {"lr": lr}}))
    out = tmp_path / "claim.csv"
    argv = ["claims", "table1", "--inputs", *map(str, evals), "--out", str(out), "--expect-settings"]
    assert cli.main(argv + [json.dumps({"tiny": {"lrc": {"distill.train.lr": 0.003}}})]) == 2
    assert "lrc-core-s0-t1000 was trained with lr = 0.001" in capsys.readouterr().err and not out.exists()
    assert cli.main(argv + [json.dumps({"tiny": {"lrc": {"distill.train.lr": 0.001}}})]) == 2
    assert capsys.readouterr().err.count("was trained with lr = 0.003") == 4
