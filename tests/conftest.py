"""Shared fixtures: a reduced-budget copy of the embedded protocol, isolated caches and results."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI does; before torch is imported
from pathlib import Path

import pytest
import yaml

from bench_stability_gap.harness.tools.check_method import reduced_spec
from bench_stability_gap.harness.spec.protocol import Protocol, load_protocol

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def pytest_collection_modifyitems(config, items) -> None:
    """Under pytest-xdist workers, the slow tier goes first: its tests take 10-100 s each, and handed out
    last they would queue on one worker while the other sits idle. A single process keeps the file order,
    so a plain failure in a quick test shows first."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def reduced_tiny(name: str = "tiny_cil", **training) -> dict:
    """tiny_cil's structure on a budget a unit test can afford (the one ``bench check-method`` uses)."""
    return reduced_spec(name, **training)


@pytest.fixture(scope="session")
def bench_cache(tmp_path_factory) -> Path:
    """One cache for the whole session (deployed model and trunk features are reused, as for users)."""
    path = tmp_path_factory.mktemp("bench-cache")
    os.environ["BENCH_CACHE_DIR"] = str(path)
    return path


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
    session: the joint models cost more than the run that needs them, and tests of what a run or a sweep
    stores copy this folder (``results_with_joint``) instead of each training them again. Tests of the
    joint's own training (that a first run trains and announces it) keep an empty folder."""
    from bench_stability_gap.harness.api import run

    folder = tmp_path_factory.mktemp("joint-results")
    spec = folder / "tiny_cil_reduced.yaml"
    spec.write_text(yaml.safe_dump(reduced_tiny()))
    run(str(spec), "joint", 0, results_dir=folder / "results", mlflow=False, device="cpu")
    return folder / "results"


@pytest.fixture()
def results_with_joint(tmp_path, joint_results) -> Path:
    """A fresh results folder that already holds the reduced protocol's joint reference (seed 0)."""
    import shutil

    return Path(shutil.copytree(joint_results / "runs", tmp_path / "results-with-joint" / "runs")).parent


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    """An empty MLflow sqlite store, its schema made once: MLflow's migrations take about 20 s a store on
    a shared 2-core machine, a copy of the made store well under one."""
    from mlflow.tracking import MlflowClient

    from bench_stability_gap.harness.results.tracking import import_mlflow

    import_mlflow()
    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()
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


def fake_training(updates):
    """What a method reads of a protocol's ``training`` section, for unit tests that fake the protocol."""
    from types import SimpleNamespace

    online = updates == "per_sample"
    return SimpleNamespace(updates=updates, budget=None, online=online,
                           session_updates=lambda n: n if online else updates)
