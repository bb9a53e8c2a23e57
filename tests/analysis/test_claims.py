"""`lrc claims CLAIM` through the real command line on small hand-made evaluation JSONs and CSVs.

The scores are chosen so the answers can be worked out by hand: on seeds 0, 1, 2 slice scores
40, 50, 60 and dense 43, 52, 64, so dense − slice is 3, 2, 4 (mean 3, sd 1, 95 % t interval
3 ± 4.3027 / √3 = 3 ± 2.4841, paired t = 5.196 on 2 df, p = 0.0351).
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from lrc import cli

HALF = 4.302653 / math.sqrt(3)  # the 95 % t half-width of three values with sd 1
SLICE, DENSE, CORE = (40, 50, 60), (43, 52, 64), (41, 50, 62)
CONFINED, RANDCOMP = (40.5, 49.5, 60), (42, 51, 63)


def write_eval(eval_dir, name, percent, chance=0.25, kl=None):
    eval_dir.mkdir(parents=True, exist_ok=True)
    value = percent / 100
    extra = {} if kl is None else {"kl_to_teacher": kl}
    data = {"model": name, "suite": "tiny",
            "tasks": {"x": {"metric": "acc", "value": value, "stderr": 0.01, "chance": chance}},
            "aggregate": {"name": "Avg", "value": value}, "extra": extra, "lm_eval": {"version": "0.4.13"},
            "settings": {}}
    path = eval_dir / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


def runs(eval_dir, arm, scores, tokens=1000, recipe="lrc", suffix=""):
    return [write_eval(eval_dir, f"{recipe}-{arm}-s{seed}-t{tokens}{suffix}", v) for seed, v in enumerate(scores)]


@pytest.fixture
def evals(tmp_path):
    return tmp_path / "results" / "tiny" / "eval"


def claims(*argv):
    return cli.main(["claims", *map(str, argv)])


def read(path):
    return pd.read_csv(path, keep_default_na=True).set_index("comparison")


def test_table1_pairs_each_full_arm_with_its_slice(evals, tmp_path):
    files = ([write_eval(evals, "teacher", 80)] + runs(evals, "slice", SLICE) + runs(evals, "dense", DENSE)
             + runs(evals, "core", CORE))
    out = tmp_path / "claims" / "table1.csv"
    assert claims("table1", "--inputs", *files, "--out", out) == 0
    t = read(out)
    assert list(t.index) == ["dense − slice", "core − slice"]
    dense = t.loc["dense − slice"]
    assert dense["miniature"] == pytest.approx(3.0)
    assert (dense["ci_low"] == pytest.approx(3 - HALF, abs=1e-4)
            and dense["ci_high"] == pytest.approx(3 + HALF, abs=1e-4))
    assert dense["p_value"] == pytest.approx(0.0351, abs=1e-4)
    assert dense["per_seed"] == "3.0000 2.0000 4.0000" and dense["seeds"] == "0 1 2" and dense["n_seeds"] == 3
    assert (dense["paper"] == 2.23 and "Llama-3.2-3B" in dense["paper_setting"]
            and dense["paper_source"] == "docs/method.md §4")
    assert dense["model_mean"] == pytest.approx(53.0) and dense["baseline_mean"] == pytest.approx(50.0)
    assert (dense["model_per_seed"] == "43.0000 52.0000 64.0000"
            and dense["baseline_per_seed"] == "40.0000 50.0000 60.0000")
    assert bool(dense["direction_holds"]) and bool(dense["ci_excludes_zero"]) and bool(dense["headline"])
    core = t.loc["core − slice"]  # gains 1, 0, 2: t = 1.732, p = 0.2254; the interval holds 0
    assert core["miniature"] == pytest.approx(1.0) and core["p_value"] == pytest.approx(0.2254, abs=1e-4)
    assert not bool(core["ci_excludes_zero"]) and core["paper"] == 2.36
    assert "Student's t" in core["ci_method"]


def test_table1_sets_the_share_of_the_slices_kl_removed_beside_each_gain(evals, tmp_path):
    # slice KL 0.1, 0.2, 0.1; dense removes 20, 25, 22.5 % of it (mean 22.5, sd 2.5); core removes -10, 0, 0 %
    kls = {"slice": (0.1, 0.2, 0.1), "dense": (0.08, 0.15, 0.0775), "core": (0.11, 0.2, 0.1)}
    files = [write_eval(evals, f"lrc-{arm}-s{seed}-t1000", score, kl=kls[arm][seed])
             for arm, scores in (("slice", SLICE), ("dense", DENSE), ("core", CORE))
             for seed, score in enumerate(scores)]
    out = tmp_path / "table1.csv"
    assert claims("table1", "--inputs", *files, "--out", out) == 0
    t = read(out)
    dense, core = (t.loc[f"{arm} − slice, KL to the teacher (% of slice's removed)"] for arm in ("dense", "core"))
    half = 4.302653 * 2.5 / math.sqrt(3)
    assert dense["miniature"] == pytest.approx(22.5) and dense["per_seed"] == "20.0000 25.0000 22.5000"
    assert (dense["ci_low"] == pytest.approx(22.5 - half, abs=1e-4)
            and dense["ci_high"] == pytest.approx(22.5 + half, abs=1e-4))
    assert dense["verdict_rule"] == "sign" and math.isnan(dense["paper"]) and bool(dense["headline"])
    assert bool(dense["direction_holds"]) and dense["baseline_mean"] == pytest.approx(0.4 / 3, abs=1e-4)
    assert core["miniature"] == pytest.approx(-10 / 3, abs=1e-4) and math.isnan(core["direction_holds"])
    # an arm whose evaluations all lie on the wrong side fails
    worse = [write_eval(evals, f"lrc-dense-s{seed}-t1000", score, kl=kl * 1.5 + 0.01 * seed)
             for seed, (score, kl) in enumerate(zip(DENSE, kls["slice"]))]
    assert claims("table1", "--inputs", *files[:3], *worse, "--out", out) == 0
    assert read(out).loc["dense − slice, KL to the teacher (% of slice's removed)", "direction_holds"] == False  # noqa: E712
    # no KL row where one evaluation has none
    files[0] = write_eval(evals, "lrc-slice-s0-t1000", SLICE[0])
    assert claims("table1", "--inputs", *files, "--out", out) == 0
    assert list(read(out).index) == ["dense − slice", "core − slice"]


def write_items(eval_dir, name, correct, nll_rows):
    """An evaluation with lm-eval's per-item log of task x (``correct``: 0/1 per item) and its held-out rows."""
    path = write_eval(eval_dir, name, 100 * sum(correct) / len(correct))
    data = json.loads(open(path).read())
    data["extra"]["heldout_rows"] = {"tokens": [10] * len(nll_rows), "nll": nll_rows}
    open(path, "w").write(json.dumps(data))
    records = eval_dir / f"{name}.lm_eval"
    records.mkdir()
    logged = [{"doc_id": i, "acc": c, "doc_hash": f"d{i}", "prompt_hash": "p"} for i, c in enumerate(correct)]
    (records / "samples_x.jsonl").write_text("".join(json.dumps(row) + "\n" for row in logged))
    return path


def test_table1_pools_the_seeds_items_and_heldout_rows(evals, tmp_path):
    """Per item, dense − slice is 0, 1, 0, 0 on seed 0 and 1, 0, 0, 0 on seed 1: pooled, 8 differences of
    mean 25 points and sd √(15000/7); per held-out row (10 tokens each), dense's NLL 1 lower on every row of
    both seeds: −0.1 per token, whichever rows a bootstrap draws."""
    files = [write_items(evals, "lrc-slice-s0-t1000", [1, 0, 1, 0], [30.0, 20.0]),
             write_items(evals, "lrc-dense-s0-t1000", [1, 1, 1, 0], [29.0, 19.0]),
             write_items(evals, "lrc-slice-s1-t1000", [0, 0, 1, 1], [25.0, 22.0]),
             write_items(evals, "lrc-dense-s1-t1000", [1, 0, 1, 1], [24.0, 21.0])]
    out = tmp_path / "table1.csv"
    assert claims("table1", "--inputs", *files, "--out", out) == 0
    t = read(out)
    items = t.loc["dense − slice, x per item (points, seeds pooled)"]
    half = 2.364624 * math.sqrt(15000 / 7) / math.sqrt(8)
    assert items["miniature"] == pytest.approx(25) and items["items"] == 8 and items["n_seeds"] == 2
    assert items["ci_low"] == pytest.approx(25 - half, abs=1e-4)
    assert items["ci_high"] == pytest.approx(25 + half, abs=1e-4)
    assert items["per_seed"] == "25.0000 25.0000" and items["verdict_rule"] == "items"
    assert math.isnan(items["direction_holds"]) and bool(items["headline"])
    nll = t.loc["dense − slice, cross-entropy (nats per token), held-out rows (seeds pooled)"]
    assert nll["miniature"] == pytest.approx(-0.1) and nll["items"] == 4
    assert nll["ci_low"] == pytest.approx(-0.1) and nll["ci_high"] == pytest.approx(-0.1)
    # the summary shows them, with no verdict and outside Holm's family
    summary = tmp_path / "claims.csv"
    assert claims("summary", "--inputs", out, "--out", summary, "--markdown", tmp_path / "claims.md") == 0
    row = read(summary).loc["dense − slice, x per item (points, seeds pooled)"]
    assert math.isnan(row["p_holm"]) and math.isnan(row["holds"]) and row["verdict_rule"] == "items"
    # items logged differently for two seeds are refused, naming the item
    (evals / "lrc-dense-s1-t1000.lm_eval" / "samples_x.jsonl").write_text(
        json.dumps({"doc_id": 0, "acc": 1, "doc_hash": "other", "prompt_hash": "p"}) + "\n")
    assert claims("table1", "--inputs", *files, "--out", out) != 0


def test_one_seed_keeps_working_with_a_blank_interval(evals, tmp_path):
    files = runs(evals, "slice", SLICE[:1]) + runs(evals, "dense", DENSE[:1])
    assert claims("table1", "--inputs", *files, "--out", tmp_path / "t.csv") == 0
    row = read(tmp_path / "t.csv").loc["dense − slice"]
    assert row["miniature"] == pytest.approx(3.0) and row["n_seeds"] == 1
    assert math.isnan(row["ci_low"]) and math.isnan(row["p_value"]) and math.isnan(row["ci_excludes_zero"])


def test_controls_every_arm_minus_slice_and_the_basis_controls(evals, tmp_path):
    files = runs(evals, "slice", SLICE) + runs(evals, "dense", DENSE) + runs(evals, "core", CORE)
    files += runs(evals, "confined", CONFINED) + runs(evals, "randcomp", RANDCOMP)
    assert claims("controls", "--inputs", *files, "--out", tmp_path / "c.csv") == 0
    t = read(tmp_path / "c.csv")
    assert list(t.index) == ["dense − slice", "core − slice", "confined − slice", "randcomp − slice", "core − dense",
                             "randcomp − core"]
    # 0.5, -0.5, 0: the 95 % interval 0 ± 1.24 is wider than the ±1 margin, the 90 % one (0 ± 0.84) lies
    # inside it: equivalent (two one-sided tests at 5 %), so the null holds
    confined = t.loc["confined − slice"]
    assert confined["miniature"] == pytest.approx(0.0, abs=1e-9) and bool(confined["direction_holds"])
    assert confined["ci90_high"] == pytest.approx(0.8429, abs=1e-4) == -confined["ci90_low"]
    assert confined["verdict_rule"] == "equivalence" and "equivalence" in confined["direction"]
    assert pd.isna(t.loc["core − slice", "direction_holds"])  # +1 [-1.48, +3.48]: the right sign, inconclusive
    assert pd.isna(t.loc["dense − slice", "ci90_low"])  # the 90 % interval is a null's only
    core_dense = t.loc["core − dense"]  # -2, -2, -2 against the paper's +0.13: the direction fails
    assert core_dense["miniature"] == pytest.approx(-2.0) and not bool(core_dense["direction_holds"])
    assert core_dense["p_value"] == 0.0  # no spread: t is infinite
    randcomp_core = t.loc["randcomp − core"]  # +1, +1, +1 against the paper's -0.64
    assert randcomp_core["miniature"] == pytest.approx(1.0) and not bool(randcomp_core["direction_holds"])
    assert list(t.index[t["headline"]]) == ["confined − slice", "core − dense", "randcomp − core"]


def test_cross_recipe_gains_and_their_difference(evals, tmp_path):
    files = runs(evals, "slice", SLICE) + runs(evals, "dense", DENSE)
    files += runs(evals, "slice", (30, 35, 40), recipe="kl") + runs(evals, "dense", (35, 41, 44), recipe="kl")
    assert claims("cross_recipe", "--inputs", *files, "--out", tmp_path / "x.csv") == 0
    t = read(tmp_path / "x.csv")
    assert (t.loc["lrc: dense − slice", "miniature"] == pytest.approx(3.0)
            and t.loc["lrc: dense − slice", "paper"] == 1.82)
    assert t.loc["kl: dense − slice", "per_seed"] == "5.0000 6.0000 4.0000"
    diff = t.loc["(kl gain) − (lrc gain), dense − slice"]  # 5-3, 6-2, 4-4 = 2, 4, 0: mean 2, sd 2
    assert diff["miniature"] == pytest.approx(2.0) and diff["paper"] == 1.04
    assert diff["ci_high"] == pytest.approx(2 + 2 * HALF, abs=1e-4)


def test_saturation_ladder_long_budget_gap_and_figure(evals, tmp_path):
    files = [write_eval(evals, "teacher", 80)]
    ladder = {100: (20, 22), 200: (30, 34), 400: (40, 46), 800: (45, 53)}
    for tokens, (s, d) in ladder.items():
        files += runs(evals, "slice", (s, s + 2), tokens=tokens) + runs(evals, "dense", (d, d + 4), tokens=tokens)
    png, pdf = tmp_path / "sat.png", tmp_path / "sat.pdf"
    assert claims("saturation", "--inputs", *files, "--out", tmp_path / "s.csv", "--figure", png, pdf) == 0
    t = read(tmp_path / "s.csv")
    assert len(t) == 3 * 4 + 1 + 3
    assert t.loc["slice at 800 tokens", "miniature"] == pytest.approx(46.0)
    assert t.loc["dense at 800 tokens", "per_seed"] == "53.0000 57.0000"
    long_gap = t.loc["long-budget gap: dense − slice at the largest budget (800 tokens)"]  # 53-45, 57-47: 8, 10
    assert long_gap["miniature"] == pytest.approx(9.0) and long_gap["paper"] == 2.54 and bool(long_gap["headline"])
    # t_{0.975,1} = 12.706
    assert long_gap["ci_high"] == pytest.approx(9 + 12.7062 * math.sqrt(2) / math.sqrt(2), abs=1e-3)
    assert t.loc["dense − slice at 100 tokens", "miniature"] == pytest.approx(3.0)
    assert (t["teacher"] == 80).all()
    # Still climbing: 45 − 40 and 47 − 42 (slice), 53 − 46 and 57 − 50 (dense), outside ±1 point: no plateau.
    for arm, step in (("slice", 5.0), ("dense", 7.0)):
        plateau = t.loc[f"plateau: {arm} at 800 − at 400 tokens"]
        assert plateau["miniature"] == pytest.approx(step) and plateau["verdict_rule"] == "equivalence"
        assert not bool(plateau["direction_holds"]) and bool(plateau["headline"]) and pd.isna(plateau["paper"])
    # Equal steps in log tokens: the area is the mean of the three trapezoids. Seed 0: slice (25 + 35 + 42.5) / 3,
    # dense (28 + 40 + 49.5) / 3, a gap of 5; seed 1: 7.
    speed = t.loc["learning speed (not reach): area under the curve, dense − slice, mean score over log tokens 100–800"]
    assert speed["per_seed"] == "5.0000 7.0000" and speed["verdict_rule"] == "no-paper"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:5] == b"%PDF-"
    # Three budgets are no ladder.
    short = [f for f in files if "-t800" not in f]
    assert claims("saturation", "--inputs", *short, "--out", tmp_path / "s3.csv") == 2


def test_a_ladder_whose_last_step_is_within_the_margin_has_plateaued(evals, tmp_path):
    files = [write_eval(evals, "teacher", 80)]
    ladder = {100: (20, 22), 200: (30, 34), 400: (40, 46), 800: (40.25, 46.5)}
    for tokens, (s, d) in ladder.items():
        files += runs(evals, "slice", (s, s + 1, s + 0.5), tokens=tokens)
        files += runs(evals, "dense", (d, d + 1, d - 0.25), tokens=tokens)
    assert claims("saturation", "--inputs", *files, "--out", tmp_path / "s.csv") == 0
    t = read(tmp_path / "s.csv")
    for arm, step in (("slice", 0.25), ("dense", 0.5)):  # the same step on every seed: its interval is that point
        plateau = t.loc[f"plateau: {arm} at 800 − at 400 tokens"]
        assert plateau["miniature"] == pytest.approx(step) and bool(plateau["direction_holds"])


def test_capacity_reads_the_probe_as_one_teachers_sizes(tmp_path, capsys):
    probe = tmp_path / "results" / "tiny" / "probe.csv"
    probe.parent.mkdir(parents=True)
    probe.write_text("layer,energy,slice_error,free_error,stranded,slice_plateau,free_plateau,train_rows,heldout_rows\n"
                     "0,0.99,0.10,0.09,0.1,0,0,96,32\n1,0.95,0.30,0.15,0.5,0,0,96,32\n")
    assert claims("capacity", "--inputs", probe, "--out", tmp_path / "c.csv") == 0
    t = pd.read_csv(tmp_path / "c.csv")
    assert list(t["measure"]) == ["energy", "slice_error", "stranded"] and (t["experiment"] == "tiny").all()
    # means over the two layers: 97 % energy, slice error 20 %, free 12 %: the free MLP removes 8 of 20 points
    assert t["miniature"].tolist() == pytest.approx([97.0, 20.0, 40.0])
    assert t["headline"].all() and (t["n_seeds"] == 1).all() and t["ci_low"].isna().all()
    assert "per layer: 10 / 50" in t.loc[2, "comparison"] and t.loc[2, "verdict_rule"] == "no-paper"
    assert claims("capacity", "--inputs", probe, probe, "--out", tmp_path / "d.csv") == 2
    assert "one probe.csv per experiment, got 2" in capsys.readouterr().err
    (tmp_path / "bad.csv").write_text("layer,energy\n0,0.9\n")
    assert claims("capacity", "--inputs", tmp_path / "bad.csv", "--out", tmp_path / "d.csv") == 2
    assert "missing column(s) free_error, slice_error, stranded" in capsys.readouterr().err


def write_occupancy(tmp_path, run, rows):
    path = tmp_path / "results" / "tiny" / "occupancy" / f"{run}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["layer,weight,energy,outside,occupancy"] + [f"{l},{w},{e},{o},{o / e}" for l, w, e, o in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_knockout_energy_outside_score_drop_and_chance(evals, tmp_path):
    files = ([write_eval(evals, "teacher", 80)] + runs(evals, "dense", DENSE)
             + runs(evals, "dense", (26, 25, 27), suffix=".knockout"))
    # Energy-weighted over layers and weights: 1.5 of 20, 3 of 40, 3 of 40 outside = 7.5 % each
    # (seed 2's rows hold 15 % and 5 %: the plain mean of the rows' shares would say 10 %).
    files += [write_occupancy(tmp_path, "lrc-dense-s0-t1000", [(0, "gate_proj", 10, 1), (0, "down_proj", 10, 0.5)]),
              write_occupancy(tmp_path, "lrc-dense-s1-t1000", [(0, "gate_proj", 20, 3), (1, "up_proj", 20, 0)]),
              write_occupancy(tmp_path, "lrc-dense-s2-t1000", [(0, "gate_proj", 10, 1.5), (1, "up_proj", 30, 1.5)])]
    assert claims("knockout", "--inputs", *files, "--out", tmp_path / "k.csv") == 0
    t = read(tmp_path / "k.csv")
    outside = t.loc["dense: MLP energy outside the teacher's spaces (%)"]
    assert (outside["per_seed"] == "7.5000 7.5000 7.5000" and outside["paper"] == 7.4
            and pd.isna(outside["direction_holds"]))
    drop = t.loc["dense: score drop from the knockout (before − after)"]  # 43-26, 52-25, 64-27
    assert drop["per_seed"] == "17.0000 27.0000 37.0000" and drop["miniature"] == pytest.approx(27.0)
    chance = t.loc["dense: score after the knockout − chance"]  # chance 25 %: 1, 0, 2 above it
    assert chance["chance"] == pytest.approx(25.0) and chance["miniature"] == pytest.approx(1.0)
    assert chance["score_before"] == pytest.approx(53.0) and bool(chance["direction_holds"])  # 1 <= 0.25 * 28
    assert chance["p_value"] == pytest.approx(0.2254, abs=1e-4)  # 1, 0, 2 against 0: t = 1.732 on 2 df
    # A knocked-out seed without its occupancy CSV is named.
    assert claims("knockout", "--inputs", *files[:-1], "--out", tmp_path / "k2.csv") == 2


def test_knockout_that_keeps_the_score_does_not_collapse(evals, tmp_path):
    files = runs(evals, "dense", DENSE) + runs(evals, "dense", (42, 50, 60), suffix=".knockout")
    files += [write_occupancy(tmp_path, f"lrc-dense-s{s}-t1000", [(0, "gate_proj", 10, 1)]) for s in range(3)]
    assert claims("knockout", "--inputs", *files, "--out", tmp_path / "k.csv") == 0
    assert not bool(read(tmp_path / "k.csv").loc["dense: score after the knockout − chance", "direction_holds"])


def test_sft_beside_the_teacher_and_the_sft_gain(evals, tmp_path):
    files = ([write_eval(evals, "teacher", 80)] + runs(evals, "dense", DENSE)
             + runs(evals, "dense", (81, 79, 83), suffix=".sft"))
    files += runs(evals, "slice", SLICE) + runs(evals, "slice", (70, 72, 74), suffix=".sft")
    assert claims("sft", "--inputs", *files, "--out", tmp_path / "f.csv") == 0
    t = read(tmp_path / "f.csv")
    vs = t.loc["dense after SFT − teacher"]  # 1, -1, 3
    assert vs["miniature"] == pytest.approx(1.0) and vs["per_seed"] == "1.0000 -1.0000 3.0000" and vs["paper"] == 0.03
    assert vs["model_mean"] == pytest.approx(81.0)
    gain = t.loc["dense: SFT gain (after − before)"]  # 81-43, 79-52, 83-64
    assert gain["per_seed"] == "38.0000 27.0000 19.0000" and gain["paper"] == 0.81
    assert t.loc["slice: SFT gain (after − before)", "paper"] == 1.00
    assert math.isnan(t.loc["slice after SFT − teacher", "paper"])


def write_update_energy(tmp_path, run, steps):
    path = tmp_path / "results" / "tiny" / "distill" / run / "update_energy.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["step,tokens,layer,weight,energy,inside,share_inside"]
    for step, rows in steps.items():
        lines += [f"{step},{step * 100},{l},{w},{e},{i},{i / e}" for l, w, e, i in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_coordinates_energy_weighted_share_per_step_and_final(tmp_path):
    files = []
    for seed, extra in enumerate((0, 1)):
        # dense: 1 of 4 and 1 of 1 inside -> 2 / 5 = 40 % (the mean of the shares would be 62.5 %)
        files.append(write_update_energy(tmp_path, f"lrc-dense-s{seed}-t1000", {
            10: [(0, "gate_proj", 4, 1), (1, "down_proj", 1, 1)],
            20: [(0, "gate_proj", 4, 2 + extra), (1, "down_proj", 1, 1)]}))  # 60 %, 80 %
        files.append(write_update_energy(tmp_path, f"lrc-core-s{seed}-t1000", {
            10: [(0, "gate_proj", 2, 2)], 20: [(0, "gate_proj", 10, 9 + extra)]}))  # 90 %, 100 %
    assert claims("coordinates", "--inputs", *files, "--out", tmp_path / "e.csv") == 0
    t = read(tmp_path / "e.csv")
    assert t.loc["dense: update energy inside the teacher's subspace (%) at step 10", "per_seed"] == "40.0000 40.0000"
    final = t.loc["dense: update energy inside the teacher's subspace (%) at the end (step 20)"]
    assert final["miniature"] == pytest.approx(70.0) and bool(final["headline"]) and final["tokens_seen"] == 2000
    assert (math.isnan(final["paper"]) and "no paper number" in final["direction"]
            and math.isnan(final["direction_holds"]))
    diff = t.loc["dense − core: final share inside the teacher's subspace (points)"]  # 60-90, 80-100
    assert diff["per_seed"] == "-30.0000 -20.0000"


def test_summary_csv_and_markdown(evals, tmp_path):
    files = ([write_eval(evals, "teacher", 80)] + runs(evals, "slice", SLICE) + runs(evals, "dense", DENSE)
             + runs(evals, "core", CORE))
    files += runs(evals, "confined", CONFINED) + runs(evals, "randcomp", RANDCOMP)
    t1, ctl = tmp_path / "claims" / "table1.csv", tmp_path / "claims" / "controls.csv"
    assert (claims("table1", "--inputs", *files, "--out", t1) == 0
            and claims("controls", "--inputs", *files, "--out", ctl) == 0)
    (tmp_path / "seconds").write_text("1234.5\n")
    out, md = tmp_path / "claims.csv", tmp_path / "claims.md"
    assert claims("summary", "--inputs", t1, ctl, "--out", out, "--markdown", md,
                  "--time-file", tmp_path / "seconds") == 0
    s = pd.read_csv(out)
    assert list(s.columns) == ["claim", "comparison", "paper", "miniature", "ci_low", "ci_high", "n_seeds",
                               "seeds_for_paper_gap", "p_value", "p_holm", "verdict_rule", "direction_holds", "holds",
                               "ci_excludes_zero", "rule", "table"]
    assert list(s["comparison"]) == ["dense − slice", "core − slice", "confined − slice", "core − dense",
                                     "randcomp − core"]
    assert list(s["rule"]) == ["claim_table1"] * 2 + ["claim_controls"] * 3 and s.loc[0, "table"] == str(t1)
    assert s.loc[0, "miniature"] == pytest.approx(3.0) and s.loc[0, "ci_low"] == pytest.approx(3 - HALF, abs=1e-4)
    # Holm over the four sign rows (p 0, 0, 0.0351, 0.2254): dense − slice's 0.0351 becomes 2 x 0.0351, so
    # its yes is inconclusive once corrected; the equivalence row keeps its own verdict
    assert s["p_holm"].tolist()[:2] == pytest.approx([0.0702, 0.2254], abs=1e-4) and pd.isna(s.loc[2, "p_holm"])
    assert [None if pd.isna(v) else bool(v) for v in s["direction_holds"]] == [True, None, True, False, False]
    assert [None if pd.isna(v) else bool(v) for v in s["holds"]] == [None, None, True, False, False]
    text = md.read_text()
    # the paper's +2.23 against differences with sd 1: a paired t-test needs 4 seeds for 80 % power
    assert ("| 1 | table1 | dense − slice | +2.23 | +3.00 [+0.52, +5.48] | 3 | 4 | 0.0351 | 0.0702 | — "
            "| `claim_table1` |" in text)
    assert "Holm's adjusted p over the 4 sign rows is below 0.05" in text
    assert "20.6 min (1234 s)" in text and "Student's t" in text and "docs/method.md" in text
    assert "3. no effect, as in the paper (-0.02): holds if the 90 % interval lies within ±1 points" in text


def test_bad_inputs_are_refused_with_the_culprit(evals, tmp_path, capsys):
    out = tmp_path / "o.csv"
    assert claims("nope", "--inputs", "x.json", "--out", out) == 2
    assert "unknown claim 'nope'" in capsys.readouterr().err
    # a full-reach arm without its slice
    dense = runs(evals, "dense", DENSE)
    assert claims("table1", "--inputs", *dense, "--out", out) == 2
    assert "no slice partner" in capsys.readouterr().err
    # a seed in one arm but not in its pair
    slice_ = runs(evals, "slice", SLICE[:2])
    assert claims("table1", "--inputs", *dense, *slice_, "--out", out) == 2
    err = capsys.readouterr().err
    assert "seed(s) 2 only in lrc-dense-t1000" in err
    # the 2×2 needs exactly one full-reach arm
    core = runs(evals, "core", CORE)
    assert claims("cross_recipe", "--inputs", *dense, *core, *runs(evals, "slice", SLICE), "--out", out) == 2
    assert "exactly one full-reach arm, found core, dense" in capsys.readouterr().err
    assert claims("table1", "--inputs", *dense, "--out", out, "--figure", tmp_path / "f.png") == 2
    assert "--figure" in capsys.readouterr().err
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    assert claims("summary", "--inputs", tmp_path / "bad.csv", "--out", out) == 2
    assert "missing column" in capsys.readouterr().err
    assert not out.exists()


def test_two_experiments_get_their_own_rows_and_figure_panels(tmp_path):
    files = []
    for exp, offset in (("tiny", 0), ("other", 10)):
        evals = tmp_path / "results" / exp / "eval"
        files.append(write_eval(evals, "teacher", 90))
        for tokens in (100, 200, 400, 800):
            files += runs(evals, "slice", [v + offset for v in SLICE], tokens=tokens)
            files += runs(evals, "dense", [v + offset for v in DENSE], tokens=tokens)
    t1, sat = tmp_path / "table1.csv", tmp_path / "saturation.csv"
    assert claims("table1", "--inputs", *files, "--out", t1) == 0
    assert claims("saturation", "--inputs", *files, "--out", sat, "--figure", tmp_path / "s.png") == 0
    t = pd.read_csv(t1)
    assert list(t["experiment"]) == ["tiny"] * 4 + ["other"] * 4 and (t["miniature"] == 3.0).all()
    assert claims("summary", "--inputs", t1, sat, "--out", tmp_path / "claims.csv") == 0
    s = pd.read_csv(tmp_path / "claims.csv")
    assert "other: long-budget gap: dense − slice at the largest budget (800 tokens)" in list(s["comparison"])


def _interval(low, high):
    from lrc.analysis.stats import Interval

    return Interval((low + high) / 2, low, high, 3, 1.0)


@pytest.mark.parametrize("ci95, ci90, holds",
                         [((-0.9, 1.2), (-0.5, 0.8), True),  # equivalent: the 90 % interval inside ±1
                          ((0.2, 3.0), (0.5, 2.6), False), ((-3.0, -0.1), (-2.6, -0.5), False),  # an effect
                          ((-1.5, 0.5), (-1.2, 0.2), None),  # neither: inconclusive
                          ((0.1, 0.9), (0.2, 0.8), True)])  # a tiny effect inside the margin is equivalent
def test_a_null_holds_only_when_its_90_percent_interval_lies_within_the_margin(ci95, ci90, holds):
    from lrc.analysis.claims_rows import EQUIVALENCE_MARGIN, direction_holds, paper

    assert EQUIVALENCE_MARGIN == 1.0
    assert direction_holds(paper("controls", "confined"), _interval(*ci95), _interval(*ci90)) is holds


@pytest.mark.parametrize("ci95, paper_value, holds",
                         [((0.5, 4.0), 2.23, True), ((-4.0, -0.5), 2.23, False), ((-4.0, -0.5), -0.64, True),
                          ((-0.5, 4.0), 2.23, None),  # the right mean, an interval holding 0: never a yes
                          ((-4.0, 0.5), -0.64, None)])
def test_a_sign_holds_only_when_its_interval_lies_on_the_papers_side(ci95, paper_value, holds):
    from lrc.analysis.claims_rows import Paper, direction_holds

    assert direction_holds(Paper(paper_value, "constructed"), _interval(*ci95)) is holds
    nan = float("nan")
    assert direction_holds(Paper(paper_value, "constructed"), _interval(nan, nan)) is None  # one seed: no interval


def test_holm_adjusts_step_down_and_skips_blanks():
    from lrc.analysis.stats import holm

    # sorted 0.01, 0.02, 0.04 against 3, 2, 1 tests: 0.03, 0.04, max(0.04, 0.04); NaN stays out of the family
    assert holm([0.04, float("nan"), 0.01, 0.02]) == pytest.approx([0.04, float("nan"), 0.03, 0.04], nan_ok=True)
    assert holm([0.5, 0.6]) == [1.0, 1.0] and holm([]) == []
