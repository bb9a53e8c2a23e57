"""lrc.analysis.stats against samples whose answers are known by hand (and by scipy's own tests)."""

from __future__ import annotations

import math

import numpy as np

import pytest
from scipy import stats as scipy_stats

from lrc.analysis import stats
from lrc.errors import LRCError


def test_t_interval_of_one_two_three():
    # mean 2, sd 1, t_{0.975, 2} = 4.3027: 2 ± 4.3027 / sqrt(3) = 2 ± 2.4841
    iv = stats.t_interval([1, 2, 3])
    assert stats.t_quantile(2) == pytest.approx(4.302653, abs=1e-6)
    assert (iv.mean, iv.sd, iv.n) == (pytest.approx(2.0), pytest.approx(1.0), 3)
    assert iv.low == pytest.approx(2 - 4.302653 / math.sqrt(3), abs=1e-6)
    assert iv.high == pytest.approx(2 + 2.484138, abs=1e-6)
    assert iv.excludes_zero is False  # -0.48 .. 4.48: three seeds make a wide interval
    assert stats.t_interval([10, 11, 12]).excludes_zero is True


def test_one_value_gives_a_mean_and_a_blank_interval():
    iv = stats.t_interval([5.0])
    assert iv.mean == 5.0 and iv.n == 1
    assert math.isnan(iv.low) and math.isnan(iv.high) and math.isnan(iv.sd)
    assert iv.excludes_zero is None
    assert math.isnan(stats.t_interval([]).mean)


def test_nan_and_none_are_left_out_and_counted_out():
    iv = stats.t_interval([1.0, float("nan"), 2.0, None, 3.0])
    assert iv.n == 3 and iv.mean == pytest.approx(2.0) and iv.low == pytest.approx(2 - 2.484138, abs=1e-6)
    assert stats.mean([float("nan")]) != stats.mean([float("nan")])  # NaN: nothing to average
    assert stats.sample_sd([4.0, 8.0]) == pytest.approx(math.sqrt(8.0))


def test_paired_difference_and_its_test():
    # Arm a beats b by 3, 2, 4 points on seeds 0, 1, 2 (the data orders): mean 3, sd 1,
    # t = 3 / (1 / sqrt 3) = 5.196 on 2 degrees of freedom, two-sided p = 0.0351.
    a = {2: 64.0, 0: 43.0, 1: 52.0}
    b = {0: 40.0, 1: 50.0, 2: 60.0}
    diffs = stats.paired_differences(a, b, a_name="dense", b_name="slice")
    assert diffs == {0: 3.0, 1: 2.0, 2: 4.0} and list(diffs) == [0, 1, 2]
    p = stats.paired_t_pvalue(diffs.values())
    assert p == pytest.approx(0.035099, abs=1e-6)
    assert p == pytest.approx(scipy_stats.ttest_rel([43, 52, 64], [40, 50, 60]).pvalue)
    # Unpaired, the same numbers are far from significant: pairing is what the seed buys.
    assert scipy_stats.ttest_ind([43, 52, 64], [40, 50, 60]).pvalue > 0.5
    assert stats.per_seed_text(diffs) == "3.0000 2.0000 4.0000"


def test_paired_test_edge_cases():
    assert math.isnan(stats.paired_t_pvalue([1.5]))
    assert stats.paired_t_pvalue([2.0, 2.0, 2.0]) == 0.0  # no spread, non-zero mean: t infinite
    assert stats.paired_t_pvalue([0.0, 0.0]) == 1.0
    assert stats.paired_t_pvalue([1.0, -1.0]) == pytest.approx(1.0)


def test_mismatched_seeds_are_named():
    with pytest.raises(LRCError, match=r"dense with slice.*seed\(s\) 2 only in dense; seed\(s\) 5 only in slice"):
        stats.paired_differences({0: 1.0, 2: 1.0}, {0: 1.0, 5: 1.0}, a_name="dense", b_name="slice")
    with pytest.raises(LRCError, match="no seed"):
        stats.paired_differences({}, {}, a_name="dense", b_name="slice")


def test_seeds_for_power_matches_the_textbook_and_a_simulation():
    # Cohen's d = 1, paired, two-sided 5 %, 80 % power: 10 pairs (power 0.803; 9 give 0.76)
    assert stats.seeds_for_power(1.0, 1.0) == 10 and stats.seeds_for_power(-2.0, 2.0) == 10
    assert stats.paired_t_power(9, 1.0, 1.0) < 0.8 <= stats.paired_t_power(10, 1.0, 1.0)
    # the rejection rate of simulated paired t-tests at n = 10, d = 1 (seeded; its sd is 0.004)
    rng = np.random.default_rng(0)
    samples = rng.normal(1.0, 1.0, size=(10_000, 10))
    rate = float(np.mean(scipy_stats.ttest_1samp(samples, 0.0, axis=1).pvalue < 0.05))
    assert rate == pytest.approx(stats.paired_t_power(10, 1.0, 1.0), abs=0.015)
    # a spread five times the gap needs many seeds; no spread or no gap: no number; hopeless: inf
    assert 150 < stats.seeds_for_power(1.0, 5.0) < 250
    assert math.isnan(stats.seeds_for_power(1.0, 0.0)) and math.isnan(stats.seeds_for_power(0.0, 1.0))
    assert math.isnan(stats.seeds_for_power(1.0, float("nan")))
    assert stats.seeds_for_power(1.0, 1000.0) == math.inf


def test_paired_bootstrap_on_known_samples():
    # the same difference on every row: the statistic and both ends of its interval are that difference
    same = stats.paired_bootstrap([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], [1, 1, 1])
    assert (same.difference, same.low, same.high, same.p, same.rows) == pytest.approx((0.5, 0.5, 0.5, 0.0, 3))
    # per-token means weight rows by their tokens: (3 - 1) / 4 tokens
    assert stats.paired_bootstrap([0.0, 1.0], [2.0, 1.0], [3, 1]).difference == pytest.approx(0.5)
    # many rows of unit weight: the percentile interval is close to the t interval, and seeded
    rng = np.random.default_rng(1)
    b = rng.normal(0.2, 1.0, size=2000)
    boot = stats.paired_bootstrap(np.zeros(2000), b, np.ones(2000))
    t = stats.t_interval(b)
    assert boot.low == pytest.approx(t.low, abs=0.01) and boot.high == pytest.approx(t.high, abs=0.01)
    assert boot.p < 1e-3 and boot == stats.paired_bootstrap(np.zeros(2000), b, np.ones(2000))
    null = stats.paired_bootstrap(np.zeros(200), rng.normal(0.0, 1.0, size=200), np.ones(200))
    assert null.low < 0 < null.high and null.p > 0.05
    with pytest.raises(LRCError, match="two or more paired rows"):
        stats.paired_bootstrap([1.0], [1.0], [1])
