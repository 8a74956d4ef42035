"""Duplicate work waits: two identical commands started together train once (the second waits, then
reuses what the first stored); ``--no-wait`` refuses at once naming the holder; a lock left by a killed
process is taken over, and its checkpoint resumed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from bench_stability_gap.harness.results.schema import iter_results
from warm_cli import WarmCli, WarmProcess

pytestmark = pytest.mark.slow


ENV = {**{k: v for k, v in os.environ.items() if k != "BENCH_KILL_AT"}, "MLFLOW_DISABLE_TELEMETRY": "true",
       "PYTHONUNBUFFERED": "1"}


def command(protocol: Path, results: Path, *extra: str) -> list[str]:
    return ["run", "-p", str(protocol), "-m", "vanilla", "--results-dir", str(results), "--no-mlflow", "--no-progress",
            "--checkpoint-every", "2", *extra]


def start(cli: WarmCli, protocol: Path, results: Path, *extra: str) -> WarmProcess:
    """``bench run`` in a process of its own (its own pid, locks and signals), forked warm; stderr into stdout."""
    return cli.popen(command(protocol, results, *extra), env=ENV, merge_stderr=True)


def labels(results: Path) -> list[str]:
    return sorted(r.label for _, r in iter_results(results))


def test_two_identical_runs_started_together_train_once(tiny_protocol_file, tmp_path, warm_cli):
    results = tmp_path / "r"
    first, second = start(warm_cli, tiny_protocol_file, results), start(warm_cli, tiny_protocol_file, results)
    said = [p.communicate(timeout=900)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], said
    assert labels(results) == ["joint", "vanilla"]  # one of each: nothing was computed twice
    both = "".join(said)
    assert both.count("training it first") == 1  # the joint reference trained by one process only
    assert "waiting for it, then reusing what it stores" in both
    assert sum("Reusing run" in s for s in said) == 1


def test_no_wait_names_the_holder_and_a_killed_holders_lock_is_taken_over(tiny_protocol_file, tmp_path, warm_cli):
    results = tmp_path / "r"
    holder = start(warm_cli, tiny_protocol_file, results)
    try:
        seen = []
        for line in holder.stdout:
            seen.append(line)
            if "training it first" in line:  # the joint reference's claim is held
                break
        deadline = time.monotonic() + 60  # let it store a checkpoint, so the takeover has one to resume
        while not list((results / "checkpoints").glob("*.pt")) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Freeze it holding its claim: a reduced protocol can otherwise finish, and release every claim,
        # before the refused command below has even imported torch.
        holder.send_signal(signal.SIGSTOP)
        refused = warm_cli.run(command(tiny_protocol_file, results, "--no-wait"), env=ENV, timeout=600)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"bench process {holder.pid}" in refused.stderr and "--no-wait" in refused.stderr
        assert "Traceback" not in refused.stderr
        had = list((results / "checkpoints").glob("*.pt"))
        holder.send_signal(signal.SIGKILL)  # its claims are left behind as lock files
        holder.wait(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert list((results / "checkpoints").glob("*.lock"))
    after = warm_cli.run(command(tiny_protocol_file, results), env=ENV, timeout=900)
    said = after.stdout + after.stderr
    assert after.returncode == 0, said[-3000:]
    assert "waiting for it" not in said  # the dead holder's lock did not block anyone
    assert had  # what it had checkpointed was resumed, not recomputed
    assert "Resuming" in said or "resuming" in said, said[-3000:]
    assert labels(results) == ["joint", "vanilla"]
