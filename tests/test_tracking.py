"""Tracking never costs a result: concurrent first runs both land in MLflow, a dead
server fails in seconds with the JSON kept, ``bench sync`` mirrors what is missing (idempotent), and a
live run shows RUNNING, accuracy at each eval point, then FINISHED, FAILED or KILLED."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.results.schema import (RunResult, iter_results, load_result, result_precision,
                                                         save_result)
from bench_stability_gap.harness.results.tracking import (LiveRun, default_tracking_uri, log_run_or_explain, result_run_name,
                                                           sync)
from live_servers import free_port as closed_port  # a port nothing listens on once the probe socket closes

FIXTURES = Path(__file__).parent / "browser" / "fixtures"


def fixture_result(i: int = 0, cl: bool = True) -> RunResult:
    found = [load_result(p) for p in sorted(FIXTURES.glob("*.json"))]
    r = [x for x in found if x.is_reference != cl][i]
    return r.model_copy(update={"run_id": uuid.uuid4().hex[:12]})


def client_for(results: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=default_tracking_uri(results))


def bench_runs(results: Path) -> dict[str, object]:
    """bench run id -> MLflow run, over every bench experiment of the store."""
    from mlflow.entities import ViewType

    client = client_for(results)
    ids = [e.experiment_id for e in client.search_experiments() if e.name.startswith("bench/")]
    runs = client.search_runs(ids, run_view_type=ViewType.ACTIVE_ONLY) if ids else []
    return {r.data.tags["bench.run_id"]: r for r in runs}


CONCURRENT = """
import sys, time
from pathlib import Path
from bench_stability_gap.harness.results.schema import load_result
from bench_stability_gap.harness.results.tracking import log_run
import mlflow  # import first, so both processes reach the store at the same moment
results, json_path, gate = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
(gate / json_path.name).touch()
while len(list(gate.iterdir())) < 2:
    time.sleep(0.005)
print(log_run(load_result(json_path), json_path, results))
"""


@pytest.mark.slow  # two processes racing to create a real store: 98 s on a shared 2-core machine
def test_two_concurrent_first_runs_both_land_in_mlflow(tmp_path) -> None:
    """Without the store lock one of the two fails while MLflow initialises the store (seen here in
    2 of 2 tries: an sqlite OperationalError, and a constraint violation)."""
    results, gate = tmp_path / "results", tmp_path / "gate"
    gate.mkdir()
    paths = [save_result(results, fixture_result(i)) for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(results), str(p), str(gate)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in paths]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    landed = bench_runs(results)
    assert {load_result(p).run_id for p in paths} <= set(landed)
    assert all(landed[load_result(p).run_id].info.status == "FINISHED" for p in paths)


def test_dead_server_at_the_end_fails_in_seconds_and_keeps_the_json(tmp_path) -> None:
    results = tmp_path / "results"
    result = fixture_result()
    path = save_result(results, result)
    uri = f"http://127.0.0.1:{closed_port()}"
    t0 = time.perf_counter()
    with pytest.raises(BenchError) as err:
        log_run_or_explain(result, path, results, uri)
    assert time.perf_counter() - t0 < 20
    message = str(err.value)
    assert f"The result is kept in {path}" in message and f"bench sync --results-dir {results} --tracking-uri {uri}" in message
    assert load_result(path) == result


def test_sync_mirrors_what_is_missing_and_is_idempotent(tmp_path, seeded_store) -> None:
    results = seeded_store(tmp_path / "results")
    stored = [fixture_result(0), fixture_result(1), fixture_result(0, cl=False)]
    for r in stored:
        save_result(results, r)
    first = sync(results)
    assert len(first.added) == 3 and first.present == 0
    again = sync(results)
    assert again.added == [] and again.present == 3
    runs = bench_runs(results)
    assert set(runs) == {r.run_id for r in stored}
    assert all(r.info.status == "FINISHED" and r.data.tags["bench.synced"] == "true" for r in runs.values())

    out = CliRunner().invoke(main, ["sync", "--results-dir", str(results)], catch_exceptions=False)
    assert out.exit_code == 0 and "0 added, 3 already there" in out.output, out.output
    # the old name still works, and says which name to use
    old = CliRunner().invoke(main, ["sync", "--results", str(results)], catch_exceptions=False)
    assert old.exit_code == 0 and "0 added, 3 already there" in old.output, old.output
    assert "--results is deprecated; use --results-dir" in old.output
    both = CliRunner().invoke(main, ["sync", "--results", str(results), "--results-dir", str(results.parent)])
    assert both.exit_code == 2 and "name two folders" in both.output


def test_a_sqlite_store_the_user_names_keeps_artifacts_beside_it_not_in_the_working_folder(tmp_path,
                                                                                          monkeypatch) -> None:
    """MLflow's default artifact root for a database store is ./mlruns of the folder bench was started in: a
    run with MLFLOW_TRACKING_URI=sqlite:///... scattered artifacts into whatever folder (a git checkout) it ran in."""
    from mlflow.tracking import MlflowClient

    results, work = tmp_path / "results", tmp_path / "work"
    save_result(results, fixture_result(0))
    work.mkdir()
    monkeypatch.chdir(work)
    uri = f"sqlite:///{tmp_path / 'team' / 'store.db'}"
    (tmp_path / "team").mkdir()
    report = sync(results, uri)
    run = MlflowClient(tracking_uri=uri).get_run(report.added[0][1])
    assert run.info.artifact_uri.startswith((tmp_path / "team" / "mlartifacts").as_uri()), run.info.artifact_uri
    assert sorted(p.name for p in (tmp_path / "team" / "mlartifacts").rglob("*.json")) == [report.added[0][0].name]
    assert list(work.iterdir()) == []


def test_sync_repairs_a_mirrored_record_that_lacks_the_reference_tag_and_the_plot(tmp_path, seeded_store) -> None:
    """A record logged by a path that gave less (no plot, no reference role: what a Ray sweep logged) is
    completed by ``bench sync``, not skipped as mirrored; a second sync has nothing left to add."""
    from bench_stability_gap.harness.results.schema import References
    from bench_stability_gap.harness.results.tracking import REFERENCE_TAG, log_run

    results = seeded_store(tmp_path / "results")
    # a run of its seed's A_best set (its row, vanilla with default settings, is one of the set's methods)
    result = fixture_result(4).model_copy(update={"references": References(
        joint_run=None, best_new={}, best_new_methods=["vanilla"])})
    assert result.label == "vanilla"
    path = save_result(results, result)
    rid = log_run(result, path, results)  # the JSON and curves.csv only
    client = client_for(results)
    client.delete_tag(rid, REFERENCE_TAG)  # as logged before the role was read from the result
    assert REFERENCE_TAG not in client.get_run(rid).data.tags
    assert "curves.svg" not in {a.path for a in client.list_artifacts(rid)}

    out = CliRunner().invoke(main, ["sync", "--results-dir", str(results)], catch_exceptions=False)
    assert out.exit_code == 0 and "0 added, 1 already there (1 repaired)" in out.output, out.output
    assert f"repaired MLflow run {rid} of {path}: added {REFERENCE_TAG}, curves.svg" in out.output
    run = client.get_run(rid)
    assert run.data.tags[REFERENCE_TAG] == "best_new"
    assert {"curves.csv", "curves.svg", path.name} <= {a.path for a in client.list_artifacts(rid)}
    again = CliRunner().invoke(main, ["sync", "--results-dir", str(results)], catch_exceptions=False)
    assert again.exit_code == 0 and "0 added, 1 already there." in again.output, again.output
    assert set(bench_runs(results)) == {result.run_id}  # repaired in place, never logged twice


def test_a_copied_results_folder_never_writes_into_the_original(tmp_path, seeded_store) -> None:
    """A copied mlflow.db keeps the original folder's artifact location: mirroring into the copy would
    write artifacts into the other folder, so it is refused before anything runs."""
    import shutil

    from bench_stability_gap.harness.tools.preflight import check_outputs

    original = seeded_store(tmp_path / "original")
    save_result(original, fixture_result(0))
    sync(original)
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    save_result(copy, fixture_result(1))
    before = sorted(p.relative_to(original) for p in original.rglob("*") if p.is_file())
    out = CliRunner().invoke(main, ["sync", "--results-dir", str(copy)], catch_exceptions=False)
    assert out.exit_code == 2 and f"in {(original / 'mlartifacts').resolve()}, outside this results folder" in out.output
    assert "nothing was synced" in out.output and "--no-mlflow" not in out.output, out.output
    with pytest.raises(BenchError, match="outside this results folder"):
        check_outputs(copy, None, True)  # what bench run, sweep and tune check first
    check_outputs(copy, None, False)  # --no-mlflow writes no artifacts
    assert sorted(p.relative_to(original) for p in original.rglob("*") if p.is_file()) == before
    assert sync(original).present == 1  # the original folder's own store is fine


def test_sync_refusing_a_store_suggests_no_option_sync_lacks(tmp_path) -> None:
    """The store checks end with the run commands' way out, --no-mlflow, which bench sync does not have."""
    save_result(tmp_path / "results", fixture_result(0))
    uri = f"http://127.0.0.1:{closed_port()}"
    out = CliRunner().invoke(main, ["sync", "--results-dir", str(tmp_path / "results"), "--tracking-uri", uri])
    assert out.exit_code == 2 and "cannot be reached" in out.output, out.output
    assert "--no-mlflow" not in out.output and "nothing was synced." in out.output, out.output


def test_sync_cli_refuses_a_folder_without_results(tmp_path) -> None:
    out = CliRunner().invoke(main, ["sync", "--results-dir", str(tmp_path)], catch_exceptions=False)
    assert out.exit_code == 2 and f"Results folder {tmp_path} holds no runs/ folder" in out.output
    save_result(tmp_path, fixture_result(0))
    (tmp_path / "mlflow.db").write_text("not a database")
    out = CliRunner().invoke(main, ["sync", "--results-dir", str(tmp_path)], catch_exceptions=False)
    assert out.exit_code == 2 and "is not an SQLite database" in out.output, out.output


@pytest.fixture(scope="module")
def shared_results(tmp_path_factory, mlflow_template) -> Path:
    """One store for the live-run cases (creating an MLflow schema costs seconds)."""
    import shutil

    results = tmp_path_factory.mktemp("live") / "results"
    results.mkdir()
    shutil.copyfile(mlflow_template, results / "mlflow.db")
    return results


def drive(results: Path, result: RunResult, status: str, saved: bool = True) -> str:
    """Replay a stored result's curves through a LiveRun, as the runner's callback would."""
    live = LiveRun(results)
    rid = live.start(result.protocol.name, result.method.spec, result.seed, result.run_id, {"config": result.config})
    assert live.error is None and rid
    run = client_for(results).get_run(rid)
    assert run.info.status == "RUNNING" and run.data.params["config.lr"] == str(result.config["lr"])
    for c in result.curves:
        for u, o, n, a in zip(c.updates, c.old, c.new, c.all):
            live.eval_point(c.session, u, {"old": o, "new": n, "all": a})
    path = save_result(results, result) if saved else None
    live.finish(status, result if saved else None, path)
    assert live.error is None, live.error
    return rid


@pytest.mark.parametrize("status, expected", [("complete", "FINISHED"), ("failed", "FAILED"),
                                              ("diverged", "FAILED"), ("killed", "KILLED")])
def test_live_run_shows_running_then_its_end_state(shared_results, status, expected) -> None:
    results = shared_results
    result = fixture_result()
    rid = drive(results, result, status)
    client = client_for(results)
    run = client.get_run(rid)
    assert run.info.status == expected and run.data.tags["bench.status"] == status
    history = client.get_metric_history(rid, "acc_all")
    expect, starts, offset = [], [], 0
    for n, c in enumerate(result.curves):  # a later session's update-0 point has keys of its own
        expect += [(offset + u, a) for u, a in zip(c.updates, c.all) if u > 0 or n == 0]
        starts += [(offset + u, a) for u, a in zip(c.updates, c.all) if u == 0 and n > 0]
        offset += c.total_updates
    assert sorted((m.step, m.value) for m in history) == sorted(expect)
    assert sorted((m.step, m.value) for m in client.get_metric_history(rid, "session_start_acc_all")) == sorted(starts)
    assert run.data.metrics["S_delta"] == pytest.approx(result.metrics.S_delta)
    # the run's identity: its name once finished, and tags
    assert run.info.run_name == result_run_name(result) and run.data.tags["bench.precision"] == result_precision(result)
    assert any(a.path.endswith(".json") for a in client.list_artifacts(rid))
    report = sync(results)  # a finished live run counts as mirrored: nothing is logged twice
    assert report.added == [] and report.replaced == []


def test_sync_replaces_a_live_run_that_never_finished(tmp_path, seeded_store) -> None:
    results = seeded_store(tmp_path / "results")
    result = fixture_result()
    live = LiveRun(results)
    orphan = live.start(result.protocol.name, result.method.spec, result.seed, result.run_id, {})
    live.eval_point(2, 0, SimpleNamespace(old=0.5, new=0.0, all=0.4, tasks=[0.5, 0.0]))  # as the harness evaluates
    assert client_for(results).get_metric_history(orphan, "acc_new")[0].value == 0.0
    # then the process dies
    save_result(results, result)
    report = sync(results)
    assert report.replaced == [orphan] and len(report.added) == 1
    assert client_for(results).get_run(orphan).info.lifecycle_stage == "deleted"
    assert bench_runs(results)[result.run_id].info.status == "FINISHED"


def test_live_run_against_a_dead_server_never_raises(tmp_path) -> None:
    live = LiveRun(tmp_path, f"http://127.0.0.1:{closed_port()}")
    t0 = time.perf_counter()
    assert live.start("p", "vanilla", 0, "abc", {}) is None
    live.eval_point(2, 0, {"all": 0.5})
    assert live.finish("complete") is None
    assert time.perf_counter() - t0 < 20 and "is not usable" in live.error


@pytest.mark.slow
def test_live_run_through_a_server_that_dies_keeps_the_json_and_sync_repairs_it(tmp_path, mlflow_template) -> None:
    """A real MLflow server on 127.0.0.1: the run shows RUNNING with live points; the server dies
    mid-run; training goes on (each call fails in seconds), the JSON is kept, and ``bench sync``
    replaces the unfinished mirror with the whole run."""
    import os
    import signal
    import urllib.request

    from mlflow.tracking import MlflowClient

    db, port = tmp_path / "server.db", closed_port()
    shutil.copyfile(mlflow_template, db)  # the suite's migrated empty store: the server skips the migrations
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{db}",
         "--default-artifact-root", (tmp_path / "artifacts").as_uri(), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no job runner: bench has no jobs
    result = fixture_result()
    results = tmp_path / "results"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, "MLflow server did not start"
                time.sleep(0.5)
        live = LiveRun(results, uri)
        rid = live.start(result.protocol.name, result.method.spec, result.seed, result.run_id, {"seed": result.seed})
        first = result.curves[0]
        for u, o, n, a in zip(first.updates, first.old, first.new, first.all):
            live.eval_point(first.session, u, {"old": o, "new": n, "all": a})
        client = MlflowClient(tracking_uri=uri)
        assert client.get_run(rid).info.status == "RUNNING" and live.error is None
        assert len(client.get_metric_history(rid, "acc_all")) == len(first.updates)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    t0 = time.perf_counter()
    for c in result.curves[1:]:
        for u, o, n, a in zip(c.updates, c.old, c.new, c.all):
            live.eval_point(c.session, u, {"old": o, "new": n, "all": a})
    path = save_result(results, result)
    live.finish("complete", result, path)
    assert time.perf_counter() - t0 < 30 and "is not usable" in live.error
    assert load_result(path) == result

    report = sync(results, f"sqlite:///{db}")
    assert report.replaced == [rid] and [p for p, _ in report.added] == [path]
    from mlflow.tracking import MlflowClient as Local

    mirrored = Local(tracking_uri=f"sqlite:///{db}").get_run(report.added[0][1])
    assert mirrored.info.status == "FINISHED" and mirrored.data.tags["bench.run_id"] == result.run_id


def test_a_store_that_failed_for_the_run_and_its_references_is_said_once_with_every_kept_file() -> None:
    from bench_stability_gap.harness.results.tracking import NotMirrored, not_mirrored

    cause = "MLflow tracking store sqlite:////r/mlflow.db is not usable: OSError: [Errno 28] No space left on device."
    sync = "bench sync --results-dir /r"
    joint, best = (NotMirrored(cause, Path(f"/r/{name}.json"), sync) for name in ("joint", "best"))
    assert str(joint) == f"{cause} The result is kept in /r/joint.json; mirror it once the store works with: {sync}"
    both = str(not_mirrored(cause, Path("/r/run.json"), [joint, best], sync))
    assert both == (f"{cause} The results are kept in /r/joint.json, /r/best.json and /r/run.json; mirror them to "
                    f"MLflow later with: {sync}")
    assert str(not_mirrored(None, Path("/r/run.json"), [joint], sync)) == (
        f"{cause} The result is kept in /r/joint.json; mirror it to MLflow later with: {sync}")
    other = NotMirrored("The MLflow server http://h:5000 cannot be reached.", Path("/r/best.json"), sync)
    assert str(not_mirrored(cause, Path("/r/run.json"), [other], sync)).startswith(f"{cause} {other.cause} The results")


def test_a_stop_while_mirroring_a_stored_result_says_so_and_sync_completes_the_record(tmp_path, seeded_store,
                                                                                       monkeypatch) -> None:
    """Ctrl-C after the result is stored, while its MLflow record is logged: the note says the result is
    stored and names `bench sync` (not that nothing was written), the record is closed as KILLED, never
    left RUNNING, and sync completes it."""
    import support
    from bench_stability_gap.harness.sweep import mirror

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    protocol, results = support.small_protocol(tmp_path), seeded_store(tmp_path / "results")
    real = mirror.finish_live

    def stopped(live, result, path):
        if result.method.spec == "finetune":
            raise KeyboardInterrupt
        return real(live, result, path)

    monkeypatch.setattr(mirror, "finish_live", stopped)
    out = CliRunner().invoke(main, ["run", "-p", str(protocol), "-m", "finetune", "--results-dir", str(results),
                                    "--no-progress"])
    assert out.exit_code == 130, out.output
    ((stored, result),) = [(p, r) for p, r in iter_results(results) if r.method.spec == "finetune"]
    assert f"Interrupted after the result was stored ({stored})" in out.output
    assert f"bench sync --results-dir {results}" in out.output and "nothing was written" not in out.output
    assert bench_runs(results)[result.run_id].info.status == "KILLED"
    monkeypatch.setattr(mirror, "finish_live", real)
    synced = CliRunner().invoke(main, ["sync", "--results-dir", str(results)], catch_exceptions=False)
    assert synced.exit_code == 0, synced.output
    run = bench_runs(results)[result.run_id]
    assert run.info.status == "FINISHED" and run.data.tags["bench.synced"] == "true"
