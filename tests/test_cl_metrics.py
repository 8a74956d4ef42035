"""The standard CL metrics (ACC, Ā, F, BWT, FWT) pinned against hand-computed accuracy matrices."""

from __future__ import annotations

import pytest

from bench_stability_gap.harness.results import cl_metrics
from bench_stability_gap.harness.results.curves import BeforePoint, ReferenceSession, SessionCurve
from bench_stability_gap.harness.results.catalog import CURVE_METRICS, METRICS, OPTIONAL_KEYS
from bench_stability_gap.harness.results.metrics import compute_metrics
from bench_stability_gap.harness.results.tidy import VALUE_KEYS, run_values

from results_factory import hand_result


def session(j: int, tasks: list[list[float]], before: list[float] | None = None) -> SessionCurve:
    n = len(tasks[0])
    point = None if before is None else BeforePoint(old=before[0], new=before[-1], all=before[0], tasks=before)
    return SessionCurve(session=j, total_updates=10, updates=[0, 5, 10][:n], old=tasks[0], new=tasks[-1],
                        all=tasks[0], tasks=tasks, before=point)


# Three tasks (pre-training, sessions 2 and 3). The mid-session dips (0.5, 0.4, 0.3) are not in R: the
# standard metrics read end-of-session accuracies only. The update-0 points (0.9 and 0.1 in session 2,
# 0.05 on task 3 in session 3) are after begin_session, as a data-driven head init leaves them: R never
# reads them, it reads the "before" points (the model each session starts from).
CURVES = [
    session(2, [[0.9, 0.5, 0.8], [0.1, 0.6, 0.7]], before=[0.95, 0.0]),
    session(3, [[0.8, 0.4, 0.6], [0.7, 0.3, 0.5], [0.05, 0.5, 0.9]], before=[0.8, 0.7, 0.0]),
]
# R11 = 0.95 (the deployed model); R12 = 0.0 (task 2 on the deployed model, which has no units for it)
# R21 = 0.8, R22 = 0.7; R23 = 0.0
# R31 = 0.6, R32 = 0.5, R33 = 0.9


def test_accuracy_matrix_reads_end_of_session_and_before_points() -> None:
    r = cl_metrics.accuracy_matrix(list(reversed(CURVES)))
    assert r == {(1, 1): 0.95, (1, 2): 0.0, (2, 1): 0.8, (2, 2): 0.7, (2, 3): 0.0,
                 (3, 1): 0.6, (3, 2): 0.5, (3, 3): 0.9}


def test_standard_metrics_hand_computed() -> None:
    # ACC = (0.6 + 0.5 + 0.9) / 3 = 2/3
    assert cl_metrics.final_task_accuracy(CURVES) == pytest.approx(2 / 3)
    # A2 = (0.8 + 0.7) / 2 = 0.75, A3 = 2/3 -> Ā = (0.75 + 2/3) / 2 = 17/24
    assert cl_metrics.average_task_accuracy(CURVES) == pytest.approx(17 / 24)
    # F: task 1 max(0.95, 0.8) - 0.6 = 0.35, task 2 0.7 - 0.5 = 0.2 -> 0.275
    assert cl_metrics.average_forgetting(CURVES) == pytest.approx(0.275)
    # BWT: (0.6 - 0.95) + (0.5 - 0.7) over 2 -> -0.275
    assert cl_metrics.backward_transfer(CURVES) == pytest.approx(-0.275)
    # FWT: (R12 + R23) / 2 = 0; with b = 0.05 each: -0.05
    assert cl_metrics.forward_transfer(CURVES) == pytest.approx(0.0)
    assert cl_metrics.forward_transfer(CURVES, {2: 0.05, 3: 0.05}) == pytest.approx(-0.05)


def test_results_without_before_points_leave_forgetting_bwt_fwt_out() -> None:
    """A result stored before the "before" point was recorded: ACC and Ā as ever, the rest None."""
    old = [c.model_copy(update={"before": None}) for c in CURVES]
    assert cl_metrics.accuracy_matrix(old) == {(2, 1): 0.8, (2, 2): 0.7, (3, 1): 0.6, (3, 2): 0.5, (3, 3): 0.9}
    assert cl_metrics.final_task_accuracy(old) == pytest.approx(2 / 3)
    assert cl_metrics.average_task_accuracy(old) == pytest.approx(17 / 24)
    assert cl_metrics.average_forgetting(old) is None and cl_metrics.backward_transfer(old) is None
    assert cl_metrics.forward_transfer(old) is None
    joint = [ReferenceSession(session=j, old=0.9, new=0.9, all=0.9, tasks=[0.9] * j) for j in (2, 3)]
    assert set(compute_metrics(old, joint, {2: 0.7, 3: 0.9}).standard) == {"acc", "avg_acc"}


def test_forgetting_and_bwt_differ_when_a_task_improves_then_falls() -> None:
    # task 1 rises from 0.5 (R11) to 0.9 (R21) and ends at 0.7 (R31): forgetting counts the fall from the
    # best (0.2), BWT the net change since it was learned (+0.2); task 2: 0.6 -> 0.6, none of either
    curves = [session(2, [[0.5, 0.9], [0.0, 0.6]], before=[0.5, 0.0]),
              session(3, [[0.9, 0.7], [0.6, 0.6], [0.0, 0.8]], before=[0.9, 0.6, 0.0])]
    assert cl_metrics.average_forgetting(curves) == pytest.approx(0.1)
    assert cl_metrics.backward_transfer(curves) == pytest.approx(0.1)


def test_a_missing_session_is_an_error() -> None:
    with pytest.raises(ValueError, match="sessions 2..N"):
        cl_metrics.backward_transfer([CURVES[1]])


def test_curve_metrics_are_declared_once_and_flow_everywhere() -> None:
    """Each catalog entry with a ``compute`` is stored by compute_metrics, logged by scalars(), a tidy
    column in % and an optional leaderboard column."""
    keys = {m.key for m in CURVE_METRICS}
    assert keys == {"acc", "avg_acc", "forgetting", "bwt", "fwt"} and keys <= set(OPTIONAL_KEYS)
    joint = [ReferenceSession(session=j, old=0.9, new=0.9, all=0.9, tasks=[0.9] * j) for j in (2, 3)]
    m = compute_metrics(CURVES, joint, {2: 0.7, 3: 0.9})
    assert m.standard == pytest.approx({"acc": 2 / 3, "avg_acc": 17 / 24, "forgetting": 0.275, "bwt": -0.275,
                                        "fwt": 0.0})
    assert {k: m.scalars()[k] for k in keys} == pytest.approx(m.standard)
    assert keys <= set(VALUE_KEYS)
    assert METRICS["forgetting"].direction == "min" and METRICS["bwt"].direction == "max"
    values = run_values(hand_result("r1", curves=CURVES), m)
    assert values["bwt"] == pytest.approx(-27.5) and values["acc"] == pytest.approx(200 / 3)

