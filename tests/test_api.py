"""The Python API: ``run`` returns the stored, validated result; ``load_results`` one row per run."""

from __future__ import annotations

from pathlib import Path

import pytest
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.results.schema import load_result, save_result
from bench_stability_gap.harness.api import LOAD_COLUMNS, load_results, results_columns, run


def test_load_results_of_an_empty_folder_is_an_empty_frame_with_the_columns(tmp_path: Path) -> None:
    frame = load_results(tmp_path)
    assert frame.empty and list(frame.columns) == results_columns()
    assert {"run_id", "method", "seed", "S_delta", "P_delta_paper", "bwt", "forgetting", *LOAD_COLUMNS} <= set(frame.columns)
    with pytest.raises(BenchError, match="does not exist"):
        load_results(tmp_path / "nowhere")


def test_load_results_one_row_per_run_and_a_corrupt_file_named(tmp_path: Path) -> None:
    for seed in (0, 1):
        save_result(tmp_path, joint_run(f"j{seed}", seed))
        save_result(tmp_path, two_session_run(f"v{seed}", "vanilla", seed))
    save_result(tmp_path, two_session_run("lonely", "lwf", 5))  # no joint run for seed 5: a row with its reason
    bad = tmp_path / "runs" / "hand" / "vanilla" / "seed9-cut.json"
    bad.write_text("{")
    with pytest.warns(UserWarning, match="seed9-cut.json"):
        frame = load_results(tmp_path)
    assert sorted(frame["run_id"]) == ["j0", "j1", "lonely", "v0", "v1"]
    rows = frame.set_index("run_id")
    assert rows.loc["v0", "reason"] == "" and rows.loc["lonely", "reason"].startswith("no joint reference for seed 5")
    # the metrics are the leaderboard's (recomputed against the references): BWT by hand for this curve:
    # R11 = 0.9 (session 2's before point), R22 = 0.7 (session 2, last point), R31 = 0.65, R32 = 0.55 (session 3, last)
    # BWT = ((0.65 - 0.9) + (0.55 - 0.7)) / 2 = -0.2 -> -20 points
    assert rows.loc["v0", "bwt"] == pytest.approx(-20.0)
    assert rows.loc["v0", "path"].endswith(".json")


def test_run_checks_settings_before_anything_trains(tiny_protocol_file: Path, tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="bogus"):
        run(str(tiny_protocol_file), "vanilla", 0, results_dir=tmp_path, mlflow=False, device="cpu", bogus=1)
    assert not (tmp_path / "runs").exists()


def test_run_returns_the_stored_result(tiny_protocol_file: Path, results_with_joint: Path) -> None:
    results = results_with_joint  # the joint reference is stored already: this run trains vanilla only
    result = run(str(tiny_protocol_file), "vanilla", 0, results_dir=results, mlflow=False, device="cpu",
                 lr=0.002)
    assert result.overrides == {"lr": 0.002} and result.config["lr"] == 0.002
    (path,) = [p for p in (results / "runs").rglob("*.json") if result.run_id in p.name]
    assert load_result(path).model_dump(mode="json") == result.model_dump(mode="json")  # what was stored
    frame = load_results(results)
    assert result.run_id in set(frame["run_id"])


def test_sweep_runs_a_grid_and_skips_what_is_stored(tiny_protocol_file: Path, tmp_path: Path,
                                                   results_with_joint: Path) -> None:
    import yaml

    from bench_stability_gap.harness.api import sweep

    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"name": "grid", "seeds": [0],
                                    "runs": [{"protocol": str(tiny_protocol_file), "methods": ["vanilla"]}]}))
    results = results_with_joint  # the joint reference is stored (and in the folder, not in the sweep's rows)
    frame = sweep(str(grid), results_dir=results, mlflow=False, device="cpu")
    assert list(zip(frame["method"], frame["seed"])) == [("vanilla", 0)]  # the sweep's run (not the joint)
    assert frame.loc[0, "reason"] == "" and frame.loc[0, "S_delta"] == frame.loc[0, "S_delta"]  # scored, not NaN
    again = sweep(str(grid), results_dir=results, mlflow=False, device="cpu")  # all stored: nothing runs
    assert list(again["run_id"]) == list(frame["run_id"])
