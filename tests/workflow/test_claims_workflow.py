"""The claims target (`snakemake --cores 2 results/claims.md`, workflow/rules/claims.smk): the
runs its DAG distills on the default config, the checks of the `claims` section, that the
Quick start's table1 DAG is unchanged by it, the warm start per seed, and a small real run."""

from __future__ import annotations

import re
import shutil

import pandas as pd
import pytest
import yaml

from lrc.workflow import claims
from lrc.workflow import config as wc
from tests.workflow_helpers import (
    COPY_IGNORE,
    ROOT,
    default_config,
    failure_report,
    job_counts,
    shell_commands,
    snakemake,
)

SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


def dry_run(target: str, config: dict | None = None, tmp_path=None) -> str:
    args = ["-n", "--forceall", target]
    if config is not None:
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        args += ["--configfile", path]
    result = snakemake(*args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def jobs_of(output: str) -> list[tuple[str, str]]:
    """(rule, first output) of every job of a dry run, sorted."""
    found = re.findall(r"^(?:local)?rule (\w+):\n(?:.*\n)*?\s+output: ([^,\n]+)", output, flags=re.MULTILINE)
    return sorted(found)


def outputs_of(output: str, rule: str) -> list[str]:
    return sorted(out for r, out in jobs_of(output) if r == rule)


# ---------------------------------------------------------------- the DAG of results/claims.md


def expected_claim_runs(c: dict) -> set[str]:
    """Written out here from the claims' definitions (docs/method.md §4), not from lrc.workflow.claims."""
    seeds, t, full = c["seeds"], c["tokens"], c["full_arm"]
    at_budget = {f"lrc-{arm}-s{s}-t{t}" for arm in ["slice", "dense", "core", "coreortho", "confined", "randcomp"]
                 for s in seeds}
    kl = {f"kl-{arm}-s{s}-t{t}" for arm in ["slice", full] for s in seeds}
    ladder = {f"lrc-{arm}-s{s}-t{b}" for arm in ["slice", full] for s in seeds for b in c["ladder"]}
    return at_budget | kl | ladder


@pytest.mark.slow
def test_claims_dag_on_the_default_config_distills_exactly_the_claims_runs():
    out = dry_run("results/claims.md")
    c = default_config()["experiments"]["tiny"]["claims"]
    runs = [p.removeprefix("results/tiny/distill/") for p in outputs_of(out, "distill")]
    expected = expected_claim_runs(c)
    assert len(runs) == len(set(runs)) == len(expected)
    assert set(runs) == expected
    # 3 seeds x (6 arms + kl slice/dense) at the budget, plus slice/dense at the other ladder budgets.
    extra = len([b for b in c["ladder"] if b != c["tokens"]])
    assert len(runs) == 3 * (6 + 2) + 3 * 2 * extra
    counts = job_counts(out)
    assert counts["merge"] == len(runs) and counts["knockout_audit"] == 12 and counts["sft"] == 6
    # every run, its knockout (dense, core, coreortho, randcomp x 3 seeds), its SFT (slice, dense x 3) and the teacher
    assert counts["evaluate"] == len(runs) + 12 + 6 + 1
    # per recipe: seed 0's common warm start and one per other seed
    assert counts["warmstart"] == 2 and counts["warmstart_seeded"] == 2 * (len(c["seeds"]) - 1)
    assert outputs_of(out, "warmstart") == ["results/tiny/warmstart/kl", "results/tiny/warmstart/lrc"]
    for claim in claims.CLAIMS:
        assert counts[f"claim_{claim}"] == 1
    assert counts["claims"] == 1 and "table1" not in counts and "pretrain" in counts
    assert outputs_of(out, "probe") == ["results/tiny/probe.csv"]  # the capacity claim's
    assert set(outputs_of(out, "knockout_audit")) == {
        f"results/tiny/occupancy/lrc-{a}-s{s}-t{c['tokens']}.csv" for a in ("dense", "core", "coreortho", "randcomp")
        for s in c["seeds"]}


@pytest.mark.slow
def test_claim_rules_hand_lrc_claims_their_files():
    out = snakemake("-n", "--forceall", "results/claims/coordinates.csv", "results/claims/knockout.csv").stdout
    (coords,) = [c for c in shell_commands(out) if c.startswith("lrc claims coordinates ")]
    files = coords.split("--inputs ", 1)[1].split(" --out", 1)[0].split()
    assert len(files) == 18 and all(re.fullmatch(r"results/tiny/distill/lrc-\w+-s\d-t\d+/update_energy\.csv", f)
                                    for f in files)
    (knock,) = [c for c in shell_commands(out) if c.startswith("lrc claims knockout ")]
    assert ("results/tiny/eval/teacher.json" in knock and knock.count(".knockout.json") == 12
            and knock.count("/occupancy/") == 12)


@pytest.mark.slow
def test_quick_default_table1_dag_is_unchanged_by_the_claims_section(tmp_path):
    config = default_config()
    with_claims = jobs_of(dry_run("results/table1.csv"))
    del config["experiments"]["tiny"]["claims"]
    (tmp_path / "a").mkdir()
    without = jobs_of(dry_run("results/table1.csv", config, tmp_path / "a"))
    assert with_claims == without
    (tokens,) = config["experiments"]["tiny"]["distill"]["tokens"]
    assert [o for r, o in with_claims if r == "distill"] == [f"results/tiny/distill/lrc-{a}-s0-t{tokens}"
                                                             for a in ("core", "dense", "slice")]
    assert [o for r, o in with_claims if r == "warmstart"] == ["results/tiny/warmstart/lrc"]


@pytest.mark.slow
def test_each_seed_continues_from_a_warm_start_of_its_own_seed(tmp_path):
    config = default_config()
    assert config["experiments"]["tiny"]["claims"]["vary_warmstart"]
    out = dry_run("results/claims/cross_recipe.csv", config, tmp_path)
    tokens = config["experiments"]["tiny"]["claims"]["tokens"]
    assert outputs_of(out, "warmstart") == ["results/tiny/warmstart/kl", "results/tiny/warmstart/lrc"]
    assert outputs_of(out, "warmstart_seeded") == sorted(f"results/tiny/warmstart/{r}-s{s}" for r in ("lrc", "kl")
                                                         for s in (1, 2))
    for seed, warmstart in ((0, "results/tiny/warmstart/kl"), (1, "results/tiny/warmstart/kl-s1"),
                            (2, "results/tiny/warmstart/kl-s2")):
        if seed:  # seed 0's is the common warm start, trained with the default seed 0
            (cmd,) = [c for c in shell_commands(out) if " warmstart " in c and f"--out {warmstart} " in c]
            assert f"--seed {seed} " in cmd
        (cmd,) = [c for c in shell_commands(out) if " distill " in c
                  and f"--out results/tiny/distill/kl-dense-s{seed}-t{tokens} " in c]
        assert f"--warmstart {warmstart} " in cmd and f"--seed {seed} " in cmd


@pytest.mark.slow
def test_without_vary_warmstart_every_seed_shares_the_common_warm_start(tmp_path):
    config = default_config()
    config["experiments"]["tiny"]["claims"]["vary_warmstart"] = False
    out = dry_run("results/claims/cross_recipe.csv", config, tmp_path)
    assert "warmstart_seeded" not in job_counts(out)
    distills = [c for c in shell_commands(out) if " distill " in c and "--recipe kl " in c]
    assert len(distills) == 6 and all("--warmstart results/tiny/warmstart/kl " in c for c in distills)


# ---------------------------------------------------------------- the checks of the section


def claims_refusal(edit) -> list[str]:
    config = default_config()
    edit(config["experiments"]["tiny"])
    problems = wc.schema_problems(config, SCHEMA)
    if not problems:  # the rest, as common.smk's check_flag_sections runs them
        problems = claims.claims_problems("tiny", config["experiments"]["tiny"])
    return problems


BAD_CLAIMS = [
    ("ladder3", lambda x: x["claims"].update(ladder=[100000, 400000, 1600000]),
     "at experiments.tiny.claims.ladder: [100000, 400000, 1600000] is too short"),
    ("ladder_short", lambda x: x["claims"].update(tokens=400000, ladder=[100000, 200000, 400000, 800000]),
     "experiments.tiny.claims.ladder: the largest budget 800000 must be at least 4x claims.tokens (1600000)"),
    ("ladder_order", lambda x: x["claims"].update(ladder=[1600000, 100000, 200000, 400000]),
     "experiments.tiny.claims.ladder: list the budgets in increasing order"),
    ("ladder_repeat", lambda x: x["claims"].update(ladder=[100000, 100000, 400000, 1600000]),
     "at experiments.tiny.claims.ladder: [100000, 100000, 400000, 1600000] has non-unique elements"),
    ("full_arm", lambda x: x["claims"].update(full_arm="slice"),
     "at experiments.tiny.claims.full_arm: 'slice' is not one of ['dense', 'core', 'coreortho', 'randcomp']"),
    ("one_seed", lambda x: x["claims"].update(seeds=[0]), "at experiments.tiny.claims.seeds: [0] is too short"),
    ("seed_repeat", lambda x: x["claims"].update(seeds=[0, 0, 1]),
     "at experiments.tiny.claims.seeds: [0, 0, 1] has non-unique elements"),
    ("negative_seed", lambda x: x["claims"].update(seeds=[0, -1]),
     "at experiments.tiny.claims.seeds.1: -1 is less than the minimum of 0"),
    ("tokens_text", lambda x: x["claims"].update(tokens="400k"),
     "at experiments.tiny.claims.tokens: '400k' is not of type 'integer'"),
    ("tokens_zero", lambda x: x["claims"].update(tokens=0),
     "at experiments.tiny.claims.tokens: 0 is less than the minimum of 1"),
    ("no_tokens", lambda x: x["claims"].pop("tokens"), "at experiments.tiny.claims: 'tokens' is a required property"),
    ("typo", lambda x: x["claims"].update(seed=[0, 1]),
     "at experiments.tiny.claims: Additional properties are not allowed ('seed' was unexpected)"),
    ("no_energy", lambda x: x["distill"]["train"].pop("update_energy_every"),
     "experiments.tiny.distill.train.update_energy_every: the coordinates claim reads each run's update_energy.csv"),
    ("no_ladder", lambda x: x["claims"].pop("ladder"),
     "experiments.tiny.claims.ladder: the saturation claim needs the budgets of its ladder"),
    ("unknown_claim", lambda x: x["claims"].update(include=["table1", "speed"]),
     "at experiments.tiny.claims.include.1: 'speed' is not one of"),
    ("no_slice", lambda x: x["claims"].update(arms=["dense", "core"]),
     "experiments.tiny.claims.arms: the controls are gains over slice"),
]


def test_a_claims_section_that_leaves_claims_out_needs_only_what_the_rest_read():
    """Without saturation and coordinates, no ladder and no update energy are asked for; the runs are
    those of the included claims, the controls with the arms named."""
    def subset(x):
        x["claims"].update(include=["capacity", "table1", "controls"], arms=["slice", "dense", "core", "coreortho"])
        x["claims"].pop("ladder")
        x["distill"]["train"].pop("update_energy_every")
    assert claims_refusal(subset) == []
    settings = default_config()["experiments"]["tiny"]
    subset(settings)
    t = settings["claims"]["tokens"]
    arms = ("slice", "dense", "core", "coreortho")
    assert set(claims.all_claim_runs(settings)) == {f"lrc-{a}-s{s}-t{t}" for a in arms for s in (0, 1, 2)}
    assert claims.included(settings) == ("capacity", "table1", "controls")
    assert claims.claim_inputs("tiny", settings, "saturation") == []
    assert not any(job.rule == "knockout_audit" for job in wc.jobs(settings))


@pytest.mark.parametrize("name, edit, message", BAD_CLAIMS, ids=[n for n, *_ in BAD_CLAIMS])
def test_bad_claims_section_is_refused_naming_the_key(name, edit, message):
    problems = claims_refusal(edit)
    assert any(p.startswith(message) for p in problems), problems


def test_default_claims_section_passes_the_checks():
    assert claims_refusal(lambda x: None) == []


@pytest.mark.slow
def test_workflow_refuses_a_bad_claims_section_before_any_job(tmp_path):
    config = default_config()
    config["experiments"]["tiny"]["claims"]["ladder"] = [100000, 200000, 400000, 800000]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    result = snakemake("--cores", "1", "results/claims.md", "--directory", tmp_path, "--configfile", path)
    assert result.returncode != 0
    assert ("invalid config at experiments.tiny.claims.ladder: the largest budget 800000"
            in result.stdout + result.stderr)
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_claims_target_without_a_claims_section_names_it(tmp_path):
    config = default_config()
    del config["experiments"]["tiny"]["claims"]
    path = tmp_path / "none.yaml"
    path.write_text(yaml.safe_dump(config))
    result = snakemake("-n", "results/claims.md", "--configfile", path)
    assert result.returncode != 0
    assert "needs an experiment with a `claims` section" in result.stdout + result.stderr


# ---------------------------------------------------------------- a small real run

TINY_CLAIMS = {"seeds": [0, 1], "tokens": 4000, "ladder": [2000, 4000, 8000, 16000], "full_arm": "dense"}
CLAIM_COLUMNS = ["claim", "comparison", "paper", "miniature", "ci_low", "ci_high", "n_seeds", "seeds_for_paper_gap",
                 "p_value", "p_holm",
                 "verdict_rule", "direction_holds", "holds", "ci_excludes_zero", "rule", "table"]


@pytest.mark.slow
def test_claims_end_to_end_on_a_tiny_world(tmp_path):
    """`snakemake results/claims.md` for real on config/test.yaml's world with two seeds and a
    ladder of four tiny budgets: every claim table, the figure and the summary. About 110 jobs
    (26 distillations, the fewest the claims allow at two seeds) of 4-5 s CPU each, nearly
    all process start-up: 5 min on two idle cores, 15 on a shared machine."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=COPY_IGNORE)
    config = yaml.safe_load((ROOT / "config" / "test.yaml").read_text())
    (exp,) = config["experiments"]
    x = config["experiments"][exp]
    x["claims"] = TINY_CLAIMS
    x["distill"]["train"].update(update_energy_every=2)
    x["sft"]["train"]["tokens"] = 2000
    (repo / "claims.yaml").write_text(yaml.safe_dump(config))

    run = snakemake("--cores", "2", "results/claims.md", "--configfile", "claims.yaml", cwd=repo, timeout=1800)
    assert run.returncode == 0, failure_report(run, repo)

    results = repo / "results"
    table = pd.read_csv(results / "claims.csv")
    assert list(table.columns) == CLAIM_COLUMNS
    assert set(table["rule"]) == {f"claim_{c}" for c in claims.CLAIMS}
    for rule, path in zip(table["rule"], table["table"]):
        assert path == f"results/claims/{rule.removeprefix('claim_')}.csv" and (repo / path).is_file(), (rule, path)
    capacity = table["rule"] == "claim_capacity"  # the teacher's probe: one teacher, no seeds
    assert capacity.sum() == 3 and (table.loc[capacity, "n_seeds"] == 1).all()
    seeded = table[table["n_seeds"].notna() & ~capacity]
    assert set(seeded["n_seeds"]) <= {2} and len(seeded) > 0
    assert table["miniature"].notna().all(), table
    kl_rows = table[table["comparison"].str.contains("KL to the teacher (% of slice's removed)", regex=False)]
    assert len(kl_rows) == 2 and set(kl_rows["rule"]) == {"claim_table1"}, table["comparison"]  # dense, core
    # dense and core item by item (each task) and row by row (KL, cross-entropy), the seeds pooled: no verdict
    pooled = table[table["verdict_rule"] == "items"]
    assert set(pooled["rule"]) == {"claim_table1"} and pooled["holds"].isna().all()
    assert pooled["comparison"].str.endswith("seeds pooled)").all() and len(pooled) >= 2 * 3, table["comparison"]
    assert (results / "claims.md").read_text().count("claim_") >= len(claims.CLAIMS)
    assert ((results / "claims" / "saturation.png").stat().st_size > 1000
            and (results / "claims" / "saturation.pdf").is_file())
    occupancy = pd.read_csv(results / exp / "occupancy" / "lrc-dense-s0-t4000.csv")
    assert list(occupancy.columns) == ["layer", "weight", "energy", "outside", "occupancy"]
    rerun = snakemake("-n", "results/claims.md", "--configfile", "claims.yaml", cwd=repo)
    assert "Nothing to be done" in rerun.stdout + rerun.stderr, rerun.stdout
