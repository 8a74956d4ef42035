"""Uncertainty over seeds: Student-t intervals of a mean, paired t tests against the baseline with Holm's
correction over a board's comparisons, and the seeds a comparison would need.

The rule (the glossary states it too): a board's means get a Student-t interval with n − 1 degrees of
freedom; a row's difference with the protocol's baseline is taken seed by seed on the seeds both have
(same seed: same class order, same data), and gets a paired-t interval and a two-sided p-value; the
p-values of one column's comparisons on a board are Holm-adjusted, and ``n.s.`` means the adjusted p is
at least 0.05. Both assume the per-seed values (differences) are roughly normal and independent across
seeds; with 2-5 seeds nothing can check that, and the intervals are wide because they must be.

A percentile bootstrap of the mean (``bootstrap_ci``) is kept for whoever wants it, with at least
``BOOTSTRAP_MIN_N`` values only: with 3 seeds it is the values' range, which covers the true mean 75 % of the
time (for values symmetric about it), not 95 %.
Its resampling is seeded (``BOOTSTRAP_SEED``, numpy's PCG64), so it is the same on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

BOOTSTRAP_SEED = 0
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_MIN_N = 10  # below this a percentile bootstrap under-covers badly; the t interval is the rule
LEVEL = 0.95
ALPHA = 1 - LEVEL
POWER = 0.80  # a comparison below this power at its observed spread says how many seeds it would need
MAX_SEEDS = 1000  # beyond this, "more than 1000": the difference is too small for its spread to pin down


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def _finite(values: Sequence[float | None]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)


def t_interval(values: Sequence[float | None], level: float = LEVEL) -> Interval | None:
    """Student-t interval of the mean: mean ± t(n−1, (1+level)/2) · s/√n, s the sample standard deviation.
    Exact coverage for normal, independent values; None below two finite values (no spread to scale)."""
    xs = _finite(values)
    if len(xs) < 2:
        return None
    half = float(stats.t.ppf((1 + level) / 2, len(xs) - 1) * xs.std(ddof=1) / math.sqrt(len(xs)))
    m = float(xs.mean())
    return Interval(m - half, m + half)


def bootstrap_ci(values: Sequence[float | None], level: float = LEVEL, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> Interval | None:
    """Percentile bootstrap interval of the mean: ``resamples`` means of n values drawn with replacement,
    cut at (1 − level)/2 and (1 + level)/2. None for fewer than two finite values (no spread to resample).
    Not the default anywhere: below ``BOOTSTRAP_MIN_N`` values it is far narrower than its level says."""
    xs = _finite(values)
    if len(xs) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = xs[rng.integers(0, len(xs), size=(resamples, len(xs)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(low), float(high))


def mean_interval(values: Sequence[float | None], method: str = "t", level: float = LEVEL) -> Interval | None:
    """The interval of a mean by ``method``: ``t`` (the rule), or ``bootstrap`` where there are at least
    ``BOOTSTRAP_MIN_N`` values (below that, the t interval all the same)."""
    if method == "bootstrap" and len(_finite(values)) >= BOOTSTRAP_MIN_N:
        return bootstrap_ci(values, level)
    if method not in ("t", "bootstrap"):
        raise ValueError(f"interval method must be 't' or 'bootstrap', not {method!r}")
    return t_interval(values, level)


def paired_t_p(diffs: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t test that the mean difference is 0 (n − 1 degrees of freedom);
    None below two differences. No spread at all: 1 when every difference is 0, else 0."""
    xs = np.asarray(diffs, dtype=float)
    if len(xs) < 2:
        return None
    sd = float(xs.std(ddof=1))
    if sd == 0:
        return 1.0 if float(xs.mean()) == 0 else 0.0
    t = float(xs.mean()) / (sd / math.sqrt(len(xs)))
    return float(2 * stats.t.sf(abs(t), len(xs) - 1))


def paired_power(effect: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t test at level ``alpha`` with n pairs, for a true mean difference of
    ``effect`` standard deviations of the differences (the noncentral t distribution)."""
    if n < 2:
        return 0.0
    df, crit = n - 1, float(stats.t.ppf(1 - alpha / 2, n - 1))
    nc = abs(effect) * math.sqrt(n)
    upper, lower = float(stats.nct.sf(crit, df, nc)), float(stats.nct.cdf(-crit, df, nc))
    # far in the tail scipy's noncentral t can return NaN for a probability that is 0 (or 1) to machine precision
    upper = upper if math.isfinite(upper) else 1.0
    lower = lower if math.isfinite(lower) else 0.0
    return min(1.0, upper + lower)


def observed_power(diffs: Sequence[float], alpha: float = ALPHA) -> float | None:
    """The paired t test's power with the seeds at hand, for a true difference of the size seen at the spread
    seen (both taken as if known: with few seeds, a rough figure). None where nothing can be said: one seed,
    no difference seen, or no spread (the test then decides outright)."""
    xs = np.asarray(diffs, dtype=float)
    if len(xs) < 2 or float(xs.mean()) == 0 or float(xs.std(ddof=1)) == 0:
        return None
    return paired_power(float(xs.mean()) / float(xs.std(ddof=1)), len(xs), alpha)


def seeds_needed(diffs: Sequence[float], alpha: float = ALPHA, power: float = POWER) -> int | None:
    """The smallest seed count at which the paired t test reaches ``power`` for a true difference of the
    size seen, at the spread seen (both taken as if known: with few seeds, a rough planning figure).
    None when the seeds at hand already reach it or nothing can be said (one seed, or no difference seen);
    ``MAX_SEEDS + 1`` when even ``MAX_SEEDS`` would not."""
    xs = np.asarray(diffs, dtype=float)
    if len(xs) < 2 or float(xs.mean()) == 0:
        return None
    sd = float(xs.std(ddof=1))
    if sd == 0:
        return None  # no spread: the test already decides
    effect = float(xs.mean()) / sd
    if paired_power(effect, len(xs), alpha) >= power:
        return None
    if paired_power(effect, MAX_SEEDS, alpha) < power:
        return MAX_SEEDS + 1
    low, high = len(xs), MAX_SEEDS  # power grows with n: below ``low`` it falls short, at ``high`` it holds
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if paired_power(effect, mid, alpha) >= power else (mid, high)
    return high


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (None: no test, not counted in the family):
    the k-th smallest of m is multiplied by m − k + 1, kept monotone and capped at 1."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m, out = len(tested), list[float | None]([None] * len(pvalues))
    running = 0.0
    for k, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - k) * p))
        out[i] = running
    return out


@dataclass(frozen=True)
class Paired:
    """``method − baseline`` on the seeds both have: the mean difference, its paired-t interval, the seeds
    used, the test's p-value, its Holm-adjusted value over the board's comparisons of the same column
    (``p`` alone until ``against_baseline`` adjusts it), the test's power at the seeds used (``observed_power``,
    at Holm's strictest level once adjusted) and, where that is below ``POWER``, the seeds it would need."""

    mean: float
    interval: Interval | None
    seeds: tuple[int, ...]
    p: float | None = None
    p_holm: float | None = None
    needed: int | None = None
    family: int = 1  # comparisons in the Holm family
    power: float | None = None

    @property
    def inconclusive(self) -> bool:
        """No test (one seed), or the adjusted p is at least 0.05: the data cannot tell the two apart."""
        p = self.p_holm if self.p_holm is not None else self.p
        return p is None or p >= ALPHA


def _diffs(method: Mapping[int, float | None], baseline: Mapping[int, float | None]) -> dict[int, float]:
    diffs: dict[int, float] = {}
    for s in sorted(method.keys() & baseline.keys()):
        a, b = method[s], baseline[s]
        if a is not None and b is not None and math.isfinite(a) and math.isfinite(b):
            diffs[s] = float(a) - float(b)
    return diffs


def paired_difference(method: Mapping[int, float | None], baseline: Mapping[int, float | None]) -> Paired | None:
    """Per-seed differences on the shared seeds (same seed: same class order, same data), their paired-t
    interval and p-value; None when no seed has a value in both."""
    diffs = _diffs(method, baseline)
    if not diffs:
        return None
    xs = list(diffs.values())
    return Paired(sum(xs) / len(xs), t_interval(xs), tuple(diffs), paired_t_p(xs), needed=seeds_needed(xs),
                  power=observed_power(xs))


def against_baseline(rows: Mapping[str, Mapping[int, float | None]],
                     baseline: Mapping[int, float | None]) -> dict[str, Paired | None]:
    """Every row's paired difference with the baseline on one column, Holm-adjusted over the rows that
    have a test; the power and the seeds needed are taken at Holm's strictest level, 0.05 / m."""
    paired = {name: paired_difference(values, baseline) for name, values in rows.items()}
    tested = {n: p for n, p in paired.items() if p is not None}
    adjusted = holm([p.p for p in tested.values()])
    m = sum(p is not None for p in adjusted)
    for (name, p), p_holm in zip(tested.items(), adjusted):
        diffs = list(_diffs(rows[name], baseline).values())
        level = ALPHA / max(m, 1)
        paired[name] = replace(p, p_holm=p_holm, family=max(m, 1), needed=seeds_needed(diffs, level),
                               power=observed_power(diffs, level))
    return paired
