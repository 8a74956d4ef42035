"""Resume: a run killed with SIGKILL in the pre-training, the joint reference or a continual session, then
re-run with the same command, stores exactly the numbers an uninterrupted run stores."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from bench_stability_gap.harness.results.schema import iter_results
from support import reduced_tiny
from warm_cli import WarmCli

pytestmark = pytest.mark.slow

METHOD = "vanilla+sgm"  # its A_best reference (vanilla) and the joint train first: three phases to kill


def bench(cli: WarmCli, protocol: Path, results: Path, cache: Path, kill: str | None = None,
          *extra: str) -> subprocess.CompletedProcess:
    """``bench run`` in a process of its own (killed for real by ``BENCH_KILL_AT``), forked warm."""
    env = {**os.environ, "BENCH_CACHE_DIR": str(cache), "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("BENCH_KILL_AT", None)
    if kill:
        env["BENCH_KILL_AT"] = kill
    args = ["run", "-p", str(protocol), "-m", METHOD, "--results-dir", str(results), "--no-mlflow", "--no-progress",
            "--checkpoint-every", "2", *extra]
    return cli.run(args, env=env, timeout=600)


def stored(results: Path) -> dict[str, dict]:
    """Each stored result's numbers: curves, reference accuracies, metrics and budget (no ids or times)."""
    out = {}
    for path, r in iter_results(results):
        data = json.loads(path.read_text())
        out[r.label] = {k: data[k] for k in ("curves", "reference", "metrics", "budget", "trainable_params", "config")}
    return out


def test_killed_runs_resume_to_the_uninterrupted_numbers(tiny_protocol_file, results_with_joint, bench_cache,
                                                         tmp_path, warm_cli):
    # the uninterrupted numbers: the session's deployed model and joint reference (each made once, in one
    # go), then the run itself; the killed runs below make all three again from an empty cache and folder
    plain = bench(warm_cli, tiny_protocol_file, results_with_joint, bench_cache)
    assert plain.returncode == 0, plain.stderr
    assert not list((results_with_joint / "checkpoints").glob("*.pt"))  # removed once the result is stored

    pick = random.Random(1234)  # random kill points, the same on every machine
    # the joint kill falls past its first model (8 updates): the resume reuses that one and resumes the next
    kills = [f"pretrain:{pick.randint(3, 18)}", f"joint:{8 + pick.randint(3, 20)}",
             f"continual:{pick.randint(3, 20)}", f"continual:{pick.randint(3, 20)}"]
    results, cache = tmp_path / "killed", tmp_path / "cache-killed"
    said = []
    for kill in kills:
        died = bench(warm_cli, tiny_protocol_file, results, cache, kill)
        assert died.returncode == -signal.SIGKILL, (kill, died.returncode, died.stderr[-2000:])
        said.append(died.stdout + died.stderr)
    resumed = bench(warm_cli, tiny_protocol_file, results, cache)
    assert resumed.returncode == 0, resumed.stderr
    said.append(resumed.stdout + resumed.stderr)
    # each invocation after a kill went on from the checkpoint of the phase it killed, not from scratch
    assert "resuming at update" in said[1]  # pre-training
    assert "Resuming the joint reference" in said[2]
    assert "model 1 was finished by an earlier, stopped run; reused from its checkpoint" in said[2]  # said, not hidden
    assert "Resuming" in said[3] and "Resuming" in said[4]  # the continual runs
    assert stored(results) == stored(results_with_joint)
    assert not list((results / "checkpoints").glob("*.pt"))


@pytest.fixture(scope="module")
def killed_in_the_run(tmp_path_factory, joint_results, bench_cache, warm_cli) -> tuple[Path, Path]:
    """(protocol file, results folder) of a run killed 30 updates into its continual phase, past its A_best
    reference: killed once for the module (the kill costs a whole process); each test gets a copy."""
    folder = tmp_path_factory.mktemp("killed-in-the-run")
    protocol = folder / "tiny_cil_reduced.yaml"
    protocol.write_text(yaml.safe_dump(reduced_tiny()))
    results = folder / "results"  # the joint reference is not what these tests are about
    shutil.copytree(joint_results / "runs", results / "runs")
    died = bench(warm_cli, protocol, results, bench_cache, "continual:30")
    assert died.returncode == -signal.SIGKILL, (died.returncode, died.stderr[-2000:])
    return protocol, results


# Under pytest-xdist the tests of the killed run share one worker, so that the kill happens once.
killed_run_group = pytest.mark.xdist_group("resume-killed-run")


@pytest.fixture()
def killed_run(killed_in_the_run, tmp_path) -> tuple[Path, Path]:
    """A fresh copy of the killed run's results folder (its checkpoints and left-behind claims included)."""
    protocol, results = killed_in_the_run
    return protocol, Path(shutil.copytree(results, tmp_path / "killed"))


@killed_run_group
def test_restart_discards_the_checkpoint(killed_run, bench_cache, warm_cli):
    (protocol, results), cache = killed_run, bench_cache
    saved = list((results / "checkpoints").glob("run-*.pt"))
    assert saved  # the A_best reference finished; this run left its checkpoint(s)
    again = bench(warm_cli, protocol, results, cache, None, "--restart")
    assert again.returncode == 0, again.stderr
    assert "Resuming" not in again.stdout + again.stderr
    assert not any(p.exists() for p in saved)


@killed_run_group
def test_an_unreadable_checkpoint_is_moved_aside_and_the_run_starts_over(killed_run, bench_cache, warm_cli):
    (protocol, results), cache = killed_run, bench_cache
    (saved,) = [p for p in (results / "checkpoints").glob("run-*.pt") if not p.name.endswith(".mid.pt")]
    saved.write_bytes(saved.read_bytes()[:100])  # truncated, as a full disk leaves it
    again = bench(warm_cli, protocol, results, cache)
    assert again.returncode == 0, again.stderr
    assert "could not be read" in again.stdout + again.stderr and str(saved) in again.stdout + again.stderr
    assert list(saved.parent.glob(saved.name + ".corrupt-*"))
    assert {r.label for _, r in iter_results(results)} == {"joint", "vanilla", METHOD}
