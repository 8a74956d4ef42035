"""A run's MLflow record is complete, checked against a live `mlflow server` on 127.0.0.1 (started and
stopped by the ``mlflow_server`` fixture): every resolved setting as a param, the metrics (the standard CL
metrics included), the curves as step metrics, the JSON and the plot as artifacts; and the reference runs
`bench run` trained on the way are mirrored too, tagged as references."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from live_servers import mlflow_server  # noqa: F401 - the fixture

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.results.schema import iter_results
from bench_stability_gap.harness.results.tracking import REFERENCE_TAG, _flat, import_mlflow


@pytest.mark.slow  # a live server and three whole runs (the joint models, vanilla, vanilla+oocf)
def test_bench_run_logs_complete_records_to_a_live_server(tiny_protocol_file: Path, tmp_path: Path,
                                                         mlflow_server: str) -> None:  # noqa: F811
    results = tmp_path / "results"
    out = CliRunner().invoke(main, ["run", "-p", str(tiny_protocol_file), "-m", "vanilla+oocf", "--results-dir",
                                    str(results), "--tracking-uri", mlflow_server, "--no-progress", "--device", "cpu"])
    assert out.exit_code == 0, out.output
    stored = {r.label: r for _, r in iter_results(results)}
    assert set(stored) == {"joint", "vanilla", "vanilla+oocf"}  # the method and the references it needed

    import_mlflow()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    (exp,) = [e for e in client.search_experiments() if e.name.startswith("bench/")]
    runs = {r.data.tags["bench.run_id"]: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {r.run_id for r in stored.values()}  # all three mirrored, none twice

    result = stored["vanilla+oocf"]
    record = runs[result.run_id]
    params = record.data.params
    flat: dict[str, str] = {}
    _flat("config", result.config, flat)
    assert "config.lr" in flat and "config.oocf" in {k.rsplit(".", 1)[0] for k in flat}  # the modifier's own settings
    assert {k: params.get(k) for k in flat} == flat  # every setting, base method's and modifier's
    for key, value in {"options.precision": "fp32", "options.device": "cpu", "spec_hash": result.protocol.hash,
                       "method_modifiers": "oocf", "version.torch": result.versions["torch"],
                       "options.torch_threads": str(result.options["torch_threads"]),
                       "budget.batch_new": str(result.budget.batch_new),
                       "git_commit": result.git_commit or "none"}.items():
        assert params.get(key) == value, key
    assert REFERENCE_TAG not in record.data.tags
    metrics = record.data.metrics
    assert {"S_delta", "CK_delta", "alpha", "acc", "bwt", "forgetting", "fwt"} <= set(metrics)
    history = client.get_metric_history(record.info.run_id, "acc_all")
    # step = update counted across sessions; a later session's update 0 (on the previous session's last step)
    # goes under session_start_acc_all, so each key has one value per step
    steps, starts, offset = [], [], 0
    for n, c in enumerate(sorted(result.curves, key=lambda c: c.session)):
        steps += [offset + u for u in c.updates if u > 0 or n == 0]
        starts += [offset for u in c.updates if u == 0 and n > 0]
        offset += c.total_updates
    assert sorted(m.step for m in history) == sorted(steps)
    assert sorted(m.step for m in client.get_metric_history(record.info.run_id, "session_start_acc_all")) == starts
    artifacts = {a.path for a in client.list_artifacts(record.info.run_id)}
    assert {"curves.csv", "curves.svg"} <= artifacts and any(a.endswith(".json") for a in artifacts)

    assert runs[stored["joint"].run_id].data.tags.get(REFERENCE_TAG) == "joint"
    vanilla = runs[stored["vanilla"].run_id]
    assert vanilla.data.tags.get(REFERENCE_TAG) == "best_new"
    assert vanilla.data.params["config.lr"] == str(stored["vanilla"].config["lr"])
