"""The "before session j" point of ACC, forgetting, BWT and FWT, on a real run of ``vanilla+init`` (whose
``begin_session`` changes the head before update 0): session 2's before point is the deployed model's
accuracy, and the metrics read it (not the update-0 point) in a hand computation."""

from __future__ import annotations

import copy

import pytest

from bench_stability_gap.harness.results import cl_metrics
from bench_stability_gap.harness.run.continual import run_cl
from bench_stability_gap.harness.run.evaluation import eval_plan, evaluate
from bench_stability_gap.harness.run.options import RunOptions
from bench_stability_gap.methods.registry import build_method


@pytest.fixture(scope="module")
def init_run(tmp_path_factory, small_workbench):
    """vanilla+init on the reduced tiny protocol, and the deployed model's own accuracies on session 2."""
    bench, protocol = small_workbench, small_workbench.protocol
    options = RunOptions(results_dir=tmp_path_factory.mktemp("before"), progress=False, log=False)
    deployed = copy.deepcopy(bench.deployed).eval()
    plan = eval_plan(bench.stream, bench.stream.sessions[0])
    alone = evaluate(lambda x: deployed(x), bench.test_inputs, plan, protocol.eval.batch_size)
    _, method = build_method("vanilla+init", protocol)
    curves, _, _ = run_cl(bench, method, 0, options)
    return curves, alone


def test_session_2_before_point_is_the_deployed_model(init_run) -> None:
    curves, alone = init_run
    before = curves[0].before
    assert before is not None
    assert (before.old, before.new, before.all, before.tasks) == (alone.old, alone.new, alone.all, alone.tasks)
    # the deployed head has no units for session 2's classes: nothing of them is right before the session
    assert before.tasks[1] == 0.0 and before.new == 0.0
    # the update-0 point is after begin_session: the data-driven init already classifies new classes there
    assert curves[0].new[0] > 0.0


def test_later_before_points_are_the_previous_sessions_end(init_run) -> None:
    curves, _ = init_run
    for prev, cur in zip(curves, curves[1:]):
        assert cur.before is not None
        assert cur.before.tasks[:-1] == [t[-1] for t in prev.tasks]
        assert cur.before.tasks[-1] == 0.0


def test_forgetting_bwt_fwt_read_the_before_points_by_hand(init_run) -> None:
    curves, alone = init_run
    n = curves[-1].session
    end = {c.session: [t[-1] for t in c.tasks] for c in curves}  # R[i][k] = end[i][k-1]
    r11 = alone.tasks[0]  # the deployed model on the pre-training classes
    rkk = {1: r11, **{k: end[k][k - 1] for k in range(2, n)}}
    bwt = sum(end[n][k - 1] - rkk[k] for k in range(1, n)) / (n - 1)
    best = {k: max([r11] * (k == 1) + [end[l][k - 1] for l in range(max(k, 2), n)]) for k in range(1, n)}
    forgetting = sum(best[k] - end[n][k - 1] for k in range(1, n)) / (n - 1)
    fwt = sum(c.before.tasks[c.session - 1] for c in curves) / (n - 1)
    assert cl_metrics.backward_transfer(curves) == pytest.approx(bwt, abs=1e-12)
    assert cl_metrics.average_forgetting(curves) == pytest.approx(forgetting, abs=1e-12)
    assert cl_metrics.forward_transfer(curves) == pytest.approx(fwt, abs=1e-12) == 0.0
    assert cl_metrics.final_task_accuracy(curves) == pytest.approx(sum(end[n]) / n, abs=1e-12)
    # what the update-0 reading gave instead, for the record of what changed
    print(f"\nR11 before {r11:.4f} vs update 0 {curves[0].tasks[0][0]:.4f}; FWT 0 vs update-0 reading "
          f"{sum(c.tasks[c.session - 1][0] for c in curves) / (n - 1):.4f}; BWT {bwt:.4f}")
