"""Intervals, paired tests and Holm's adjustment, on cases whose answer is worked out by hand."""

from __future__ import annotations

import math

import pytest

from bench_stability_gap.harness.results.uncertainty import (BOOTSTRAP_MIN_N, BOOTSTRAP_SEED, MAX_SEEDS, Interval,
                                                             against_baseline, bootstrap_ci, holm, mean_interval,
                                                             paired_difference, paired_power, paired_t_p,
                                                             seeds_needed, t_interval)


def test_bootstrap_interval_hand_checked() -> None:
    # Resampling [0, 0, 0, 0, 1]: the mean is X/5 with X ~ Binomial(5, 0.2).
    # P(X = 0) = 0.328 > 2.5 %, so the 2.5 % quantile is 0.0;
    # P(X <= 2) = 0.942 < 97.5 % <= P(X <= 3) = 0.993, so the 97.5 % quantile is 3/5 = 0.6.
    # With 10,000 resamples the empirical cut points lie far inside those masses (seed: BOOTSTRAP_SEED).
    assert BOOTSTRAP_SEED == 0
    assert bootstrap_ci([0.0, 0.0, 0.0, 0.0, 1.0]) == Interval(0.0, pytest.approx(0.6))


def test_bootstrap_is_reproducible_needs_two_values_and_is_never_the_rule_for_few() -> None:
    values = [0.11, 0.18, 0.13, 0.2]
    assert bootstrap_ci(values) == bootstrap_ci(list(values))  # fixed seed: same interval every build
    assert bootstrap_ci([0.5]) is None and bootstrap_ci([]) is None
    assert bootstrap_ci([0.5, float("nan")]) is None  # a missing value is not resampled
    assert BOOTSTRAP_MIN_N == 10 and mean_interval(values, "bootstrap") == t_interval(values)
    many = [0.1 * k for k in range(12)]
    assert mean_interval(many, "bootstrap") == bootstrap_ci(many)


def test_t_interval_hand_checked() -> None:
    # [1, 2, 3]: mean 2, s = 1, n = 3, t(2, 0.975) = 4.302653: half-width 4.302653 / sqrt(3) = 2.484138
    assert t_interval([1.0, 2.0, 3.0]) == Interval(pytest.approx(2 - 2.484138, abs=1e-6),
                                                   pytest.approx(2 + 2.484138, abs=1e-6))
    # [0, 1]: mean 0.5, s = 0.7071, t(1, 0.975) = 12.7062: half-width 12.7062 * 0.5 = 6.3531
    assert t_interval([0.0, 1.0]).high == pytest.approx(0.5 + 6.353102, abs=1e-6)
    assert t_interval([0.5]) is None and t_interval([0.5, None, float("nan")]) is None


def test_paired_difference_on_shared_seeds() -> None:
    # seeds 0-2 are shared (seed 3 only in the baseline): differences 0.2, 0.3, 0.1 -> mean 0.2, s = 0.1,
    # t = 0.2 / (0.1 / sqrt 3) = 3.4641 on 2 df: two-sided p = 0.07418; interval 0.2 ± 4.302653 * 0.057735
    p = paired_difference({0: 0.3, 1: 0.5, 2: 0.4}, {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.9})
    assert p is not None and p.seeds == (0, 1, 2)
    assert p.mean == pytest.approx(0.2)
    assert p.interval == Interval(pytest.approx(0.2 - 0.248414, abs=1e-6), pytest.approx(0.2 + 0.248414, abs=1e-6))
    assert p.p == pytest.approx(0.07418, abs=1e-5)
    assert p.inconclusive  # p > 0.05, and the t interval holds 0 (the bootstrap's [0.1, 0.3] did not)
    assert paired_difference({5: 0.1}, {0: 0.1}) is None  # no seed in common
    one = paired_difference({0: 0.4}, {0: 0.1})
    assert one is not None and one.p is None and one.interval is None and one.inconclusive


def test_paired_t_p_edges() -> None:
    assert paired_t_p([0.1]) is None
    assert paired_t_p([0.0, 0.0]) == 1.0 and paired_t_p([0.1, 0.1]) == 0.0  # no spread: the sign decides


def test_holm_hand_checked() -> None:
    # m = 3: 0.01 * 3 = 0.03, 0.02 * 2 = 0.04, 0.04 * 1 = 0.04 (kept monotone); None is not in the family
    assert holm([0.04, None, 0.01, 0.02]) == [pytest.approx(0.04), None, pytest.approx(0.03), pytest.approx(0.04)]
    # monotone: 0.03 * 2 = 0.06 > 0.05 * 1, so the larger p is raised to 0.06 as well
    assert holm([0.05, 0.03]) == [pytest.approx(0.06), pytest.approx(0.06)]
    assert holm([0.9, 0.8]) == [1.0, 1.0]


def test_power_and_seeds_needed() -> None:
    # a one-sd effect at n = 10, alpha 0.05: power 0.8031 (noncentral t; G*Power gives 0.803)
    assert paired_power(1.0, 10) == pytest.approx(0.8031, abs=1e-3)
    assert paired_power(1.0, 9) < 0.8 <= paired_power(1.0, 10)
    # differences with mean = sd (effect 1): 10 seeds reach 80 % power
    diffs = [0.0, 1.0, 2.0]  # mean 1, sd 1
    assert seeds_needed(diffs) == 10
    assert seeds_needed(diffs, alpha=0.05 / 3) > 10  # Holm's strictest level needs more
    assert seeds_needed([0.0, 0.0, 0.0]) is None and seeds_needed([0.3]) is None
    assert seeds_needed([-1.0, 1.001]) == MAX_SEEDS + 1  # effect 0.0007: beyond any count
    assert seeds_needed([1.0, 1.1, 0.9, 1.05, 0.95]) is None  # effect 12.6 on 5 seeds: enough already


def test_against_baseline_adjusts_over_the_rows() -> None:
    base = {0: 0.0, 1: 0.0, 2: 0.0}
    rows = {"a": {0: 1.0, 1: 1.1, 2: 0.9}, "b": {0: 0.1, 1: -0.1, 2: 0.3}, "c": {0: 0.5}}
    out = against_baseline(rows, base)
    a, b, c = out["a"], out["b"], out["c"]
    # a: t = 1 / (0.1 / sqrt 3) = 17.32, p = 0.003317; b: t = 0.1 / (0.2 / sqrt 3) = 0.866, p = 0.4778
    assert a.p == pytest.approx(0.003317, abs=1e-5) and b.p == pytest.approx(0.4778, abs=1e-4)
    assert a.p_holm == pytest.approx(2 * a.p) and b.p_holm == pytest.approx(max(2 * a.p, b.p))
    assert a.family == b.family == 2 and c.p is None and c.inconclusive
    assert not a.inconclusive and b.inconclusive
    assert b.needed is not None and b.needed > 3 and a.needed is None
    assert math.isclose(b.mean, 0.1)
