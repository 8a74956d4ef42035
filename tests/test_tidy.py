"""The tidy frames: hand-built results in, exact rows out; seed statistics and the MLflow curves CSV."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from results_factory import hand_result, joint_run, two_session_run

from bench_stability_gap.harness.results.metrics import best_new_accuracy, compute_metrics
from bench_stability_gap.harness.results.tidy import curves_frame, references_frame, run_values, runs_frame, seed_stats
from bench_stability_gap.harness.results.tracking import curves_csv


def test_curves_frame_has_one_row_per_run_session_and_eval_point() -> None:
    frame = curves_frame([two_session_run("r1"), joint_run("j1")], labels={"r1": "vanilla [lr=0.1]"})
    assert len(frame) == 5  # 3 points in session 2 + 2 in session 3; the joint run has no curves
    rows = frame[["session", "point", "update", "total_updates", "fraction", "global_update", "old", "new", "all",
                  "task_1", "task_2"]].to_numpy().tolist()
    assert rows == [
        [2, 0, 0, 4, 0.0, 0, 0.9, 0.0, 0.45, 0.9, 0.0],
        [2, 1, 2, 4, 0.5, 2, 0.5, 0.6, 0.55, 0.5, 0.6],
        [2, 2, 4, 4, 1.0, 4, 0.8, 0.7, 0.75, 0.8, 0.7],
        [3, 0, 0, 6, 0.0, 4, 0.7, 0.1, 0.5, 0.8, 0.6],  # session 3 starts where session 2's 4 updates end
        [3, 1, 3, 6, 0.5, 7, 0.6, 0.9, 0.7, 0.65, 0.55],
    ]
    # task 3 is only seen from session 3 on; no FLOPs recorded
    assert frame["task_3"].isna().tolist() == [True, True, True, False, False]
    assert frame["task_3"].iloc[3:].tolist() == [0.1, 0.9]
    assert frame["train_flops"].isna().all()
    # per-run constants on every row, the row label as given, fractions shown as % (scale 100)
    assert set(frame["method"]) == {"vanilla [lr=0.1]"} and set(frame["method_spec"]) == {"vanilla"}
    assert set(frame["run_id"]) == {"r1"} and set(frame["seed"]) == {0} and set(frame["scale"]) == {100.0}
    assert set(frame["protocol_hash"]) == {"h" * 16}


def test_curves_frame_sorts_sessions_and_keeps_percent_runs_at_scale_1() -> None:
    r = two_session_run("r1")
    pct = hand_result("p1", curves=[c.model_copy(update={"old": [v * 100 for v in c.old]}) for c in reversed(r.curves)])
    frame = curves_frame([pct])
    assert frame["session"].tolist() == [2, 2, 2, 3, 3]
    assert frame["global_update"].tolist() == [0, 2, 4, 4, 7]
    assert set(frame["scale"]) == {1.0}


def test_references_frame_has_one_row_per_joint_session() -> None:
    frame = references_frame([joint_run("j1", seed=3), two_session_run("r1")])
    assert frame[["run_id", "seed", "session", "old", "new", "all", "task_1"]].to_numpy().tolist() == [
        ["j1", 3, 2, 0.9, 0.8, 0.85, 0.9],
        ["j1", 3, 3, 0.88, 0.9, 0.89, 0.87],
    ]
    assert math.isnan(frame["task_3"].iloc[0]) and frame["task_3"].iloc[1] == 0.9


def test_run_values_and_runs_frame() -> None:
    run, joint = two_session_run("r1"), joint_run("j1")
    metrics = compute_metrics(run.curves, joint.reference, best_new_accuracy([run.curves]))
    values = run_values(run, metrics)
    assert values["params"] == 1.5 and values["updates"] == 10.0 and values["wall"] == 12.5
    assert values["tflops"] is None  # FLOPs not recorded
    assert values["sigma"] == pytest.approx(65.0)  # task 1 at the last point of the last session, in %
    assert values["alpha"] == pytest.approx(70.0) and values["mu"] == pytest.approx(72.5)  # (75 + 70) / 2
    assert values["S_delta"] == metrics.S_delta
    # a joint reference: σ and α of its last session, no gaps
    jv = run_values(joint, None)
    assert jv["sigma"] == pytest.approx(87.0) and jv["alpha"] == pytest.approx(89.0) and jv["S_delta"] is None
    frame = runs_frame([run, joint], metrics={"r1": metrics}, labels={"r1": "vanilla [x=1]"})
    assert frame["run_id"].tolist() == ["r1", "j1"]
    assert frame["method"].tolist() == ["vanilla [x=1]", "joint"]
    assert frame["is_reference"].tolist() == [False, True]
    assert frame.loc[0, "S_delta"] == metrics.S_delta and math.isnan(frame.loc[1, "S_delta"])


def test_seed_stats_mean_std_count_per_method() -> None:
    frame = pd.DataFrame({
        "method": ["a", "a", "a", "b", "c", "c"],
        "S_delta": [0.1, 0.3, math.nan, 0.5, 0.2, 0.2 + 1e-17],
        "alpha": [70.0, 80.0, 90.0, math.inf, 1.0, 1.0],
    })
    stats = seed_stats(frame, ["S_delta", "alpha"])
    assert stats.loc["a", ("S_delta", "mean")] == pytest.approx(0.2)
    assert stats.loc["a", ("S_delta", "std")] == pytest.approx(math.sqrt(0.02))  # sample std, NaN left out
    assert stats.loc["a", ("S_delta", "count")] == 2
    assert stats.loc["a", ("alpha", "std")] == pytest.approx(10.0) and stats.loc["a", ("alpha", "count")] == 3
    assert math.isnan(stats.loc["b", ("S_delta", "std")])  # one value: no std
    assert stats.loc["b", ("alpha", "count")] == 0  # inf is not a value
    assert stats.loc["c", ("S_delta", "std")] == 0.0  # equal up to rounding: exactly 0, never noise
    assert list(stats.index) == ["a", "b", "c"]


def test_mlflow_curves_csv_is_the_frame() -> None:
    assert curves_csv(two_session_run()) == (
        "session,update,global_update,acc_old,acc_new,acc_all,task_1,task_2,task_3\n"
        "2,0,0,0.9,0.0,0.45,0.9,0.0,\n"
        "2,2,2,0.5,0.6,0.55,0.5,0.6,\n"
        "2,4,4,0.8,0.7,0.75,0.8,0.7,\n"
        "3,0,4,0.7,0.1,0.5,0.8,0.6,0.1\n"
        "3,3,7,0.6,0.9,0.7,0.65,0.55,0.9\n"
    )
