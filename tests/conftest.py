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
