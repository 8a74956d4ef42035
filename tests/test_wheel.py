"""The wheel, installed alone into a fresh venv (`ci/wheel-smoke.sh`), lists its methods, finishes a reduced
run and builds a leaderboard: package data missing from the wheel, or an import that only works from a
checkout or from a package the wheel does not declare, fails here. A test rather than a step before the
suite, so that it runs beside the other tests on the suite's workers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_alone_lists_its_methods_runs_and_builds_a_leaderboard(tmp_path):
    # nothing of the suite's own set-up (its cache folder, an import path) reaches the fresh venv
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BENCH_", "PYTHON"))}
    out = subprocess.run(["bash", str(ROOT / "ci" / "wheel-smoke.sh")], capture_output=True, text=True,
                         timeout=600, env={**env, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "==> wheel smoke test passed" in out.stdout
