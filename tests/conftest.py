"""Shared fixtures: a reduced-budget copy of the embedded protocol and its workbenches, isolated caches and
results, a plugin site folder. Helpers that are not fixtures live in support.py."""

from __future__ import annotations

import gc
import importlib
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI does; before torch is imported
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from bench_stability_gap.harness.tools.check_method import capped_spec
from bench_stability_gap.harness.spec.protocol import Protocol, load_protocol
from support import reduced_tiny

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

if TYPE_CHECKING:
    from bench_stability_gap.harness.run.workbench import Workbench


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook, whose group names it carries over
def pytest_collection_modifyitems(config, items) -> None:
    """Under pytest-xdist workers, the slow tier goes first: its tests take 10-100 s each, and handed out
    last they would queue on one worker while the other sits idle. A single process keeps the file order,
    so a plain failure in a quick test shows first."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _keep_xdist_groups(items)
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# What the in-process runs import on their way, beyond the test modules: the libraries the harness imports
# lazily (a session of many tests imports each of them in every worker anyway). Ray is left out: only the
# worker running the Ray tests needs it.
RUN_IMPORTS = ("mlflow", "mlflow.store.tracking.sqlalchemy_store", "pandas", "scipy.stats", "matplotlib.figure",
               "peft", "fvcore.nn", "optuna", "faiss")
MANY_TESTS = 100


def _import_what_runs_import() -> None:
    """``RUN_IMPORTS`` and every module of the harness, the methods and the leaderboard but the Ray executor.
    What an install without some extra cannot import is left to the tests that need it (they skip or fail
    on their own)."""
    import pkgutil

    names = list(RUN_IMPORTS)
    for part in ("harness", "methods", "leaderboard"):
        package = importlib.import_module(f"bench_stability_gap.{part}")
        names += [m.name for m in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
                  if not m.name.endswith(".ray_executor")]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            continue


def pytest_collection_finish(session) -> None:
    """Every test module is imported (torch, timm and the harness with them): move what the imports made out
    of the cyclic collector's reach. Each full collection otherwise walks them all again, some 750,000
    objects at 0.3-0.45 s a time, in collections that can never free one of them. A session of many tests
    first imports what its runs will import anyway; a few tests start without that cost."""
    if len(session.items) >= MANY_TESTS:
        _import_what_runs_import()
    gc.collect()
    gc.freeze()


def _keep_xdist_groups(items) -> None:
    """Under ``--dist loadgroup``, pytest-xdist (3.8) tells its scheduler a test's ``xdist_group`` by
    writing ``<nodeid>@<group>`` to the item's ``_nodeid``; pytest 9.2 derives ``nodeid`` from a structured
    id instead, so the suffix is lost and every group silently ignored (tests of one Ray cluster spread
    over all workers, each starting a cluster). Carry the suffixed id over; a no-op where xdist wrote none
    or where pytest still reads ``_nodeid``."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # a pytest before structured ids: xdist's suffix works as written
        return
    for item in items:
        written = vars(item).get("_nodeid")
        if isinstance(written, str) and written != item.nodeid and hasattr(item, "_id"):
            item._id = NodeId.parse(written)


def _session_folder(tmp_path_factory) -> Path:
    """The folder all of this session's processes share: under pytest-xdist, the one above each worker's own
    temporary folder (``popen-<worker>``); in a single process, the session's own."""
    base = tmp_path_factory.getbasetemp()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return base.parent if worker and base.name == f"popen-{worker}" else base


@pytest.fixture(scope="session")
def bench_cache(tmp_path_factory) -> Path:
    """One cache for the whole session, shared by its xdist workers (deployed models and trunk features are
    reused, as for users and as a sweep's processes share one): each is built once under the harness's
    file lock, not once per worker."""
    path = _session_folder(tmp_path_factory) / "bench-cache"
    path.mkdir(exist_ok=True)
    os.environ["BENCH_CACHE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def small_workbench(tmp_path_factory, bench_cache) -> Workbench:
    """The reduced tiny protocol prepared once for the session, seed 0, loaded from its file as a user's
    protocol is: stream, input stores and deployed model. A run reads it and changes nothing of it, so
    every test module that runs methods on this protocol shares it (a test needing another spec or budget
    runs on ``dataclasses.replace(small_workbench, protocol=...)``); each test keeps its own results folder."""
    path = tmp_path_factory.mktemp("small-workbench") / "tiny_cil_reduced.yaml"
    path.write_text(yaml.safe_dump(reduced_tiny()))
    return _prepared(load_protocol(str(path)), path.parent / "results")


@pytest.fixture(scope="session")
def capped_workbench(tmp_path_factory, bench_cache) -> Workbench:
    """``bench check-method``'s capped protocol (two sessions of 3 updates, storage capped at 40 samples)
    prepared once for the session, seed 0, shared as ``small_workbench`` is."""
    return _prepared(Protocol.model_validate(capped_spec()), tmp_path_factory.mktemp("capped-workbench"))


@pytest.fixture(scope="session")
def prepare_once(bench_cache):
    """``prepare`` that builds each workbench once for the session: a second call with the same protocol,
    seed and options (the results folder aside, which ``prepare`` does not read) returns the first call's
    workbench. For tests that run ``bench check-method`` over and over (one run per cheating plugin), whose
    two prepared protocols would otherwise be rebuilt, caches read and stream decoded, for every run;
    what a run reads of a workbench it leaves as it was, as ``small_workbench`` relies on."""
    import dataclasses

    from bench_stability_gap.harness.run.workbench import prepare

    built: dict[tuple, Workbench] = {}

    def once(protocol: Protocol, seed: int, options) -> Workbench:
        key = (protocol.model_dump_json(), seed, repr(dataclasses.replace(options, results_dir=Path())))
        if key not in built:
            built[key] = prepare(protocol, seed, options)
        return built[key]

    return once


@pytest.fixture()
def check_benches_once(prepare_once, monkeypatch) -> None:
    """``bench check-method`` in this process on the session's workbenches: its two protocols are the same
    for every method it checks, so the first check prepares them and later ones reuse them (every run and
    guard of a check is still its own)."""
    from bench_stability_gap.harness.tools import check_method

    monkeypatch.setattr(check_method, "prepare", prepare_once)


def _prepared(protocol: Protocol, results: Path) -> Workbench:
    from bench_stability_gap.harness.run.options import RunOptions
    from bench_stability_gap.harness.run.workbench import prepare

    return prepare(protocol, 0, RunOptions(results_dir=results, progress=False, log=False))


@pytest.fixture()
def site(tmp_path, monkeypatch):
    """An empty site folder on sys.path, where a test installs plugins (``support.install_folder``); the
    method registry's cache is cleared before and after."""
    from bench_stability_gap.methods.registry import entries

    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    entries.cache_clear()
    yield folder
    entries.cache_clear()


@pytest.fixture()
def tiny_protocol_file(tmp_path, bench_cache) -> Path:
    path = tmp_path / "tiny_cil_reduced.yaml"
    path.write_text(yaml.safe_dump(reduced_tiny()))
    return path


@pytest.fixture()
def tiny_protocol(tiny_protocol_file) -> Protocol:
    return load_protocol(str(tiny_protocol_file))


@pytest.fixture(scope="session")
def joint_results(tmp_path_factory, bench_cache) -> Path:
    """A results folder holding the reduced protocol's joint reference for seed 0, trained once for the
    session, its xdist workers included (the first to need it trains it, the others wait for it): the joint
    models cost more than the run that needs them, and tests of what a run or a sweep stores copy this folder
    (``results_with_joint``) instead of each training them again, never writing into it. Tests of the
    joint's own training (that a first run trains and announces it) keep an empty folder."""
    from filelock import FileLock

    from bench_stability_gap.harness.api import run

    folder = _session_folder(tmp_path_factory) / "joint-results"  # trained by the first worker, read by all
    folder.mkdir(exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        done = folder / "trained"
        if not done.exists():
            spec = folder / "tiny_cil_reduced.yaml"
            spec.write_text(yaml.safe_dump(reduced_tiny()))
            run(str(spec), "joint", 0, results_dir=folder / "results", mlflow=False, device="cpu")
            done.touch()
    return folder / "results"


@pytest.fixture()
def results_with_joint(tmp_path, joint_results) -> Path:
    """A fresh results folder that already holds the reduced protocol's joint reference (seed 0)."""
    import shutil

    return Path(shutil.copytree(joint_results / "runs", tmp_path / "results-with-joint" / "runs")).parent


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    """An empty MLflow sqlite store, its schema made once for the session, its xdist workers included:
    MLflow's migrations take about 20 s a store on a shared 2-core machine, a copy of the made store well
    under one."""
    from filelock import FileLock
    from mlflow.tracking import MlflowClient

    from bench_stability_gap.harness.results.tracking import import_mlflow

    import_mlflow()
    folder = _session_folder(tmp_path_factory) / "mlflow-template"
    folder.mkdir(exist_ok=True)
    db = folder / "mlflow.db"
    with FileLock(str(folder) + ".lock"):
        if not (folder / "made").exists():
            MlflowClient(f"sqlite:///{db}").search_experiments()
            (folder / "made").touch()
    return db


@pytest.fixture()
def seeded_store(mlflow_template):
    """``seed(results_dir)``: the results folder's default MLflow store starts as a copy of the template
    (the state MLflow's own first use leaves), for tests of what is logged, not of the store's creation."""
    import shutil

    def seed(results_dir: Path) -> Path:
        results_dir.mkdir(parents=True, exist_ok=True)
        db = results_dir / "mlflow.db"
        if not db.exists():
            shutil.copyfile(mlflow_template, db)
        return results_dir

    return seed


@pytest.fixture(scope="session")
def warm_cli():
    """``bench`` commands as processes of their own, forked from one pre-imported server per test process
    (``warm_cli.WarmCli``): for tests of killed, stopped or concurrent runs, not of start-up."""
    from warm_cli import WarmCli

    cli = WarmCli()
    yield cli
    cli.close()
