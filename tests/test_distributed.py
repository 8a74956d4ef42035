"""Sweeps that outgrow one machine, tested for real on 127.0.0.1: a Ray cluster of two nodes started with
`ray start`, and an `mlflow server` with a sqlite backend. Both are bounded in time and stopped by the
fixtures that started them (their own process trees, never anything else on the machine).

Ray resolves a loopback --node-ip-address to the machine's own interface address (by design, see
ray-project/ray#26293), so its nodes register under that address; every address the tests give is
127.0.0.1 and nothing leaves the machine.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from click.testing import CliRunner

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.results.schema import iter_results
from support import reduced_tiny
from live_servers import START_TIMEOUT_S, free_port, mlflow_server, start, stop, wait_for  # noqa: F401 - a fixture
from result_compare import differences

pytest.importorskip("ray")  # the `ray` extra; ci/install.sh installs it, so CI runs these tests

BIN = Path(sys.executable).parent
SWEEP_TIMEOUT_S = 480  # a reduced sweep on a loaded 2-core machine

# Under pytest-xdist the tests of one group run on one worker, which starts the module's cluster once for
# all of them. Every Ray check shares one sweep: a cluster's daemons (GCS, raylet, monitors, agents) and the
# torch imports of its worker processes cost more CPU than the checks, on a suite bound by its two cores.
cluster_group = pytest.mark.xdist_group("ray-cluster")


@dataclass
class Cluster:
    address: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """`ray start --head` and one `ray start --address` (a second worker node), 1 CPU each."""
    logs = tmp_path_factory.mktemp("ray-logs")
    temp = tempfile.mkdtemp(prefix="bench-ray-", dir="/tmp")  # short: Ray's unix sockets live under it
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(16)}  # a token of this test's own, for nodes and driver alike
    port = free_port()
    common = ["--block", "--num-cpus", "1", "--object-store-memory", str(80 * 2**20), "--disable-usage-stats"]
    procs: list[subprocess.Popen] = []
    try:
        for name, args in (("head", ["--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
                                     "--include-dashboard=false", "--temp-dir", temp]),
                           ("worker", ["--address", f"127.0.0.1:{port}"])):
            log = logs / f"{name}.log"
            procs.append(start([str(BIN / "ray"), "start", *args, *common], env, log))
            wait_for(lambda: "Ray runtime started" in log.read_text(), f"ray start ({name})", START_TIMEOUT_S,
                     procs[-1], log)
        yield Cluster(f"127.0.0.1:{port}", env)
    finally:
        stop(procs, grace=1.0)  # Ray's daemons ignore SIGTERM for seconds; the test is done with them
        shutil.rmtree(temp, ignore_errors=True)


def write_grid(path: Path, protocol: Path, methods: list[str], seeds: list[int]) -> Path:
    path.write_text(yaml.safe_dump({"name": path.stem, "seeds": seeds,
                                    "runs": [{"protocol": str(protocol), "methods": methods}]}))
    return path


def task_process(prefix: str) -> psutil.Process | None:
    """A Ray worker busy with a task whose name (the stage's label) starts with ``prefix``: Ray titles the
    process ``ray::<task name>`` while it runs the task."""
    for p in psutil.process_iter(["cmdline"]):
        title = " ".join(p.info["cmdline"] or [])
        if title.startswith(f"ray::{prefix}"):
            return p
    return None


def mlflow_records(results: Path, uri: str | None = None) -> dict[str, tuple[str | None, list[str], list[str]]]:
    """Per stored run's row label: its MLflow record's reference role, bench tag names and artifact names
    (the JSON's name, which holds the run id, as ``<run>.json``), from ``uri`` (by default the folder's own
    store)."""
    from mlflow.tracking import MlflowClient

    from bench_stability_gap.harness.results.tracking import REFERENCE_TAG, default_tracking_uri

    label = {r.run_id: r.label for _, r in iter_results(results)}
    client = MlflowClient(tracking_uri=uri or default_tracking_uri(results))
    (experiment,) = [e for e in client.search_experiments() if e.name.startswith("bench/")]
    out = {}
    for run in client.search_runs([experiment.experiment_id]):
        tags = run.data.tags
        files = sorted("<run>.json" if a.path.endswith(".json") else a.path
                       for a in client.list_artifacts(run.info.run_id))
        out[label[tags["bench.run_id"]]] = (tags.get(REFERENCE_TAG), sorted(k for k in tags if k.startswith("bench.")),
                                            files)
    assert len(out) == len(label)  # every stored run mirrored, none twice
    return out


@pytest.mark.slow
@cluster_group
def test_ray_sweep_survives_a_killed_worker_logs_each_result_once_and_matches_the_local_executor(
        ray_cluster, mlflow_server, bench_cache, seeded_store, tmp_path, monkeypatch):
    """A team's sweep: a two-node cluster whose tasks log to a tracking server, one worker killed mid-run.
    Ray retries the task, which resumes from its checkpoint; each stored result is logged once, by the task
    that made it; the leaderboard builds from the server; the results equal a local sweep's. Whichever path
    mirrors a run (a Ray task, a local sweep, `bench sync` of a folder), its record carries the same tags
    (the reference role included) and the same artifacts (the plot included): the sweep stores both kinds
    of reference, the joint and the A_best run (vanilla), beside the method's."""
    from mlflow.tracking import MlflowClient

    from bench_stability_gap.leaderboard.sources import load_mlflow

    # sessions of 18 updates, not 6: a session of the reduced protocol can pass between two looks at the log
    protocol = tmp_path / "tiny_cil_reduced.yaml"
    protocol.write_text(yaml.safe_dump(reduced_tiny(updates=18)))
    grid = write_grid(tmp_path / "grid.yaml", protocol, ["finetune"], [0])
    ray_results, log = tmp_path / "ray-results", tmp_path / "driver.log"
    env = {**ray_cluster.env, "BENCH_CACHE_DIR": str(tmp_path / "cache-ray")}  # caches built by the cluster
    driver = start([str(BIN / "bench"), "sweep", str(grid), "--executor", "ray", "--address", ray_cluster.address,
                    "--cpus-per-run", "1", "--results-dir", str(ray_results), "--tracking-uri", mlflow_server],
                   env, log)
    try:
        # once the first method run is in its second session, the checkpoint of its first session's end is
        # stored (the driver's log shows each phase a task enters): kill the worker running it
        past_session_2 = re.compile(r"  tiny_cil_reduced finetune seed 0: session [3-9], update")
        wait_for(lambda: past_session_2.search(log.read_text()), "a method run past its second session",
                 SWEEP_TIMEOUT_S, driver, log)
        victim = task_process("tiny_cil_reduced finetune seed 0")
        assert victim is not None, "the run ended before its worker could be killed"
        victim.kill()
        driver.wait(timeout=SWEEP_TIMEOUT_S)
    finally:
        if driver.poll() is None:
            stop([driver])
    out = log.read_text()
    assert driver.returncode == 0, out
    assert "Ray cluster: 2 node(s), 2 CPU(s)" in out and "visible and writable on all 2 node(s)" in out
    # 1 deployed + one task per joint model (4) + the joint that combines them + A_best + the run: the joint
    # reference trained as parts on the cluster is compared below with the one trained whole in one process
    assert "tasks: 8/8 done, 0 running, 0 failed, 1 retried" in out
    # Ray ran the task again, and it went on from the checkpoint, not from the run's first update
    retried = re.search(r"Retried: tiny_cil_reduced finetune seed 0 \(a worker died; attempt 2 finished it, its "
                        r"first update: session (\d), update (\d)\)", out)
    assert retried is not None, out
    assert int(retried.group(1)) >= 3, f"the retried run started over instead of resuming: {retried.group(0)}"
    assert not list((ray_results / "checkpoints").glob("*.pt"))  # a stored run leaves no checkpoint behind

    # every stored result was logged by the Ray task that made it (the killed attempt had stored nothing, so
    # it logged nothing): one MLflow run each, finished, its JSON attached
    stored = {r.run_id: r for _, r in iter_results(ray_results)}
    assert sorted(r.label for r in stored.values()) == ["finetune", "joint", "vanilla"]
    experiment = MlflowClient(tracking_uri=mlflow_server).get_experiment_by_name("bench/tiny_cil_reduced")
    runs = MlflowClient(tracking_uri=mlflow_server).search_runs([experiment.experiment_id])
    assert sorted(r.data.tags["bench.run_id"] for r in runs) == sorted(stored)
    assert all(r.info.status == "FINISHED" for r in runs)
    # the leaderboard reads the results back from the server
    loaded = load_mlflow(mlflow_server)
    assert {e.result.run_id: e.result.metrics for e in loaded.entries} == {k: r.metrics for k, r in stored.items()}
    built = CliRunner().invoke(main, ["leaderboard", "build", "--tracking-uri", mlflow_server,
                                      "--out", str(tmp_path / "site")], catch_exceptions=False)
    assert built.exit_code == 0, built.output
    assert "1 protocol(s), 2 ranked run(s)" in built.output
    assert (tmp_path / "site" / "index.html").is_file()

    # the same grid, run locally with as many torch threads as each Ray task had (1), from empty caches
    # (logging to the folder's own MLflow store, as a sweep does by default)
    local_results = seeded_store(tmp_path / "local-results")
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache-local"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = CliRunner().invoke(main, ["sweep", str(grid), "--results-dir", str(local_results), "--no-progress"],
                                   catch_exceptions=False)
    finally:
        torch.set_num_threads(threads)
    assert local.exit_code == 0, local.output
    assert len(iter_results(ray_results)) == 3  # the joint reference, the A_best run and the method run
    assert differences(local_results, ray_results) == []

    # the local sweep's results mirrored afterwards by `bench sync` into a store of their own
    synced = tmp_path / "synced-results"
    shutil.copytree(local_results / "runs", synced / "runs")
    seeded_store(synced)
    assert CliRunner().invoke(main, ["sync", "--results-dir", str(synced)], catch_exceptions=False).exit_code == 0
    ray, here, sync = (mlflow_records(ray_results, mlflow_server), mlflow_records(local_results),
                       mlflow_records(synced))
    assert set(ray) == {"finetune", "joint", "vanilla"}
    assert ray["joint"][0] == "joint" and ray["vanilla"][0] == "best_new" and ray["finetune"][0] is None
    assert all({"curves.csv", "curves.svg", "<run>.json"} <= set(ray[m][2]) for m in ("vanilla", "finetune"))
    assert ray == here == sync


def test_an_address_where_no_cluster_listens_fails_in_seconds_before_any_training(tmp_path):
    port = free_port()  # nothing listens there
    started = time.monotonic()
    out = CliRunner().invoke(main, ["sweep", "table1_tiny_cil", "--executor", "ray", "--address", f"127.0.0.1:{port}",
                                    "--results-dir", str(tmp_path)])
    assert out.exit_code == 2 and f"--address 127.0.0.1:{port}: nothing answers there" in out.output, out.output
    assert time.monotonic() - started < 60 and not (tmp_path / "runs").exists()
