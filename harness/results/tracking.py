"""Mirror runs into MLflow: a sqlite store under the results folder unless told otherwise.

The JSON result is the source of truth and is written before anything here runs, so tracking never
costs a result: a dead server fails within seconds (short HTTP timeout, one retry), the error names
the kept JSON, and ``bench sync`` mirrors it later. The sqlite store is created and written under a
file lock, so concurrent first runs on one results folder do not race MLflow's schema creation.
``LiveRun`` shows a run while it trains (RUNNING, accuracy at each eval point) and ends it FINISHED,
FAILED or KILLED.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import BenchError, without_foreign_page
from ..identity import RunIdentity, mlflow_name
from .comparability import value_problem
from .schema import RunResult, TunedStamp, iter_results, row_label
from .steps import STEP_AXIS_TAG, point_metrics, reference_steps
from .store_read import SYNCED_TAG  # set last, once params, metrics and the JSON artifact are all logged

if TYPE_CHECKING:
    from mlflow.entities import Run

    from ..run.evaluation import Accuracies
    from ..spec.protocol import Protocol

T = TypeVar("T")

HTTP_TIMEOUT_S = "5"   # per request; MLflow's default is 120 s
HTTP_RETRIES = "1"     # MLflow's default (7 retries with backoff) hangs a finished run for minutes
LOCK_TIMEOUT_S = 300
TERMINAL = {"complete": "FINISHED", "killed": "KILLED", "interrupted": "KILLED"}  # anything else: FAILED
REFERENCE_TAG = "bench.reference"  # "joint" (A_joint) or "best_new" (a run of the protocol's A_best set)
# extra artifact files of a run: file name -> how to render its text from the result (None: no such file for
# this run); the names are known without rendering, so ``sync`` can see which a record lacks
Artifacts = Mapping[str, Callable[[RunResult], "str | None"]]


def sqlite_path(uri: str) -> Path:
    """The database file of a ``sqlite:///`` URI (MLflow takes SQLAlchemy's form)."""
    rest = uri[len("sqlite://"):]
    if not rest.startswith("/"):
        raise BenchError(f"Tracking URI {uri!r} is malformed: write sqlite:///relative/path.db or "
                         f"sqlite:////absolute/path.db.")
    return Path(urllib.parse.unquote(rest[1:].split("?", 1)[0])).expanduser()


def default_tracking_uri(results_dir: Path) -> str:
    return f"sqlite:///{results_dir / 'mlflow.db'}"


def _flat(prefix: str, value, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = str(value)[:500]


def curves_csv(result: RunResult) -> str:
    """The run's rows of the tidy curves frame (``harness.results.tidy.curves_frame``), one per session × eval point."""
    from .tidy import curves_frame

    frame = curves_frame([result]).rename(columns={"old": "acc_old", "new": "acc_new", "all": "acc_all"})
    tasks = [c for c in frame.columns if c.startswith("task_")]
    return frame[["session", "update", "global_update", "acc_old", "acc_new", "acc_all", *tasks]].to_csv(index=False)


def import_mlflow():
    """MLflow, configured to fail fast and quietly (a slow import: only when tracking)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", HTTP_TIMEOUT_S)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", HTTP_RETRIES)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow

    # after the import, which configures mlflow's loggers: no schema-migration chatter per run
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # it logs every database error with its SQLAlchemy traceback before raising it; ``Store.session``
    # turns the raised error into one paragraph, so the log would only repeat it as a traceback
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    return mlflow


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Serialise access to a sqlite store across processes (MLflow creates its schema on first use
    and two first runs at once crash in it); server and database stores handle concurrency."""
    if not uri.startswith("sqlite:///"):
        with nullcontext():
            yield
        return
    from filelock import FileLock, Timeout


    db = sqlite_path(uri)
    db.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(db) + ".lock", timeout=LOCK_TIMEOUT_S)
    try:
        with lock:
            yield
    except Timeout:
        raise BenchError(f"MLflow store {db} stayed locked by another bench process for {LOCK_TIMEOUT_S} s "
                         f"(lock file {db}.lock).") from None


def _experiment(client, name: str, artifact_location: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp else client.create_experiment(name, artifact_location=artifact_location)


# the data-path plan's budgets come from the machine's free RAM and disk at the time: they differ between
# identical runs, so they are tags (searchable, never part of what the run was made with), not params
MACHINE_STATE = ("ram_budget", "disk_budget")


def _tags(result: RunResult, json_path: Path) -> dict[str, str]:
    tags = {"bench.run_id": result.run_id,
            "bench.method_distribution": f"{result.method.distribution}=={result.method.version}",
            "bench.status": result.status, "bench.json": str(json_path),
            **RunIdentity.from_result(result).mlflow_tags}
    plan = result.options.get("data_path") or {}
    tags.update({f"bench.machine.{k}_gb": f"{plan[k] / 2**30:.1f}" for k in MACHINE_STATE if k in plan})
    if (role := reference_role(result)) is not None:
        tags[REFERENCE_TAG] = role
    return tags


def reference_role(result: RunResult) -> str | None:
    """What the run is to others, read from the result alone (so every path that mirrors it tags it alike):
    "joint" for an A_joint reference, "best_new" for a run of the A_best set it was scored with (its row is
    one of that set's methods, default settings), else None."""
    if result.is_reference:
        return "joint"
    refs = result.references
    return "best_new" if refs is not None and result.label in refs.best_new_methods else None


def _params(result: RunResult) -> dict[str, str]:
    """Everything the run was made with, fully resolved, so runs can be filtered and compared in the MLflow
    UI by what they ran with: the protocol stamp, the method and where it came from, every setting
    (``config.*``: the base method's, each modifier's under its name; the learning rates among them), the
    ``--set`` overrides, the budget it trained under, the run options (device, precision, threads, data
    paths, weights), package versions and the git commit."""
    b = result.budget
    params: dict[str, str] = {}
    _flat("", {
        "protocol": result.protocol.name, "protocol_version": result.protocol.version,
        "protocol_hash": result.protocol.hash, "spec_hash": result.protocol.hash,
        "method": result.method.spec, "method_base": result.method.base,
        "method_modifiers": "+".join(result.method.modifiers) or "none",
        "method_distribution": f"{result.method.distribution}=={result.method.version}",
        "modifier_distributions": result.method.modifier_distributions,
        "method_code_hash": result.method.code_hash, "seed": result.seed, "status": result.status,
        "config": result.config, "set": result.overrides, "options": _options_without_machine_state(result.options),
        "budget": {"updates_per_session": b.updates_per_session, "batch_new": b.batch_new, "batch_old": b.batch_old,
                   "memory_policy": b.memory_policy, "memory_capacity": b.memory_capacity,
                   "batch_limit": b.batch_limit, "trunk_cached": b.trunk_cached},
        "version": result.versions, "git_commit": result.git_commit or "none",
        "trainable_params": result.trainable_params,
    }, params)
    return params


def run_name(method: str, seed: int, overrides: Mapping[str, object] | None = None, tuned: TunedStamp | None = None,
             precision: str | None = None) -> str:
    """The MLflow name of a run not yet made (``RunIdentity.run_name`` once it is): the leaderboard row (the
    method with its ``--set`` overrides or its tuning ruleset), the seed and the precision."""
    return mlflow_name(row_label(method, dict(overrides or {}), tuned), seed, precision)


def result_run_name(result: RunResult) -> str:
    """The finished run's MLflow name: its identity's (row, seed and precision)."""
    return RunIdentity.from_result(result).run_name


def _options_without_machine_state(options: Mapping[str, Any]) -> dict[str, Any]:
    plan = options.get("data_path")
    if not isinstance(plan, Mapping):
        return dict(options)
    return {**options, "data_path": {k: v for k, v in plan.items() if k not in MACHINE_STATE}}


def _final_metrics(result: RunResult, with_curves: bool, protocol: Protocol | None = None) -> list:
    """Scalars, and the step metrics on one axis (``steps``): the curves (``with_curves``; a live run
    logged them as it went), the training TFLOPs at each eval point and a joint run's accuracies."""
    from mlflow.entities import Metric

    ts = 0
    metrics = [Metric(k, float(v), ts, 0) for k, v in (result.metrics.scalars() if result.metrics else {}).items()]
    metrics += [Metric("trainable_params", float(result.trainable_params), ts, 0),
                Metric("wall_time_s", result.wall_time_s, ts, 0)]
    metrics += [Metric(f"{stage}_s", float(v), ts, 0) for stage, v in sorted(result.stage_seconds.items())]
    metrics += _curve_metrics(result, with_curves)
    steps = reference_steps(result, protocol)
    for r in result.reference:
        for key in ("old", "new", "all"):
            step = r.session if steps is None else steps[r.session]
            metrics.append(Metric(f"joint_acc_{key}", float(getattr(r, key)), ts, step))
    return metrics


def _curve_metrics(result: RunResult, with_curves: bool) -> list:
    """The curves' step metrics on one axis, updates since the first learning session began: at each eval point
    the accuracy on the old, new and all classes (``with_curves``: a live run logged those as it went), on each
    task's classes (``acc_task_k``) and the training TFLOPs so far; and the training loss of every update
    (``loss``) at the step its update count reaches, the k-th update of a session at the session's start + k,
    so an eval point and the update that came just before it share a step."""
    from mlflow.entities import Metric

    metrics: list = []
    offset = 0
    for n, c in enumerate(result.curves):
        for i, u in enumerate(c.updates):
            values = {f"acc_{k}": float(s[i]) for k, s in (("old", c.old), ("new", c.new), ("all", c.all))} \
                if with_curves else {}
            values.update({f"acc_task_{k + 1}": float(t[i]) for k, t in enumerate(c.tasks)})
            # the compute axis: plot acc_* against train_tflops in the MLflow UI (same steps)
            if c.train_flops is not None:
                values["train_tflops"] = float(c.train_flops[i]) / 1e12
            metrics += point_metrics(offset + u, c.session, u, n == 0, values, session_key=with_curves)
        metrics += [Metric("loss", float(v), 0, offset + k + 1) for k, v in enumerate(c.loss)]
        offset += c.total_updates
    return metrics


def _axis_tag(result: RunResult, protocol: Protocol | None = None) -> dict[str, str]:
    """Which x axis the run's step metrics use: cumulative updates, or (a joint run whose protocol gives
    no fixed update count per session) the session index."""
    fallback = bool(result.reference) and reference_steps(result, protocol) is None
    return {STEP_AXIS_TAG: "session" if fallback else "updates"}


def _log_batches(client, rid: str, params: Mapping[str, str] = {}, metrics: list | None = None) -> None:
    from mlflow.entities import Param

    param_list = [Param(k, v) for k, v in params.items()]
    for start in range(0, len(param_list), 100):  # MLflow's per-call limits
        client.log_batch(rid, params=param_list[start : start + 100])
    metrics = metrics or []
    for start in range(0, len(metrics), 1000):
        client.log_batch(rid, metrics=metrics[start : start + 1000])


def _log_artifacts(client, rid: str, result: RunResult, json_path: Path, artifacts: Artifacts | None = None,
                   only: set[str] | None = None) -> list[str]:
    """The result JSON, its curves as CSV and the ``artifacts`` the caller renders (the run's plot); ``only``:
    just these names (what a record lacks). Returns the names logged."""
    renderers = {"curves.csv": curves_csv, **dict(artifacts or {})}
    logged = []
    with tempfile.TemporaryDirectory() as tmp:
        if only is None or json_path.name in only:
            client.log_artifact(rid, str(json_path))
            logged.append(json_path.name)
        for name, render in renderers.items():
            if only is not None and name not in only:
                continue
            if (text := render(result)) is None:
                continue
            path = Path(tmp) / name
            path.write_text(text)
            client.log_artifact(rid, str(path))
            logged.append(name)
    return logged


def _first_line(text: str, limit: int = 300) -> str:
    """MLflow's messages carry whole tracebacks of the HTTP layer: one line of it is the paragraph."""
    # SQLAlchemy puts a note on how the query was flushed before the database's own message
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("(raised as a result of")]
    line = lines[0] if lines else "(no message)"
    line = line if len(line) <= limit else line[: limit - 3] + "..."
    return line if line.endswith((".", "!", "?")) else line + "."  # a sentence: more follows it


@dataclass
class Store:
    """One tracking store: where it is, and its client (created under the store lock)."""

    results_dir: Path
    tracking_uri: str | None = None
    uri: str = field(init=False)

    def __post_init__(self) -> None:
        self.uri = self.tracking_uri or default_tracking_uri(self.results_dir)
        self._client = None

    @property
    def artifact_location(self) -> str | None:
        """Where a new experiment keeps its artifacts: ``mlartifacts/`` beside a sqlite database (the default
        one in the results folder, or one the user named), so a store's files stay together. MLflow's own
        default for a database store is ``./mlruns`` of whatever folder the first run started in. None (the
        store decides) for a server, which serves its own, and other backends."""
        if not self.uri.startswith("sqlite:///"):
            return None
        return (sqlite_path(self.uri).resolve().parent / "mlartifacts").as_uri()

    @contextmanager
    def session(self):
        """The client, with the store locked (sqlite) and every MLflow error turned into one paragraph."""
        mlflow = import_mlflow()
        from mlflow.tracking import MlflowClient

        with store_lock(self.uri):
            try:
                if self._client is None:
                    self._client = MlflowClient(tracking_uri=self.uri)
                yield self._client
            except BenchError:
                raise
            except mlflow.exceptions.MlflowException as exc:
                raise BenchError(f"MLflow tracking store {self.uri} is not usable: "
                                 f"{_first_line(without_foreign_page(exc.message))}") from None
            except Exception as exc:  # noqa: BLE001 - requests, sqlalchemy and OS errors all mean the same here
                raise BenchError(f"MLflow tracking store {self.uri} is not usable: "
                                 f"{type(exc).__name__}: {_first_line(str(exc))}") from None


def log_run(result: RunResult, json_path: Path, results_dir: Path, tracking_uri: str | None = None,
            tags: Mapping[str, str] | None = None, artifacts: Artifacts | None = None,
            protocol: Protocol | None = None) -> str:
    """Log params, scalar metrics, step curves (step = update across sessions) and the JSON; returns the run id.
    ``protocol``: the run's spec, for a joint run's steps (else found by name, ``steps.reference_steps``)."""
    store = Store(results_dir, tracking_uri)
    with store.session() as client:
        exp_id = _experiment(client, f"bench/{result.protocol.name}", store.artifact_location)
        run = client.create_run(exp_id, run_name=result_run_name(result),
                                tags={**_tags(result, json_path), **_axis_tag(result, protocol), **(tags or {})})
        rid = run.info.run_id
        _log_batches(client, rid, _params(result), _final_metrics(result, with_curves=True, protocol=protocol))
        _log_artifacts(client, rid, result, json_path, artifacts)
        client.set_tag(rid, SYNCED_TAG, "true")
        client.set_terminated(rid, TERMINAL.get(result.status, "FAILED"))
    return rid


def sync_command(results_dir: Path, tracking_uri: str | None = None) -> str:
    """The command that mirrors a results folder's runs once the store works."""
    return f"bench sync --results-dir {results_dir}" + (f" --tracking-uri {tracking_uri}" if tracking_uri else "")


class NotMirrored(BenchError):
    """A stored result that could not be logged to MLflow: why (``cause``), and the file that keeps it."""

    def __init__(self, cause: str, kept: Path, sync: str) -> None:
        super().__init__(f"{cause} The result is kept in {kept}; mirror it once the store works with: {sync}")
        self.cause, self.kept = cause, kept


def not_mirrored(live_error: str | None, path: Path, references: list[NotMirrored], sync: str) -> BenchError:
    """One paragraph for a run whose MLflow record failed (``live_error``) and/or whose references could not
    be mirrored: each cause once (a broken store fails them all alike), every file that keeps what MLflow
    lacks, and the one command that mirrors them."""
    causes = list(dict.fromkeys(filter(None, [live_error, *(r.cause for r in references)])))
    kept = [str(r.kept) for r in references] + ([str(path)] if live_error else [])
    which = (f"The result is kept in {kept[0]}; mirror it" if len(kept) == 1 else
             f"The results are kept in {', '.join(kept[:-1])} and {kept[-1]}; mirror them")
    return BenchError(f"{' '.join(causes)} {which} to MLflow later with: {sync}")


def log_run_or_explain(result: RunResult, json_path: Path, results_dir: Path,
                       tracking_uri: str | None = None, tags: Mapping[str, str] | None = None,
                       artifacts: Artifacts | None = None, protocol: Protocol | None = None) -> tuple[str, str]:
    """``log_run``, whose failure says what is kept and how to mirror it later; returns (run id, URI)."""
    store = Store(results_dir, tracking_uri)
    try:
        return log_run(result, json_path, results_dir, tracking_uri, tags, artifacts, protocol), store.uri
    except BenchError as err:
        raise NotMirrored(str(err), json_path, sync_command(results_dir, tracking_uri)) from None


class LiveRun:
    """An MLflow run that follows a run while it trains: RUNNING from ``start``, accuracy logged at each
    eval point, ended by ``finish`` as FINISHED, FAILED or KILLED with the final metrics and JSON.

    Tracking must never stop training: the first error disables the object (``error`` says why), is
    reported once as a warning, and later calls do nothing; ``bench sync`` mirrors the stored JSON afterwards.
    """

    def __init__(self, results_dir: Path, tracking_uri: str | None = None, protocol: Protocol | None = None) -> None:
        self.store = Store(results_dir, tracking_uri)
        self.protocol = protocol  # the run's spec: a joint run's steps (``steps.reference_steps``)
        self.run_id: str | None = None
        self.error: str | None = None
        self._session_start: dict[int, int] = {}
        self._last: tuple[int, int] | None = None  # (session, update) of the latest point
        self._points = 0
        self._started_params: set[str] = set()  # logged by ``start``: MLflow never lets a param change

    def _guard(self, action: Callable[..., T]) -> T | None:  # action(client), the session's MlflowClient
        if self.error is not None:
            return None
        try:
            with self.store.session() as client:
                return action(client)
        except BenchError as err:
            self.error = str(err)
            print(f"Warning: {err} Training goes on; the result is still written as JSON, and `bench sync` "
                  f"mirrors it once the store works.", file=sys.stderr)
            return None

    def start(self, protocol: str, method: str, seed: int, run_id: str | None = None,
              params: Mapping[str, Any] | None = None, name: str | None = None) -> str | None:
        """Open the run (RUNNING) with its settings. ``run_id`` is bench's, when known this early: with
        it ``bench sync`` can replace this mirror if the process dies (``finish`` tags it anyway).
        ``name``: the run's name (``run_name``), by default the method and seed."""
        def action(client) -> str:
            exp_id = _experiment(client, f"bench/{protocol}", self.store.artifact_location)
            tags = {"bench.status": "running", STEP_AXIS_TAG: "updates", **({"bench.run_id": run_id} if run_id else {})}
            run = client.create_run(exp_id, run_name=name or run_name(method, seed), tags=tags)
            flat: dict[str, str] = {}
            _flat("", dict(params or {}), flat)
            _log_batches(client, run.info.run_id, flat)
            self._started_params = set(flat)
            return run.info.run_id

        self.run_id = self._guard(action)
        return self.run_id

    def eval_point(self, session: int, update: int, acc: Mapping[str, float] | Accuracies) -> None:
        """Accuracies after ``update`` updates of ``session``: a mapping (``old``, ``new``, ``all``) or the
        harness's evaluation result (attributes of those names). The step is the update count across
        sessions, as in the final curves."""
        if self.run_id is None:
            return
        if not isinstance(acc, Mapping):
            acc = {"old": acc.old, "new": acc.new, "all": acc.all}
        if session not in self._session_start:
            prev = self._last
            self._session_start[session] = 0 if prev is None else self._session_start[prev[0]] + prev[1]
        self._last = (session, update)
        step = self._session_start[session] + update
        first = session == min(self._session_start)  # one value per step and key: ``steps.point_metrics``
        metrics = point_metrics(step, session, update, first, {f"acc_{k}": float(v) for k, v in acc.items()})
        self._guard(lambda client: client.log_batch(self.run_id, metrics=metrics))
        self._points += 1

    def discard(self) -> None:
        """Delete the run: this process reused a result another one stored (and mirrors)."""
        if self.run_id is not None:
            self._guard(lambda client: client.delete_run(self.run_id))
            self.run_id = None

    def finish(self, status: str, result: RunResult | None = None, path: Path | None = None,
               artifacts: Artifacts | None = None) -> str | None:
        """End the run: ``status`` is bench's (complete, failed, diverged, killed) or MLflow's; with the
        stored result, its resolved settings (params), metrics, JSON and ``artifacts`` are logged and the
        run marked synced."""
        if self.run_id is None:
            return None
        mlflow_status = status if status in ("FINISHED", "FAILED", "KILLED") else TERMINAL.get(status, "FAILED")

        run_id = self.run_id

        def action(client) -> None:
            if result is not None and path is not None:
                for key, value in {**_tags(result, path), **_axis_tag(result, self.protocol)}.items():
                    client.set_tag(run_id, key, value)
                client.update_run(run_id, name=result_run_name(result))  # the precision is known now
                params = {k: v for k, v in _params(result).items() if k not in self._started_params}
                _log_batches(client, run_id, params,
                             _final_metrics(result, with_curves=self._points == 0, protocol=self.protocol))
                _log_artifacts(client, run_id, result, path, artifacts)
                client.set_tag(run_id, SYNCED_TAG, "true")
            client.set_tag(run_id, "bench.status", status)  # how the run ended, over the result's
            client.set_terminated(run_id, mlflow_status)

        self._guard(action)
        return self.run_id


@dataclass
class SyncReport:
    added: list[tuple[Path, str]] = field(default_factory=list)   # (JSON, MLflow run id)
    present: int = 0
    replaced: list[str] = field(default_factory=list)             # unfinished mirrors set aside
    repaired: list[tuple[Path, str, list[str]]] = field(default_factory=list)  # (JSON, MLflow run id, what was added)
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # (file, why it is not mirrored)


def _mirrored(client) -> tuple[dict[str, Run | None], dict[str, list[str]]]:
    """bench run ids fully mirrored in the store (with their MLflow run), and MLflow runs of bench runs left
    unfinished."""
    from mlflow.entities import ViewType

    ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
           if e.name.startswith("bench/")]
    done: dict[str, Run | None] = {}  # None: logged by a sync since
    partial: dict[str, list[str]] = {}
    token = None
    while ids:
        page = client.search_runs(ids, run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        for run in page:
            bench_id = run.data.tags.get("bench.run_id")
            if bench_id is None:
                continue
            if _whole(run):
                done.setdefault(bench_id, run)
            else:
                partial.setdefault(bench_id, []).append(run.info.run_id)
        token = page.token
        if not token:
            break
    return done, partial


def _whole(run: Run) -> bool:
    """Whether an MLflow record of a bench run is complete (else a live run that died, a logging error)."""
    return run.data.tags.get(SYNCED_TAG) == "true" or (
        "bench.json" in run.data.tags and run.info.status != "RUNNING")  # logged before bench.synced existed


def mirror_missing(result: RunResult, json_path: Path, results_dir: Path, tracking_uri: str | None = None,
                   artifacts: Artifacts | None = None, protocol: Protocol | None = None) -> str | None:
    """``sync`` for one stored result: log it when the store holds no complete record of it (deleting an
    unfinished one first); returns the new MLflow run id, None when a complete record was there already."""
    from mlflow.entities import ViewType

    store = Store(results_dir, tracking_uri)
    try:
        with store.session() as client:
            exp = client.get_experiment_by_name(f"bench/{result.protocol.name}")
            runs = [] if exp is None else client.search_runs(
                [exp.experiment_id], filter_string=f"tags.`bench.run_id` = '{result.run_id}'",
                run_view_type=ViewType.ACTIVE_ONLY)
            if any(_whole(run) for run in runs):
                return None
            for run in runs:
                client.delete_run(run.info.run_id)
    except BenchError as err:
        raise NotMirrored(str(err), json_path, sync_command(results_dir, tracking_uri)) from None
    return log_run_or_explain(result, json_path, results_dir, tracking_uri, artifacts=artifacts,
                              protocol=protocol)[0]


def repair(client, run: Run, result: RunResult, json_path: Path, artifacts: Artifacts | None = None,
           protocol: Protocol | None = None) -> list[str]:
    """Add to a mirrored record the tags and artifacts every mirror carries and it lacks (a record made
    by an older bench, or by a path that logged less); returns what was added (tag keys, file names).
    Tags it has are kept: ``bench.status`` says how a live run ended, over the result's."""
    tags = {k: v for k, v in {**_tags(result, json_path), **_axis_tag(result, protocol)}.items()
            if k not in run.data.tags}
    for key, value in tags.items():
        client.set_tag(run.info.run_id, key, value)
    present = {a.path for a in client.list_artifacts(run.info.run_id)}
    wanted = {json_path.name, "curves.csv", *(artifacts or {})}
    added = _log_artifacts(client, run.info.run_id, result, json_path, artifacts, only=wanted - present) \
        if wanted - present else []
    return [*tags, *added]


def sync(results_dir: Path, tracking_uri: str | None = None, artifacts: Artifacts | None = None) -> SyncReport:
    """Mirror every stored result that the tracking store lacks (idempotent: a run is matched by
    bench's run id), and ``repair`` the mirrored records that lack a tag or an artifact. A second file of a
    run id (a copy) is skipped, naming the first: its JSON would otherwise be added to the run's record as
    a repair, by the sync after the one that logged the run. A mirror left
    unfinished (a live run whose process died, a logging error) is deleted and logged again whole."""
    report = SyncReport()
    store = Store(results_dir, tracking_uri)
    with store.session() as client:
        done, partial = _mirrored(client)
        for ids in (v for k, v in partial.items() if k not in done):
            for rid in ids:
                client.delete_run(rid)
                report.replaced.append(rid)
    read_from: dict[str, Path] = {}  # bench run id -> the file this sync mirrored it from
    for path, result in iter_results(results_dir, skip=lambda p, why: report.skipped.append((p, why))):
        if not isinstance(result, RunResult):  # a corrupt file: its error names it
            report.skipped.append((path, str(result)))
            continue
        if (bad := value_problem(result)) is not None:
            report.skipped.append((path, f"refused: {bad}; the leaderboard never ranks it either"))
            continue
        if (first := read_from.setdefault(result.run_id, path)) != path:  # a copy: one record per run, from one file
            report.skipped.append((path, f"duplicate of run {result.run_id} already read from {first}"))
            continue
        if result.run_id in done:
            report.present += 1
            if (run := done[result.run_id]) is not None:  # None: logged by this sync a file ago
                with store.session() as client:
                    if added := repair(client, run, result, path, artifacts):
                        report.repaired.append((path, run.info.run_id, added))
            continue
        rid = log_run(result, path, results_dir, tracking_uri, artifacts=artifacts)
        report.added.append((path, rid))
        done[result.run_id] = None
    return report
