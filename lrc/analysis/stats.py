"""Statistics over seeds: mean, sample sd, Student's t interval, paired differences and tests,
and Holm's correction over a family of tests.

Every claim and results table is a handful of seeds (3 in the claims run), so the intervals are
Student's t with n - 1 degrees of freedom, not a normal or a bootstrap approximation. A
comparison of two arms pairs them by seed (same seed = same data order and, in the workflow, warm
start), which removes their share of the variance from the difference. NaN values (a measure an
evaluation did not produce) are left out and the count says how many remain; one value gives a mean and
a blank (NaN) interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from lrc.errors import LRCError

LEVEL = 0.95
EQUIVALENCE_LEVEL = 0.90  # two one-sided tests at 5 % each: the 90 % interval inside the margin
CI_METHOD = "Student's t, 95 %, n - 1 degrees of freedom over seeds"


def finite(values: Iterable[float]) -> list[float]:
    """The values that are numbers (None and NaN left out)."""
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def mean(values: Iterable[float]) -> float:
    kept = finite(values)
    return sum(kept) / len(kept) if kept else float("nan")


def sample_sd(values: Iterable[float]) -> float:
    """Standard deviation with n - 1 in the denominator; NaN below two values."""
    kept = finite(values)
    if len(kept) < 2:
        return float("nan")
    m = sum(kept) / len(kept)
    return math.sqrt(sum((v - m) ** 2 for v in kept) / (len(kept) - 1))


def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided Student's t critical value: t_{(1 + level)/2, df} (4.3027 for df 2)."""
    from scipy import (
        stats as scipy_stats,  # lazily: the base layer stays light to import
    )

    return float(scipy_stats.t.ppf(0.5 + level / 2, df))


@dataclass(frozen=True)
class Interval:
    """The mean of n values and its t interval (low/high NaN for n < 2)."""

    mean: float
    low: float
    high: float
    n: int
    sd: float

    @property
    def excludes_zero(self) -> bool | None:
        """True/False where there is an interval, None where there is none."""
        if math.isnan(self.low) or math.isnan(self.high):
            return None
        return self.low > 0 or self.high < 0


def t_interval(values: Iterable[float], level: float = LEVEL) -> Interval:
    kept = finite(values)
    m, sd, n = mean(kept), sample_sd(kept), len(kept)
    if n < 2:
        return Interval(m, float("nan"), float("nan"), n, sd)
    half = t_quantile(n - 1, level) * sd / math.sqrt(n)
    return Interval(m, m - half, m + half, n, sd)


def paired_differences(a: Mapping[int, float], b: Mapping[int, float], *, a_name: str = "a",
                       b_name: str = "b") -> dict[int, float]:
    """``a[seed] - b[seed]`` for every seed, in seed order; both must hold the same seeds."""
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_a or only_b:
        parts = [f"seed(s) {', '.join(map(str, s))} only in {name}"
                 for s, name in ((only_a, a_name), (only_b, b_name)) if s]
        raise LRCError(f"cannot pair {a_name} with {b_name} by seed: {'; '.join(parts)}")
    if not a:
        raise LRCError(f"cannot pair {a_name} with {b_name}: no seed in either")
    return {seed: float(a[seed]) - float(b[seed]) for seed in sorted(a)}


def paired_t_pvalue(differences: Iterable[float]) -> float:
    """Two-sided p-value of the paired t-test (the one-sample t-test of the differences
    against 0). NaN below two differences; with no spread it is 0 for a non-zero mean
    (t is infinite) and 1 for a zero mean."""
    kept = finite(differences)
    n = len(kept)
    if n < 2:
        return float("nan")
    m, sd = mean(kept), sample_sd(kept)
    if sd == 0:
        return 0.0 if m != 0 else 1.0
    from scipy import stats as scipy_stats

    t = m / (sd / math.sqrt(n))
    return float(2 * scipy_stats.t.sf(abs(t), n - 1))


@dataclass(frozen=True)
class Bootstrap:
    """A per-token difference of two models over paired rows, its percentile interval and two-sided p."""

    difference: float
    low: float
    high: float
    p: float
    rows: int


def paired_bootstrap(a: Sequence[float], b: Sequence[float], weights: Sequence[float], level: float = LEVEL,
                     resamples: int = 10_000, seed: int = 0) -> Bootstrap:
    """``Σb/Σw − Σa/Σw`` over paired rows (a row's sums under A and B, its token count ``w``), with the
    percentile interval of the same statistic over rows resampled with replacement (seeded) and
    the two-sided bootstrap p: twice the smaller share of resampled differences on either side of 0."""
    import numpy as np

    a, b, w = (np.asarray(x, dtype=np.float64) for x in (a, b, weights))
    if not (len(a) == len(b) == len(w)) or len(w) < 2:
        raise LRCError(f"paired bootstrap: need two or more paired rows, got {len(a)}, {len(b)} and {len(w)} weights")
    if w.sum() <= 0:
        raise LRCError("paired bootstrap: the rows hold no tokens")
    picks = np.random.default_rng(seed).integers(0, len(w), size=(resamples, len(w)))
    sampled = (b - a)[picks].sum(1) / np.maximum(w[picks].sum(1), 1e-12)
    tail = (1 - level) / 2
    low, high = np.quantile(sampled, [tail, 1 - tail])
    p = min(1.0, 2 * min(float(np.mean(sampled <= 0)), float(np.mean(sampled >= 0))))
    return Bootstrap(float((b - a).sum() / w.sum()), float(low), float(high), p, len(w))


POWER = 0.80
MAX_SEEDS = 10_000


def paired_t_power(n: int, effect: float, sd: float, alpha: float = 1 - LEVEL) -> float:
    """The chance that a two-sided paired t-test at ``alpha`` over ``n`` seeds rejects 0 when the true
    mean difference is ``effect`` and the per-seed differences spread with ``sd`` (noncentral t)."""
    from scipy import stats as scipy_stats

    df, shift = n - 1, effect * math.sqrt(n) / sd
    crit = scipy_stats.t.ppf(1 - alpha / 2, df)
    return float(scipy_stats.nct.sf(crit, df, shift) + scipy_stats.nct.cdf(-crit, df, shift))


def seeds_for_power(effect: float, sd: float, power: float = POWER, alpha: float = 1 - LEVEL) -> float:
    """The fewest seeds (at least 2) at which a paired t-test detects a true difference ``effect``
    with probability ``power``, given the per-seed differences' ``sd``; NaN where ``sd`` or ``effect``
    is not a positive number, inf beyond ``MAX_SEEDS``."""
    if not (sd > 0 and abs(effect) > 0) or math.isnan(sd) or math.isnan(effect):
        return float("nan")
    if paired_t_power(MAX_SEEDS, effect, sd, alpha) < power:
        return math.inf
    low, high = 1, MAX_SEEDS  # power grows with n: bisect for the first n that reaches it
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if paired_t_power(mid, effect, sd, alpha) < power else (low, mid)
    return float(max(high, 2))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given; NaN entries stay NaN and are not
    counted in the family. Rejecting where the adjusted p is below alpha keeps the chance of any
    false rejection in the family at most alpha."""
    kept = sorted((float(p), i) for i, p in enumerate(p_values) if p is not None and not math.isnan(float(p)))
    adjusted, running = [float("nan")] * len(p_values), 0.0
    for rank, (p, i) in enumerate(kept):
        running = max(running, min(1.0, (len(kept) - rank) * p))
        adjusted[i] = running
    return adjusted


def per_seed_text(values: Mapping[int, float], digits: int = 4) -> str:
    """The per-seed values, space-separated in seed order (``nan`` for a missing measure)."""
    return " ".join(f"{float(values[s]):.{digits}f}" for s in sorted(values))
