"""bench reproduce: a stored run made again from its file is "identical"; a tampered value is found at its
eval point; a stored run of another identity (thread count, kernel set, machine arithmetic) is said to be one,
naming the field; what cannot be made here is refused before compute."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import invoke, refused, small_protocol

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    """One vanilla run of a two-session protocol of 3 updates, stored (its own caches)."""
    folder = tmp_path_factory.mktemp("reproduce")
    spec = small_protocol(folder)
    out = invoke("run", "-p", str(spec), "-m", "vanilla", "--no-mlflow", "--results-dir", str(folder / "results"),
                 env={"BENCH_CACHE_DIR": str(folder / "cache")})
    assert out.exit_code == 0, out.output
    return next((folder / "results" / "runs").rglob("seed0-*.json"))


def _copy(stored: Path, tmp_path: Path, change) -> Path:
    data = json.loads(stored.read_text())
    change(data)
    path = tmp_path / stored.name
    path.write_text(json.dumps(data))
    return path


def test_identical(stored, tmp_path):
    out = invoke("reproduce", str(stored), "--scratch", str(tmp_path / "scratch"))
    assert out.exit_code == 0, out.output
    assert "identical:" in out.output and "bit for bit" in out.output


def test_a_tampered_point_is_found_where_it_is(stored, tmp_path):
    def tamper(data):
        data["curves"][0]["old"][1] += 0.125
    out = invoke("reproduce", str(_copy(stored, tmp_path, tamper)), "--scratch", str(tmp_path / "scratch"))
    assert out.exit_code == 1, out.output
    curve = json.loads(stored.read_text())["curves"][0]
    assert f"first at session {curve['session']}, update {curve['updates'][1]}, old" in out.output
    assert "+0.125" in out.output or "-0.125" in out.output
    assert "not the same identity" not in out.output


@pytest.mark.parametrize("field, value, named", [
    ("torch_threads", 2, "threads: stored 2, here 1"),
    ("cpu_kernels", "fast-000000000000-torch2.14.1-timm1.0.31", "cpu_kernels: stored 'fast-000000000000"),
    ("numerics", "cpu-native-avx512-Some-CPU", "numerics: stored 'cpu-native-avx512-Some-CPU'"),
])
def test_another_identity_is_named(stored, tmp_path, field, value, named):
    def tamper(data):
        data["options"][field] = value
    out = invoke("reproduce", str(_copy(stored, tmp_path, tamper)), "--scratch", str(tmp_path / "scratch"),
                 "--reuse-caches")
    assert out.exit_code == 1, out.output
    assert "not the same identity" in out.output and named in out.output
    assert "the numbers are the same" in out.output  # only the record was changed


def test_refused_before_compute(stored, tmp_path):
    other_code = _copy(stored, tmp_path, lambda d: d["method"].update(code_hash="0" * 16))
    refused(invoke("reproduce", str(other_code)), "code hash 0000000000000000")
    other_spec = _copy(stored, tmp_path, lambda d: d["protocol"].update(hash="f" * 16))
    refused(invoke("reproduce", str(other_spec)), "spec hash ffffffffffffffff", "not available")
    refused(invoke("reproduce", str(tmp_path / "missing.json")), "missing.json", "is not a file")
    shutil.rmtree(tmp_path / "scratch", ignore_errors=True)
    assert not (tmp_path / "scratch").exists()
