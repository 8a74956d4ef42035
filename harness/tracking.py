"""Mirror a RunResult into MLflow: a sqlite store under the results folder unless told otherwise."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from .errors import BenchError
from .results import RunResult


def default_tracking_uri(results_dir: Path) -> str:
    return f"sqlite:///{results_dir / 'mlflow.db'}"


def _flat(prefix: str, value, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = str(value)[:500]


def curves_csv(result: RunResult) -> str:
    """The run's rows of the tidy curves frame (``harness.tidy.curves_frame``), one per session × eval point."""
    from .tidy import curves_frame

    frame = curves_frame([result]).rename(columns={"old": "acc_old", "new": "acc_new", "all": "acc_all"})
    tasks = [c for c in frame.columns if c.startswith("task_")]
    return frame[["session", "update", "global_update", "acc_old", "acc_new", "acc_all", *tasks]].to_csv(index=False)


def log_run(result: RunResult, json_path: Path, results_dir: Path, tracking_uri: str | None = None) -> str:
    """Log params, scalar metrics, step curves (step = update across sessions) and the JSON; returns the run id."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow  # slow import: only when logging
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    # after the import, which configures mlflow's loggers: no schema-migration chatter per run
    for name in ("mlflow", "mlflow.store.db.utils", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)

    uri = tracking_uri or default_tracking_uri(results_dir)
    client = MlflowClient(tracking_uri=uri)
    name = f"bench/{result.protocol.name}"
    try:
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp else client.create_experiment(
            name, artifact_location=(results_dir / "mlartifacts").as_uri() if tracking_uri is None else None)
    except mlflow.exceptions.MlflowException as exc:
        raise BenchError(f"MLflow tracking store {uri} is not usable: {exc.message}") from None
    run = client.create_run(exp_id, run_name=f"{result.method.spec} seed{result.seed}", tags={
        "bench.run_id": result.run_id, "bench.protocol_hash": result.protocol.hash,
        "bench.method_distribution": f"{result.method.distribution}=={result.method.version}",
        "bench.status": result.status, "bench.json": str(json_path),
    })
    rid = run.info.run_id
    params: dict[str, str] = {}
    _flat("", {"protocol": result.protocol.name, "protocol_version": result.protocol.version,
               "protocol_hash": result.protocol.hash, "method": result.method.spec, "seed": result.seed,
               "config": result.config, "options": result.options}, params)
    ts = 0
    metrics = [Metric(k, float(v), ts, 0) for k, v in (result.metrics.scalars() if result.metrics else {}).items()]
    metrics += [Metric("trainable_params", float(result.trainable_params), ts, 0),
                Metric("wall_time_s", result.wall_time_s, ts, 0)]
    offset = 0
    for c in result.curves:
        for i, u in enumerate(c.updates):
            for key, series in (("acc_old", c.old), ("acc_new", c.new), ("acc_all", c.all)):
                metrics.append(Metric(key, float(series[i]), ts, offset + u))
        offset += c.total_updates
    for r in result.reference:
        for key in ("old", "new", "all"):
            metrics.append(Metric(f"joint_acc_{key}", float(getattr(r, key)), ts, r.session))
    param_list = [Param(k, v) for k, v in params.items()]
    for start in range(0, len(param_list), 100):  # MLflow's per-call limits
        client.log_batch(rid, params=param_list[start : start + 100])
    for start in range(0, len(metrics), 1000):
        client.log_batch(rid, metrics=metrics[start : start + 1000])
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = Path(tmp) / "curves.csv"
        csv_path.write_text(curves_csv(result))
        client.log_artifact(rid, str(json_path))
        client.log_artifact(rid, str(csv_path))
    client.set_terminated(rid, "FINISHED" if result.status == "complete" else "FAILED")
    return rid
