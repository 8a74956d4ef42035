"""Bootstrap intervals and paired differences, on cases whose answer is worked out by hand."""

from __future__ import annotations

import pytest

from bench_stability_gap.harness.results.uncertainty import BOOTSTRAP_SEED, Interval, bootstrap_ci, paired_difference


def test_bootstrap_interval_hand_checked() -> None:
    # Resampling [0, 0, 0, 0, 1]: the mean is X/5 with X ~ Binomial(5, 0.2).
    # P(X = 0) = 0.328 > 2.5 %, so the 2.5 % quantile is 0.0;
    # P(X <= 2) = 0.942 < 97.5 % <= P(X <= 3) = 0.993, so the 97.5 % quantile is 3/5 = 0.6.
    # With 10,000 resamples the empirical cut points lie far inside those masses (seed: BOOTSTRAP_SEED).
    assert BOOTSTRAP_SEED == 0
    assert bootstrap_ci([0.0, 0.0, 0.0, 0.0, 1.0]) == Interval(0.0, pytest.approx(0.6))


def test_bootstrap_is_reproducible_and_needs_two_values() -> None:
    values = [0.11, 0.18, 0.13, 0.2]
    assert bootstrap_ci(values) == bootstrap_ci(list(values))  # fixed seed: same interval every build
    assert bootstrap_ci([0.5]) is None and bootstrap_ci([]) is None
    assert bootstrap_ci([0.5, float("nan")]) is None  # a missing value is not resampled


def test_paired_difference_on_shared_seeds() -> None:
    # seeds 0-2 are shared (seed 3 only in the baseline): differences 0.2, 0.3, 0.1 -> mean 0.2.
    # Resampling three values, all-lowest has probability 1/27 = 3.7 % > 2.5 %: interval [0.1, 0.3], no 0.
    p = paired_difference({0: 0.3, 1: 0.5, 2: 0.4}, {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.9})
    assert p is not None and p.seeds == (0, 1, 2)
    assert p.mean == pytest.approx(0.2)
    assert p.interval == Interval(pytest.approx(0.1), pytest.approx(0.3))
    assert not p.inconclusive
    # differences -0.1 and +0.2: each resample is -0.1, 0.05 or 0.2; the interval [-0.1, 0.2] holds 0
    q = paired_difference({0: 0.4, 1: 0.7}, {0: 0.5, 1: 0.5})
    assert q is not None and q.interval == Interval(pytest.approx(-0.1), pytest.approx(0.2)) and q.inconclusive
    assert paired_difference({5: 0.1}, {0: 0.1}) is None  # no seed in common
