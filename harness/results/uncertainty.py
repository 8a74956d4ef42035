"""Uncertainty over seeds: percentile bootstrap confidence intervals and paired differences.

A table of mean ± std cannot tell a 0.005 difference from noise; an interval can. With the few seeds a
CL benchmark affords (3-5) a bootstrap interval is rough, and it says so by being wide.

The resampling is seeded (``BOOTSTRAP_SEED``, numpy's PCG64 via ``default_rng``), so the same values
give the same interval on every build and every machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_SEED = 0
BOOTSTRAP_RESAMPLES = 10_000
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def bootstrap_ci(values: Sequence[float], level: float = LEVEL, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> Interval | None:
    """Percentile bootstrap interval of the mean: ``resamples`` means of n values drawn with replacement,
    cut at (1 − level)/2 and (1 + level)/2. None for fewer than two finite values (no spread to resample)."""
    xs = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(xs) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = xs[rng.integers(0, len(xs), size=(resamples, len(xs)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(low), float(high))


@dataclass(frozen=True)
class Paired:
    """``method − baseline`` on the seeds both have: the mean difference, its interval, the seeds used."""

    mean: float
    interval: Interval | None
    seeds: tuple[int, ...]

    @property
    def inconclusive(self) -> bool:
        """The interval contains 0 (or there is none): the data cannot tell the two apart."""
        return self.interval is None or self.interval.contains(0.0)


def paired_difference(method: Mapping[int, float | None], baseline: Mapping[int, float | None]) -> Paired | None:
    """Per-seed differences on the shared seeds (same seed: same class order, same data), bootstrapped;
    None when no seed has a value in both."""
    seeds = tuple(sorted(s for s in method.keys() & baseline.keys()
                         if method[s] is not None and baseline[s] is not None
                         and math.isfinite(method[s]) and math.isfinite(baseline[s])))  # type: ignore[arg-type]
    if not seeds:
        return None
    diffs = [float(method[s]) - float(baseline[s]) for s in seeds]  # type: ignore[arg-type]
    return Paired(sum(diffs) / len(diffs), bootstrap_ci(diffs), seeds)
