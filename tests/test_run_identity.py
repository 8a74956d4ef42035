"""A run's identity (precision, settings, CPU threads and kernels) in every machine-readable output: a bf16
and an fp32 run of one method never share a group in ``load_results``, the CSV or the JSON table, and the
MLflow run name, tags and params say what the run was without the machine's free RAM and disk."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness.cli import main, summary_lines
from bench_stability_gap.harness.results.schema import RunResult, identity_text, run_identity, save_result
from bench_stability_gap.harness.results.tracking import _params, _tags, result_run_name
from bench_stability_gap.harness.api import load_results

CPU = {"device": "cpu", "torch_threads": 1, "cpu_kernels": "gemm1x1+dw-small+adamw-fused",
       "data_path": {"ram_budget": 11 * 2**30, "disk_budget": 70 * 2**30, "cache_root": "/c"}}


def _in(result: RunResult, precision: str, run_id: str) -> RunResult:
    return result.model_copy(update={"run_id": run_id, "options": {**CPU, "precision": precision}})


def _write(root: Path) -> Path:
    for seed in (0, 1):
        for precision in ("fp32", "bf16"):
            save_result(root, _in(joint_run(seed=seed), precision, f"j{seed}-{precision}"))
            lift = 0.0 if precision == "fp32" else 0.05  # the two precisions' numbers differ
            save_result(root, _in(two_session_run(seed=seed, lift=lift), precision, f"v{seed}-{precision}"))
    return root


def test_load_results_keeps_precisions_apart(tmp_path: Path) -> None:
    frame = load_results(_write(tmp_path))
    ranked = frame[(frame.reason == "") & ~frame.is_reference]
    assert set(ranked.precision) == {"fp32", "bf16"} and set(ranked.settings) == {"defaults"}
    assert set(ranked.threads) == {1} and set(ranked.cpu_kernels) == {CPU["cpu_kernels"]}
    groups = ranked.groupby(["protocol", "precision", "method"])  # the docs' recipe
    assert sorted(len(g) for _, g in groups) == [2, 2]
    assert all(g.precision.nunique() == 1 for _, g in groups)
    means = groups["S_delta"].mean()
    assert means[("hand", "fp32", "vanilla")] != means[("hand", "bf16", "vanilla")]


def test_csv_and_json_keep_precisions_apart(tmp_path: Path) -> None:
    root = _write(tmp_path)
    runner = CliRunner()
    csv = runner.invoke(main, ["leaderboard", "table", "--results-dir", str(root), "--format", "csv"])
    assert csv.exit_code == 0, csv.output
    header, *rows = csv.output.strip().splitlines()
    cols = header.split(",")
    assert {"precision", "settings", "threads", "cpu_kernels"} <= set(cols)
    at = cols.index("precision")
    assert sorted(r.split(",")[at] for r in rows if ",vanilla," in r) == ["bf16", "bf16", "fp32", "fp32"]
    out = runner.invoke(main, ["leaderboard", "table", "--results-dir", str(root), "--format", "json"])
    assert out.exit_code == 0, out.output
    boards = {b["precision"]: b for b in json.loads(out.output)["protocols"]}
    assert set(boards) == {"fp32", "bf16"}
    for board in boards.values():
        (vanilla,) = [r for r in board["rows"] if r["method"] == "vanilla"]
        assert vanilla["n"] == 2 and vanilla["settings"] == "defaults" and vanilla["threads"] == [1]
    latex = runner.invoke(main, ["leaderboard", "table", "--results-dir", str(root), "--format", "latex"])
    assert "hand (protocol hash " in latex.output and ", bf16, unrecorded)" in latex.output and ", fp32, unrecorded)" in latex.output


def test_summary_line_and_mlflow_name_tags_params(tmp_path: Path) -> None:
    run = _in(two_session_run(), "bf16", "v0")
    assert run_identity(run) == {"precision": "bf16", "settings": "defaults", "threads": 1,
                                 "cpu_kernels": CPU["cpu_kernels"], "numerics": "unrecorded"}
    assert identity_text(run) == f"bf16, defaults, 1 thread, kernels {CPU['cpu_kernels']}, arithmetic unrecorded"
    assert _tags(run, tmp_path / "r.json")["bench.numerics"] == "unrecorded"
    assert f"| seed 0 | {identity_text(run)} |" in summary_lines(run, tmp_path / "r.json")[0]
    assert result_run_name(run) == "vanilla seed0 bf16"
    tuned_hand = run.model_copy(update={"overrides": {"lr": 0.1}})
    assert result_run_name(tuned_hand) == "vanilla [lr=0.1] seed0 bf16" and "set by hand" in identity_text(tuned_hand)
    tags = _tags(run, tmp_path / "r.json")
    assert tags["bench.precision"] == "bf16" and tags["bench.settings"] == "defaults" and tags["bench.threads"] == "1"
    assert tags["bench.machine.ram_budget_gb"] == "11.0" and tags["bench.machine.disk_budget_gb"] == "70.0"
    params = _params(run)
    assert not any("ram_budget" in k or "disk_budget" in k for k in params)
    assert params["options.data_path.cache_root"] == "/c" and params["options.precision"] == "bf16"
    gpu = run.model_copy(update={"options": {"device": "cuda:0", "precision": "bf16", "torch_threads": 16}})
    assert run_identity(gpu)["threads"] == 0 and run_identity(gpu)["cpu_kernels"] == ""
