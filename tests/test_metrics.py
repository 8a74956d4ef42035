"""Every metric pinned against a hand-computed case; the arithmetic is in the comments."""

from __future__ import annotations

import pydantic
import pytest

from bench_stability_gap.harness.results.curves import BeforePoint, ReferenceSession, SessionCurve
from bench_stability_gap.harness.results.metrics import (
    Metrics,
    alpha,
    best_new_accuracy,
    compute_metrics,
    continual_knowledge_gap,
    flops_to_best_new,
    min_acc,
    mu,
    omega,
    plasticity_gap,
    recovery_flops,
    recovery_updates,
    TimeToResult,
    sigma,
    stability_gap,
    time_to_result,
    updates_to_best_new,
    wc_acc,
)


def curve(
    session: int,
    updates: list[int],
    old: list[float],
    new: list[float] | None = None,
    all: list[float] | None = None,  # noqa: A002 - the field's name
    tasks: list[list[float]] | None = None,
    train_flops: list[float] | None = None,
) -> SessionCurve:
    """A session curve; by default every old task follows ``old`` and the last task is ``new``."""
    n = len(updates)
    new = new if new is not None else [0.0] * n
    return SessionCurve(
        session=session,
        total_updates=updates[-1],
        updates=updates,
        old=old,
        new=new,
        all=all if all is not None else old,
        tasks=tasks if tasks is not None else [old] * (session - 1) + [new],
        train_flops=train_flops,
    )


def ref(session: int, old: float = 1.0, new: float = 1.0, all: float = 1.0) -> ReferenceSession:  # noqa: A002
    """A joint reference; like ``curve``, every old task is at ``old`` and the last task at ``new``."""
    return ReferenceSession(session=session, old=old, new=new, all=all, tasks=[old] * (session - 1) + [new])


# ------------------------------------------------------------------------------------------ Ω


def test_omega_evenly_spaced_is_the_plain_mean() -> None:
    # points 2, 4, 6 (weights 2/6 each = 1/3): (0.4 + 0.6 + 0.8) / 3 = 0.6; / 0.8 = 0.75
    assert omega([0, 2, 4, 6], [0.1, 0.4, 0.6, 0.8], 0.8) == pytest.approx(0.75)


def test_omega_ignores_the_update_zero_point() -> None:
    # same curve as above with the update-0 accuracy changed from 0.1 to 0.9: still 0.75
    # (had it counted: (0.9 + 0.4 + 0.6 + 0.8) / 4 / 0.8 = 0.84375)
    assert omega([0, 2, 4, 6], [0.9, 0.4, 0.6, 0.8], 0.8) == pytest.approx(0.75)


def test_omega_weights_uneven_points_by_updates_since_previous() -> None:
    # points 1, 2, 4, 8 -> weights (1, 1, 2, 4) / 8:
    # (1*0.2 + 1*0.4 + 2*0.6 + 4*0.8) / 8 = (0.2 + 0.4 + 1.2 + 3.2) / 8 = 5.0 / 8 = 0.625
    # (the plain mean would be (0.2 + 0.4 + 0.6 + 0.8) / 4 = 0.5)
    assert omega([0, 1, 2, 4, 8], [0.0, 0.2, 0.4, 0.6, 0.8], 1.0) == pytest.approx(0.625)


@pytest.mark.parametrize(
    ("updates", "acc", "reference", "match"),
    [
        ([0, 5], [0.5, 0.5], 0.0, "reference"),
        ([0], [0.5], 1.0, "after update 0"),
        ([1, 5], [0.5, 0.5], 1.0, "update 0"),
        ([0, 5, 5], [0.5, 0.5, 0.5], 1.0, "increasing"),
        ([0, 5], [0.5], 1.0, "accuracies"),
    ],
)
def test_omega_rejects_bad_input(updates: list[int], acc: list[float], reference: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        omega(updates, acc, reference)


# ------------------------------------------------------------------------------- the three gaps


def test_stability_gap_averages_omega_over_sessions() -> None:
    curves = [
        # Ω_2 = (0.6 + 0.8) / 2 / 0.8 = 0.7 / 0.8 = 0.875
        curve(2, [0, 5, 10], old=[0.9, 0.6, 0.8]),
        # Ω_3 = (0.7 + 0.7) / 2 / 0.7 = 1.0
        curve(3, [0, 5, 10], old=[0.1, 0.7, 0.7]),
    ]
    # joint refs given out of order: matched by session, not position
    joint = [ref(3, old=0.7), ref(2, old=0.8)]
    # S = 1 - (0.875 + 1.0) / 2 = 1 - 0.9375 = 0.0625
    assert stability_gap(curves, joint) == pytest.approx(0.0625)


def test_gap_is_negative_when_better_than_joint() -> None:
    # Ω_2 = (0.9 + 0.9) / 2 / 0.75 = 1.2 -> S = 1 - 1.2 = -0.2 (backward transfer)
    curves = [curve(2, [0, 5, 10], old=[0.75, 0.9, 0.9])]
    assert stability_gap(curves, [ref(2, old=0.75)]) == pytest.approx(-0.2)


def test_continual_knowledge_gap_reads_all_and_joint_all() -> None:
    curves = [
        # Ω_2 = (0.3 + 0.6) / 2 / 0.6 = 0.75
        curve(2, [0, 5, 10], old=[0.9, 0.9, 0.9], all=[0.5, 0.3, 0.6]),
        # Ω_3 = (0.4 + 0.4) / 2 / 0.8 = 0.5
        curve(3, [0, 5, 10], old=[0.9, 0.9, 0.9], all=[0.5, 0.4, 0.4]),
    ]
    joint = [ref(2, old=0.9, all=0.6), ref(3, old=0.9, all=0.8)]
    # CK = 1 - (0.75 + 0.5) / 2 = 0.375; old matches joint exactly, so S = 0
    assert continual_knowledge_gap(curves, joint) == pytest.approx(0.375)
    assert stability_gap(curves, joint) == pytest.approx(0.0)


def test_plasticity_gap_normalizes_by_best_new() -> None:
    curves = [
        # Ω_2 = (0.4 + 0.8) / 2 / 0.8 = 0.75
        curve(2, [0, 5, 10], old=[0.9] * 3, new=[0.0, 0.4, 0.8]),
        # Ω_3 = (0.25 + 0.5) / 2 / 0.5 = 0.75
        curve(3, [0, 5, 10], old=[0.9] * 3, new=[0.0, 0.25, 0.5]),
    ]
    # P = 1 - (0.75 + 0.75) / 2 = 0.25
    assert plasticity_gap(curves, {2: 0.8, 3: 0.5}) == pytest.approx(0.25)


def test_plasticity_gap_is_undefined_while_no_run_learned_a_session() -> None:
    # session 3's new classes: no run ever got one test image right, so A_best = 0 and Ω has no scale
    curves = [curve(2, [0, 5, 10], old=[0.9] * 3, new=[0.0, 0.4, 0.8]), curve(3, [0, 5, 10], old=[0.9] * 3)]
    assert plasticity_gap(curves, {2: 0.8, 3: 0.0}) is None
    m = compute_metrics(curves, [ref(2), ref(3)], {2: 0.8, 3: 0.0})
    assert m.P_delta is None and m.S_delta == pytest.approx(0.1)
    assert m.updates_to_best_new == [10, None] and "P_delta" not in m.scalars()


def test_missing_reference_is_an_error_naming_the_session() -> None:
    curves = [curve(2, [0, 5], old=[0.5, 0.5]), curve(3, [0, 5], old=[0.5, 0.5])]
    with pytest.raises(ValueError, match="session 3"):
        stability_gap(curves, [ref(2)])
    with pytest.raises(ValueError, match="session 3"):
        continual_knowledge_gap(curves, [ref(2)])
    with pytest.raises(ValueError, match="session 2"):
        plasticity_gap(curves, {3: 0.5})
    with pytest.raises(ValueError, match="session 2"):
        stability_gap(curves, [ref(2), ref(2), ref(3)])


@pytest.mark.parametrize("sessions", [[2, 4], [3], [2, 2], []])
def test_curves_must_be_sessions_two_to_n_once_each(sessions: list[int]) -> None:
    curves = [curve(s, [0, 5], old=[0.5, 0.5]) for s in sessions]
    with pytest.raises(ValueError, match="session"):
        stability_gap(curves, [ref(s) for s in set(sessions)])


def test_best_new_accuracy_is_max_over_runs_and_points() -> None:
    run_a = [curve(2, [0, 5, 10], old=[0.9] * 3, new=[0.0, 0.5, 0.7]),
             curve(3, [0, 5, 10], old=[0.9] * 3, new=[0.0, 0.4, 0.6])]
    run_b = [curve(2, [0, 5, 10], old=[0.9] * 3, new=[0.0, 0.8, 0.6]),
             curve(3, [0, 5, 10], old=[0.9] * 3, new=[0.0, 0.3, 0.5])]
    # session 2: max(0.7, 0.8) = 0.8 (run B, mid-session); session 3: max(0.6, 0.5) = 0.6 (run A)
    assert best_new_accuracy([run_a, run_b]) == pytest.approx({2: 0.8, 3: 0.6})
    assert best_new_accuracy([]) == {}


# ------------------------------------------------------------------------------- σ, μ, α


def test_sigma_mu_alpha_read_end_of_session_values() -> None:
    s2 = curve(2, [0, 5], old=[0.9, 0.7], all=[0.5, 0.6], tasks=[[0.9, 0.7], [0.0, 0.4]])
    s3 = curve(3, [0, 5], old=[0.6, 0.65], all=[0.5, 0.4],
               tasks=[[0.6, 0.75], [0.6, 0.55], [0.0, 0.3]])
    curves = [s3, s2]  # order does not matter
    assert sigma(curves) == pytest.approx(0.75)  # last session's task 1 at its last point
    assert mu(curves) == pytest.approx(0.5)  # (0.6 + 0.4) / 2
    assert alpha(curves) == pytest.approx(0.4)  # last session's all[-1]


# ------------------------------------------------------------------------------- recovery


RECOVERY = curve(2, [0, 10, 20, 30, 40], old=[0.80, 0.50, 0.70, 0.79, 0.82],
                 train_flops=[1000.0, 1100.0, 1200.0, 1300.0, 1400.0])


@pytest.mark.parametrize(
    ("fraction", "expected"),
    [
        (0.97, 30),  # threshold 0.776: first below at 10 (0.50), back at 30 (0.79)
        (0.98, 30),  # threshold 0.784: 0.79 >= 0.784 at 30
        (0.99, 40),  # threshold 0.792: 0.79 is still below, 0.82 at 40
        (1.00, 40),  # threshold 0.80: the update-0 0.80 is not below (>=); 0.82 at 40
    ],
)
def test_recovery_updates_counts_updates_to_get_back(fraction: float, expected: int) -> None:
    assert recovery_updates(RECOVERY, 0.8, fraction) == expected


def test_recovery_is_zero_without_a_dip_and_none_without_recovery() -> None:
    flat = curve(2, [0, 10, 20], old=[0.80, 0.79, 0.81])
    # threshold 0.98 * 0.8 = 0.784: never below -> 0 (no stability gap)
    assert recovery_updates(flat, 0.8, 0.98) == 0
    # threshold 1.0 * 0.85 = 0.85: below at 0 and never back -> None
    assert recovery_updates(flat, 0.85, 1.0) is None


def test_recovery_counts_the_update_zero_point() -> None:
    # below at update 0 (0.5 < 0.784): not "no gap"; back at the next point, 10
    started_low = curve(2, [0, 10, 20], old=[0.5, 0.9, 0.9])
    assert recovery_updates(started_low, 0.8, 0.98) == 10


def test_recovery_is_the_first_return_after_the_first_dip() -> None:
    # threshold 0.8: dips at 10, back at 20, dips again at 30, back at 40 -> 20
    twice = curve(2, [0, 10, 20, 30, 40], old=[0.9, 0.5, 0.8, 0.5, 0.9])
    assert recovery_updates(twice, 0.8, 1.0) == 20


def test_recovery_flops_are_spent_in_session_at_the_recovery_point() -> None:
    # 0.97 recovers at point 3: 1300 - 1000 (the session's start) = 300
    assert recovery_flops(RECOVERY, 0.8, 0.97) == pytest.approx(300.0)
    # 1.0 * 0.5 = 0.5: the minimum 0.50 is not below -> point 0 -> 0 FLOPs (not 1000)
    assert recovery_updates(RECOVERY, 0.5, 1.0) == 0
    assert recovery_flops(RECOVERY, 0.5, 1.0) == pytest.approx(0.0)
    # 1.0 * 0.9: never back -> None
    assert recovery_flops(RECOVERY, 0.9, 1.0) is None
    no_flops = curve(2, [0, 10], old=[0.5, 0.9])
    assert recovery_updates(no_flops, 0.8, 1.0) == 10
    assert recovery_flops(no_flops, 0.8, 1.0) is None


def test_updates_and_flops_to_best_new() -> None:
    c = curve(2, [0, 10, 20, 30], old=[0.9] * 4, new=[0.0, 0.5, 0.79, 0.8],
              train_flops=[0.0, 5.0, 10.0, 15.0])
    # default 0.99 * 0.8 = 0.792: 0.79 is short, 0.8 at 30
    assert updates_to_best_new(c, 0.8) == 30
    assert flops_to_best_new(c, 0.8) == pytest.approx(15.0)
    # 0.98 * 0.8 = 0.784: 0.79 at 20
    assert updates_to_best_new(c, 0.8, 0.98) == 20
    assert flops_to_best_new(c, 0.8, 0.98) == pytest.approx(10.0)
    # 0.99 * 0.9 = 0.891: never
    assert updates_to_best_new(c, 0.9) is None
    assert flops_to_best_new(c, 0.9) is None


# --------------------------------------------------------------------------- time to result

# A FLOP-budgeted run: eval points placed by compute (uneven in updates), FLOPs cumulative over the run
# (session 3 starts 0.1 TFLOPs after session 2 ended: its begin_session's cost, before its update-0 point).
FLOP_RUN = [
    curve(2, [0, 3, 7, 12, 20], old=[0.85, 0.40, 0.70, 0.80, 0.84], new=[0.0, 0.30, 0.55, 0.62, 0.60],
          train_flops=[5.0e12, 5.3e12, 5.7e12, 6.2e12, 7.0e12]),
    curve(3, [0, 4, 9, 18], old=[0.70, 0.50, 0.60, 0.65], new=[0.0, 0.2, 0.5, 0.58],
          train_flops=[7.1e12, 7.5e12, 8.0e12, 8.9e12]),
]
FLOP_JOINT = [ref(2, old=0.82), ref(3, old=0.80)]
FLOP_BEST = {2: 0.62, 3: 0.60}  # A_best: session 3's from another run


def test_time_to_result_of_a_flop_budgeted_run() -> None:
    # s2 old: threshold 0.99 * 0.82 = 0.8118; 0.85 at update 0 is above, below at 3, back at 20 (0.84)
    #   -> 20 updates, 7.0e12 - 5.0e12 = 2.0e12 FLOPs (from the session's update-0 point, not from 0)
    # s3 old: threshold 0.792; 0.70 is below at update 0 and never back -> not reached
    # s2 new: threshold 0.99 * 0.62 = 0.6138 -> 0.62 at 12: 12 updates, 6.2e12 - 5.0e12 = 1.2e12 FLOPs
    # s3 new: threshold 0.594; best 0.58 -> not reached (its own best would count it reached at 18: Fig. 5)
    ttr = time_to_result(FLOP_RUN, FLOP_JOINT, FLOP_BEST)
    assert ttr == TimeToResult(old_updates=[20, None], old_flops=[2.0e12, None],
                               new_updates=[12, None], new_flops=[1.2e12, None])
    assert updates_to_best_new(FLOP_RUN[1], max(FLOP_RUN[1].new)) == 18
    m = compute_metrics(FLOP_RUN, FLOP_JOINT, FLOP_BEST)
    assert m.time_to_result == ttr
    # the run's numbers: mean over the sessions reached (1 of 2 each), TFLOPs in 10^12
    assert m.value("ttr_old_updates") == 20 and m.value("ttr_old_tflops") == pytest.approx(2.0)
    assert m.value("ttr_new_updates") == 12 and m.value("ttr_new_tflops") == pytest.approx(1.2)
    assert m.reached("ttr_old_updates") == [20.0] and m.sessions == 2
    assert "ttr_old_updates_s3" not in m.scalars()  # not reached: left out, never logged as a number


def test_time_to_result_of_an_update_budgeted_run() -> None:
    # even eval points every 5 updates, FLOPs counted from 0
    # s2 old: threshold 0.99 * 0.8 = 0.792, never below -> 0 updates, 0 FLOPs: reached at once (no gap)
    # s3 old: threshold 0.792: below at 5 (0.6), back at 15 (0.8) -> 15 updates, 450 - 300 = 150 FLOPs
    # s2 new: threshold 0.99 * 0.5 = 0.495 -> 0.5 at 10: 10 updates, 100 FLOPs
    # s3 new: threshold 0.99 * 0.9 = 0.891 -> 0.9 at 5: 5 updates, 50 FLOPs
    run = [curve(2, [0, 5, 10], old=[0.80, 0.81, 0.795], new=[0.0, 0.3, 0.5], train_flops=[0.0, 50.0, 100.0]),
           curve(3, [0, 5, 10, 15], old=[0.9, 0.6, 0.7, 0.8], new=[0.0, 0.9, 0.9, 0.9],
                 train_flops=[300.0, 350.0, 400.0, 450.0])]
    m = compute_metrics(run, [ref(2, old=0.8), ref(3, old=0.8)], {2: 0.5, 3: 0.9})
    assert m.time_to_result == TimeToResult(old_updates=[0, 15], old_flops=[0.0, 150.0],
                                            new_updates=[10, 5], new_flops=[100.0, 50.0])
    assert m.value("ttr_old_updates") == 7.5 and m.value("ttr_old_tflops") == pytest.approx(75e-12)
    assert m.value("ttr_new_updates") == 7.5 and m.value("ttr_new_tflops") == pytest.approx(75e-12)


def test_time_to_result_never_reached_is_none_not_zero() -> None:
    # old stays below 0.99 * 0.9; no run learned session 2's new classes (A_best 0): nothing to reach
    run = [curve(2, [0, 5, 10], old=[0.5, 0.4, 0.6], new=[0.0, 0.0, 0.0], train_flops=[0.0, 5.0, 10.0])]
    m = compute_metrics(run, [ref(2, old=0.9)], {2: 0.0})
    assert m.time_to_result == TimeToResult(old_updates=[None], old_flops=[None], new_updates=[None], new_flops=[None])
    for key in ("ttr_old_updates", "ttr_old_tflops", "ttr_new_updates", "ttr_new_tflops"):
        assert m.value(key) is None and m.reached(key) == []
    assert not any(k.startswith("ttr_") for k in m.scalars())


# ------------------------------------------------------------------------ De Lange et al.


DE_LANGE = [
    curve(2, [0, 5, 10], old=[0.9, 0.6, 0.8],
          tasks=[[0.9, 0.6, 0.8],     # T1
                 [0.0, 0.5, 0.7]]),   # T2 (being learned: does not count)
    curve(3, [0, 5, 10], old=[0.7, 0.6, 0.7],
          tasks=[[0.75, 0.7, 0.8],    # T1
                 [0.4, 0.55, 0.65],   # T2 (learned at the end of session 2)
                 [0.0, 0.3, 0.6]]),   # T3 = T_k
]


def test_min_acc_takes_each_task_worst_after_it_was_learned() -> None:
    # T1: every point of sessions 2 and 3: min(0.9, 0.6, 0.8, 0.75, 0.7, 0.8) = 0.6
    # T2: points of session 3 only, update 0 included: min(0.4, 0.55, 0.65) = 0.4
    #     (session 2's 0.0 is before T2 was learned)
    # min-ACC = (0.6 + 0.4) / 2 = 0.5
    assert min_acc(DE_LANGE) == pytest.approx(0.5)


def test_wc_acc_weights_final_task_by_one_over_k() -> None:
    # k = 3, a(T_3, final) = 0.6: 0.6 / 3 + (2 / 3) * 0.5 = 0.2 + 0.3333... = 0.5333...
    assert wc_acc(DE_LANGE) == pytest.approx(0.6 / 3 + 2 * 0.5 / 3)


def test_min_and_wc_acc_with_one_session() -> None:
    one = [curve(2, [0, 5, 10], old=[0.9, 0.3, 0.8], tasks=[[0.9, 0.3, 0.8], [0.0, 0.6, 0.7]])]
    # only T1, over session 2's points: min = 0.3; WC = 0.7 / 2 + 0.3 / 2 = 0.5
    assert min_acc(one) == pytest.approx(0.3)
    assert wc_acc(one) == pytest.approx(0.5)


def test_s_delta_and_min_acc_rank_runs_differently() -> None:
    """The paper's appendix "Reasons for New Metrics": only a joint reference tells them apart."""
    joint = [ref(2, old=0.8)]
    # A dips once to 0.2 but otherwise matches joint (0.8)
    run_a = [curve(2, [0, 10, 20, 30, 40], old=[0.8, 0.2, 0.8, 0.8, 0.8])]
    # B never dips but sits at 0.5 throughout
    run_b = [curve(2, [0, 10, 20, 30, 40], old=[0.5, 0.5, 0.5, 0.5, 0.5])]
    # S_A = 1 - (0.2 + 3 * 0.8) / 4 / 0.8 = 1 - 0.65 / 0.8 = 0.1875; S_B = 1 - 0.5 / 0.8 = 0.375
    assert stability_gap(run_a, joint) == pytest.approx(0.1875)
    assert stability_gap(run_b, joint) == pytest.approx(0.375)
    # min-ACC_A = 0.2, min-ACC_B = 0.5 (higher is better)
    assert min_acc(run_a) == pytest.approx(0.2)
    assert min_acc(run_b) == pytest.approx(0.5)
    # S_Δ prefers A (smaller gap), min-ACC prefers B
    assert stability_gap(run_a, joint) < stability_gap(run_b, joint)
    assert min_acc(run_a) < min_acc(run_b)


# ------------------------------------------------------------------------------- all together


FULL = [
    curve(2, [0, 5, 10], old=[0.9, 0.6, 0.8], new=[0.0, 0.5, 0.7], all=[0.6, 0.6, 0.8],
          tasks=[[0.9, 0.6, 0.8], [0.0, 0.5, 0.7]], train_flops=[0.0, 40.0, 90.0]),
    curve(3, [0, 5, 10], old=[0.74, 0.73, 0.74], new=[0.0, 0.6, 0.55], all=[0.5, 0.5, 0.7],
          tasks=[[0.75, 0.7, 0.8], [0.4, 0.55, 0.65], [0.0, 0.6, 0.55]],
          train_flops=[90.0, 130.0, 170.0]),
]
# the model each session starts from: the deployed one (0.9 on task 1), then session 2's end (0.8, 0.7);
# never any accuracy on the classes it has no units for yet
FULL = [FULL[0].model_copy(update={"before": BeforePoint(old=0.9, new=0.0, all=0.9, tasks=[0.9, 0.0])}),
        FULL[1].model_copy(update={"before": BeforePoint(old=0.75, new=0.0, all=0.6, tasks=[0.8, 0.7, 0.0])})]
FULL_JOINT = [ref(2, old=0.8, new=0.9, all=0.8), ref(3, old=0.75, new=0.8, all=0.7)]
FULL_BEST = {2: 0.7, 3: 0.6}

# S:  Ω2 = (0.6 + 0.8) / 2 / 0.8 = 7/8;  Ω3 = (0.73 + 0.74) / 2 / 0.75 = 0.98
#     S = 1 - (0.875 + 0.98) / 2 = 0.0725
# P:  Ω2 = (0.5 + 0.7) / 2 / 0.7 = 6/7;  Ω3 = (0.6 + 0.55) / 2 / 0.6 = 23/24
#     P = 1 - (144/168 + 161/168) / 2 = 1 - 305/336 = 31/336
# CK: Ω2 = (0.6 + 0.8) / 2 / 0.8 = 7/8;  Ω3 = (0.5 + 0.7) / 2 / 0.7 = 6/7
#     CK = 1 - (49/56 + 48/56) / 2 = 1 - 97/112 = 15/112
# σ = 0.8 (s3 T1 last);  μ = (0.8 + 0.7) / 2 = 0.75;  α = 0.7
# min-ACC: T1 min(0.9, 0.6, 0.8, 0.75, 0.7, 0.8) = 0.6, T2 min(0.4, 0.55, 0.65) = 0.4 -> 0.5
# WC-ACC = 0.55 / 3 + (2/3) * 0.5 = 1.55 / 3
# recovery s2 (joint 0.8, old 0.9 0.6 0.8): below at 5 for every fraction, back at 10 (0.8 >= 0.8)
#   -> 10 and 90 - 0 = 90 FLOPs
# recovery s3 (joint 0.75, old 0.74 0.73 0.74):
#   97: 0.7275, never below -> 0, 0 FLOPs
#   98: 0.735, below at 5 (0.73), back at 10 (0.74) -> 10, 170 - 90 = 80 FLOPs
#   99: 0.7425 and 100: 0.75, never reached -> None
# best new: s2 0.99 * 0.7 = 0.693 -> 10 (0.7), 90 FLOPs; s3 0.99 * 0.6 = 0.594 -> 5 (0.6), 40 FLOPs
# time to result (99 %; old: all old classes vs. A_joint old; new: vs. A_best = FULL_BEST):
#   old s2 = recovery_99 s2 = 10 updates, 90 FLOPs; old s3: 0.74 < 0.7425 at update 0, never back -> not reached
#   new s2 = 10 updates, 90 FLOPs; new s3 = 5 updates, 40 FLOPs (as best new above: FULL_BEST is each run's own best)
#   means over the sessions reached: old 10 updates, 90e-12 TFLOPs (1 of 2); new 7.5 updates, 65e-12 TFLOPs (2 of 2)
# R (end-of-session accuracy per task): R11 0.9 (s2's before point: the deployed model), R21 0.8 R22 0.7,
#   R31 0.8 R32 0.65 R33 0.55; R12 = R23 = 0 (before points: no units yet for the new classes)
# ACC = (0.8 + 0.65 + 0.55) / 3 = 2/3;  Ā = ((0.8 + 0.7) / 2 + 2/3) / 2 = 17/24
# F = ((0.9 - 0.8) + (0.7 - 0.65)) / 2 = 0.075;  BWT = ((0.8 - 0.9) + (0.65 - 0.7)) / 2 = -0.075;  FWT = 0
FULL_SCALARS = {
    "S_delta": 0.0725, "P_delta": 31 / 336, "CK_delta": 15 / 112,
    "sigma": 0.8, "mu": 0.75, "alpha": 0.7, "min_acc": 0.5, "wc_acc": 1.55 / 3,
    "recovery_97_s2": 10, "recovery_97_s3": 0,
    "recovery_98_s2": 10, "recovery_98_s3": 10,
    "recovery_99_s2": 10,
    "recovery_100_s2": 10,
    "recovery_flops_97_s2": 90, "recovery_flops_97_s3": 0,
    "recovery_flops_98_s2": 90, "recovery_flops_98_s3": 80,
    "recovery_flops_99_s2": 90,
    "recovery_flops_100_s2": 90,
    "updates_to_best_new_s2": 10, "updates_to_best_new_s3": 5,
    "flops_to_best_new_s2": 90, "flops_to_best_new_s3": 40,
    "acc": 2 / 3, "avg_acc": 17 / 24, "forgetting": 0.075, "bwt": -0.075, "fwt": 0.0,
    "ttr_old_updates_s2": 10, "ttr_old_tflops_s2": 90e-12, "ttr_old_updates": 10, "ttr_old_tflops": 90e-12,
    "ttr_new_updates_s2": 10, "ttr_new_updates_s3": 5, "ttr_new_tflops_s2": 90e-12, "ttr_new_tflops_s3": 40e-12,
    "ttr_new_updates": 7.5, "ttr_new_tflops": 65e-12,
}


def test_compute_metrics_fills_everything() -> None:
    m = compute_metrics(FULL, FULL_JOINT, FULL_BEST, recovery_on="old")  # recovery as above: all old classes
    assert m.recovery_updates == {"97": [10, 0], "98": [10, 10], "99": [10, None], "100": [10, None]}
    # whole-number FLOP differences are exact in floating point
    assert m.recovery_flops == {"97": [90.0, 0.0], "98": [90.0, 80.0], "99": [90.0, None], "100": [90.0, None]}
    assert m.updates_to_best_new == [10, 5]
    assert m.flops_to_best_new == pytest.approx([90.0, 40.0])
    assert m.time_to_result == TimeToResult(old_updates=[10, None], old_flops=[90.0, None],
                                            new_updates=[10, 5], new_flops=[90.0, 40.0])
    assert m.scalars() == pytest.approx(FULL_SCALARS, rel=1e-9, abs=0)


def test_compute_metrics_without_flops_leaves_them_out() -> None:
    no_flops = [c.model_copy(update={"train_flops": None}) for c in FULL]
    m = compute_metrics(list(reversed(no_flops)), FULL_JOINT, FULL_BEST, recovery_on="old")
    assert m.recovery_flops is None
    assert m.flops_to_best_new is None
    assert m.S_delta == pytest.approx(0.0725)
    # time to result in updates stays; in TFLOPs it is not recorded (None), never 0
    assert m.time_to_result == TimeToResult(old_updates=[10, None], old_flops=None, new_updates=[10, 5], new_flops=None)
    assert m.value("ttr_old_tflops") is None and m.reached("ttr_old_tflops") is None
    expected = {k: v for k, v in FULL_SCALARS.items() if "flops" not in k}
    assert m.scalars() == pytest.approx(expected)


def test_recovery_reads_the_pretraining_classes_and_speed_each_runs_own_best_by_default() -> None:
    # Recovery on task 1 only (the paper's ImageNet-1K): s2's task 1 is its old curve (as above);
    # s3's task 1 is 0.75 0.7 0.8 against the joint's task 1, 0.75 (ref: every old task at 0.75):
    # every threshold (<= 0.75) is crossed below at 5 (0.7) and regained at 10 (0.8) -> 10, 170 - 90 = 80.
    # (On all old classes, 0.74 0.73 0.74, 99 % and 100 % were never regained.)
    m = compute_metrics(FULL, FULL_JOINT, FULL_BEST)
    assert m.recovery_updates == {"97": [10, 10], "98": [10, 10], "99": [10, 10], "100": [10, 10]}
    assert m.recovery_flops == {"97": [90.0, 80.0], "98": [90.0, 80.0], "99": [90.0, 80.0], "100": [90.0, 80.0]}
    # Speed: 99 % of the run's own best new accuracy (s2 0.7 -> 0.693 at 10), not of the best of all runs
    # (say 0.9 -> 0.891, never reached).
    best_of_all = {2: 0.9, 3: 0.6}
    assert compute_metrics(FULL, FULL_JOINT, best_of_all).updates_to_best_new == [10, 5]
    assert compute_metrics(FULL, FULL_JOINT, best_of_all, speed_reference="all_runs").updates_to_best_new == [None, 5]


def test_compute_metrics_needs_every_reference() -> None:
    with pytest.raises(ValueError, match="session 3"):
        compute_metrics(FULL, FULL_JOINT, {2: 0.7})
    with pytest.raises(ValueError, match="session 2"):
        compute_metrics(FULL, FULL_JOINT[1:], FULL_BEST)


def test_metrics_model_rejects_extra_fields_and_bad_shapes() -> None:
    good = compute_metrics(FULL, FULL_JOINT, FULL_BEST).model_dump()
    with pytest.raises(pydantic.ValidationError, match="extra"):
        Metrics(**good, omega=1.0)
    with pytest.raises(pydantic.ValidationError, match="keyed"):
        Metrics(**{**good, "recovery_updates": {"99": [10, None]}})
    with pytest.raises(pydantic.ValidationError, match="one value per session"):
        Metrics(**{**good, "flops_to_best_new": [1.0]})
    assert Metrics(**good) == compute_metrics(FULL, FULL_JOINT, FULL_BEST)
