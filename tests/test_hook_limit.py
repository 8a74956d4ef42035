"""A call into a method that never returns is stopped: past the hook time limit (``--hook-time-limit``, the
protocol's ``hook_time_limit``, else derived from the run's own updates) the run ends with one paragraph
naming the method, the hook and the point of the run (exit 2), its last checkpoint kept and resumable; a
sweep goes on with its other runs and ends non-zero naming the hung one. The hanging methods are
tests/plugin_hang, installed through a fake dist-info."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from bench_stability_gap.harness.run import hook_clock
from bench_stability_gap.harness.run.hook_clock import FLOOR_S, UPDATES, HookClock
from bench_stability_gap.harness.spec.protocol import load_protocol

from support import install_folder, invoke, refused, small_protocol

pytestmark = pytest.mark.slow

PLUGIN = Path(__file__).parent / "plugin_hang"
HEAD = "(bench-hang-plugin 0.0.1) did not return from"
LIMIT = 2


@pytest.fixture()
def hangs(site, monkeypatch, bench_cache):
    install_folder(site, PLUGIN, monkeypatch)
    return site


def _run(protocol: Path, results: Path, method: str, *extra: str, env: dict[str, str] | None = None):
    return invoke("run", "-m", method, "-p", str(protocol), "--results-dir", str(results), "--no-mlflow",
                  "--no-progress", "--checkpoint-every", "1", *extra, env=env)


def _said(out) -> str:
    return " ".join(out.output.split())


@pytest.mark.parametrize(("method", "call", "kept"), [
    ("hang_observe", "observe() in update 2 of session 2", "is kept: running the same command again resumes"),
    ("hang_predict", "predict() before session 2", "No checkpoint of it was saved yet"),
    ("hang_sleep", "end_session() at the end of session 2", "is kept: running the same command again resumes"),
])
def test_a_hook_that_never_returns_ends_the_run_with_one_paragraph(hangs, tmp_path, method, call, kept):
    protocol, results = small_protocol(tmp_path), tmp_path / "results"
    started = time.monotonic()
    out = _run(protocol, results, method, "--hook-time-limit", str(LIMIT))
    took = time.monotonic() - started
    refused(out, f"Method '{method}' {HEAD} {call}: it was still running after {LIMIT} s (the limit "
                 f"--hook-time-limit set)", kept, "The fault is in the method's code")
    assert "and was stopped at " in _said(out) and "bench_hang_plugin" in out.output  # where, for its author
    assert took < LIMIT + 60, took
    for saved in results.rglob("run-*.pt"):  # the checkpoint it names is whole
        assert torch.load(saved, map_location="cpu", weights_only=False)["format"] >= 1


def test_the_checkpoint_a_hung_run_keeps_resumes_once_the_method_is_fixed(hangs, tmp_path):
    protocol, results = small_protocol(tmp_path), tmp_path / "results"
    refused(_run(protocol, results, "hang_observe", "--hook-time-limit", str(LIMIT)))
    fixed = _run(protocol, results, "hang_observe", env={"BENCH_HANG": "0"})
    assert fixed.exit_code == 0, fixed.output
    assert "from its checkpoint at update 1 of session 2" in fixed.output


def test_the_default_limit_grows_with_the_run_s_slowest_update(hangs, tmp_path, monkeypatch):
    clock = HookClock(None, lambda *_: "")
    assert clock.limit() == FLOOR_S  # before any update was timed
    clock.slowest = FLOOR_S / UPDATES * 2
    assert clock.limit() == pytest.approx(2 * FLOOR_S)
    assert HookClock(7.0, lambda *_: "").limit() == 7.0
    # no limit given: the derived one stops the run all the same (its floor made short here)
    monkeypatch.setattr(hook_clock, "FLOOR_S", 1.0)
    out = _run(small_protocol(tmp_path), tmp_path / "results", "hang_observe")
    refused(out, f"{HEAD} observe() in update 2 of session 2", f"{UPDATES} x its slowest update so far")


def test_a_protocol_sets_the_limit_without_changing_its_spec_hash(hangs, tmp_path):
    path = small_protocol(tmp_path)
    plain = load_protocol(str(path)).spec_hash
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "hook_time_limit": LIMIT}))
    assert load_protocol(str(path)).spec_hash == plain  # how long a call may take changes no number
    refused(_run(path, tmp_path / "results", "hang_predict"), f"{HEAD} predict() before session 2: it was still "
                                                               f"running after {LIMIT} s (the limit the protocol's "
                                                               f"hook_time_limit set)")


def test_a_hook_that_catches_the_stop_ends_the_process(hangs, tmp_path):
    """A call the signal cannot stop (here it catches every exception) ends the process after the grace
    period, with the same paragraph and exit 2; the checkpoint saved before stays whole."""
    protocol, results = small_protocol(tmp_path), tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hangs), str(PLUGIN), *sys.path])}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bench_stability_gap.harness.cli", "run", "-m", "hang_swallow",
                           "-p", str(protocol), "--results-dir", str(results), "--no-mlflow", "--no-progress",
                           "--checkpoint-every", "1", "--hook-time-limit", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    took = time.monotonic() - started
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"Method 'hang_swallow' {HEAD} observe() in update 2 of session 2" in said, said
    assert "no signal could stop it" in said and "Its last checkpoint" in said, said
    assert took < 1 + hook_clock.GRACE_S + 60, took
    (saved,) = results.rglob("run-*.mid.pt")
    assert torch.load(saved, map_location="cpu", weights_only=False)["format"] >= 1


def test_a_sweep_goes_on_past_a_run_that_hangs_and_ends_non_zero_naming_it(hangs, tmp_path):
    protocol = small_protocol(tmp_path)
    sweep = tmp_path / "hang.yaml"
    sweep.write_text(yaml.safe_dump({"name": "hang", "seeds": [0], "runs": [
        {"protocol": protocol.name, "methods": ["hang_observe", "finetune"]}]}))
    results = tmp_path / "results"
    started = time.monotonic()
    out = invoke("sweep", str(sweep), "--results-dir", str(results), "--no-mlflow", "--no-progress",
                 "--hook-time-limit", str(LIMIT))
    took = time.monotonic() - started
    said = _said(out)
    assert out.exit_code == 2, out.output
    assert f"Method 'hang_observe' {HEAD} observe() in update 2 of session 2" in said, said
    assert "The sweep goes on with its other runs." in said
    assert "1 run(s) of the sweep did not finish" in said and "plugin_reduced hang_observe seed 0" in said, said
    stored = {p.parent.name for p in (results / "runs").rglob("*.json")}
    assert {"finetune", "vanilla", "joint"} <= stored and "hang_observe" not in stored, stored
    assert took < LIMIT + 60, took
