"""A Ctrl-C or SIGTERM ends a run with a note that says what is on disk at that moment, whatever it stopped:
the stored result (and that its MLflow record is complete), the checkpoint a rerun resumes from, or that
none was saved yet; never "nothing was written" beside a complete result, never a checkpoint that is not
there. The stop is injected in-process at a chosen update of a chosen phase (as ``BENCH_KILL_AT`` kills
one), raised as the SIGTERM handler raises it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench_stability_gap.harness.cli import Terminated, main
from bench_stability_gap.harness.results.schema import iter_results
from bench_stability_gap.harness.run import loop, pipeline

import support

pytestmark = pytest.mark.slow

METHOD = "finetune"  # not an A_best reference: a first run trains the joint reference, vanilla, then it


def _bench(protocol: Path, results: Path, *extra: str):
    return CliRunner().invoke(main, ["run", "-p", str(protocol), "-m", METHOD, "--results-dir", str(results),
                                     "--no-progress", "--checkpoint-every", "1", *extra])


def _said(out) -> str:
    return " ".join(out.output.split())


def _named_paths(note: str) -> list[Path]:
    return [Path(p) for p in re.findall(r"(/\S+?\.(?:pt|ckpt|json))\b", note)]


@pytest.mark.parametrize(("phase", "nth", "what"), [
    ("pretrain", 3, "training the deployed model of plugin_reduced on S1"),
    ("joint", 2, "training the joint reference of plugin_reduced (seed 0)"),
    ("continual", 3, "training the A_best reference run vanilla of plugin_reduced (seed 0)"),
    ("continual", 9, "running finetune on plugin_reduced (seed 0)"),
])
def test_a_stop_in_each_phase_names_the_checkpoint_it_resumes_from(tmp_path, monkeypatch, phase, nth, what):
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))  # the deployed model is trained here
    protocol, results = support.small_protocol(tmp_path), tmp_path / "results"
    support.stop_at(monkeypatch, phase, nth, Terminated)
    out = _bench(protocol, results, "--no-mlflow")
    said = _said(out)
    assert out.exit_code == 143, out.output
    assert f"Interrupted while {what}, before it was stored." in said, said
    assert "nothing was written" not in said
    named = _named_paths(said[said.index("Interrupted while"):])
    checkpoints = [p for p in named if p.suffix in (".pt", ".ckpt")]
    assert checkpoints and all(p.is_file() for p in checkpoints), said  # the checkpoint it names is there
    assert "running the same command again resumes from it" in said
    stored = sorted(p for p, _ in iter_results(results))
    if stored:
        assert str(stored[-1]) in said, said  # what it stored before the stop is named as kept
    else:
        assert "This command stored no result before the stop." in said
    monkeypatch.setattr(loop, "maybe_die", lambda at: None)
    again = _bench(protocol, results, "--no-mlflow")
    assert again.exit_code == 0 and "resum" in again.output.lower(), again.output


def _stop_once_stored(monkeypatch) -> list[Path]:
    """SIGTERM right after the method run's JSON is written: before anything says it was."""
    real, written = pipeline.save_result, []

    def save(root: Path, result):
        path = real(root, result)
        if result.method.spec == METHOD:
            written.append(path)
            raise Terminated()
        return path

    monkeypatch.setattr(pipeline, "save_result", save)
    return written


def test_a_stop_right_after_the_result_is_stored_says_so_without_mlflow(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    protocol, results = support.small_protocol(tmp_path), tmp_path / "results"
    written = _stop_once_stored(monkeypatch)
    out = _bench(protocol, results, "--no-mlflow", "--save-predictions")
    said = _said(out)
    assert out.exit_code == 143 and written and written[0].is_file(), out.output
    assert f"Interrupted after the result was stored ({written[0]}): it is complete" in said, said
    assert "its predictions were not saved" in said and "nothing was written" not in said


def test_a_stop_right_after_the_result_is_stored_completes_its_mlflow_record(tmp_path, monkeypatch, seeded_store):
    from test_tracking import bench_runs

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    protocol, results = support.small_protocol(tmp_path), seeded_store(tmp_path / "results")
    written = _stop_once_stored(monkeypatch)
    out = _bench(protocol, results, "--save-predictions")
    said = _said(out)
    assert out.exit_code == 143 and written, out.output
    assert f"Interrupted after the result was stored ({written[0]})" in said, said
    assert "its MLflow record is complete" in said and "nothing was written" not in said, said
    ((_, result),) = [(p, r) for p, r in iter_results(results) if r.method.spec == METHOD]
    record = bench_runs(results)[result.run_id]
    assert record.info.status == "FINISHED" and record.data.tags["bench.synced"] == "true"


STOPPED_PROCESS = """
import atexit, sys, time

class Teardown:  # collected only by the interpreter's teardown of modules, after the atexit handlers
    def __del__(self):
        sys.stderr.write("TEARDOWN\\n")

KEEP = Teardown()
atexit.register(lambda: sys.stderr.write("ATEXIT\\n"))
from bench_stability_gap.harness.cli import main
main()
"""


def test_a_stopped_process_ends_promptly_without_tearing_down_every_module(tiny_protocol_file, tmp_path):
    """After the note, a stopped `bench` process ends at once: its atexit handlers run (worker processes
    are reaped, MLflow's own clean-up), but not the interpreter's teardown of every module and object,
    which wrote nothing and took 5-20 s on a loaded machine (measured: 6.4 of the 6.6 s from SIGTERM to
    exit at load 6)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_PROCESS, "run", "-p", str(tiny_protocol_file),
                             "--results-dir", str(tmp_path / "r"), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("inputs ready"):
                break
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    said = "".join(seen) + rest
    assert proc.returncode == 143, said
    assert "Interrupted" in said and "ATEXIT" in said and "TEARDOWN" not in said, said
    assert took < 30, took  # loose: the point is the teardown skipped, not a machine's speed


@pytest.mark.parametrize(("args", "code"), [(["--version"], 0), (["validate", "/no/such/protocol.yaml"], 2)])
def test_a_finished_command_runs_its_atexit_handlers_and_skips_the_teardown(args, code):
    """A `bench` process (its console script, `python -m`) ends as a stopped one does once its command is
    done, refused or not: the atexit
    handlers run, and a thread that is not a daemon is waited for, as at any exit; the interpreter's teardown
    of every module (about 1 s of CPU once torch is loaded, writing nothing) is skipped."""
    import subprocess
    import sys

    script = STOPPED_PROCESS.replace("import main\nmain()", "import entry\nentry()")
    script = script.replace("from bench_stability_gap", """import threading
def late():
    time.sleep(0.5)
    sys.stderr.write("THREAD DONE\\n")
threading.Thread(target=late).start()
from bench_stability_gap""")
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == code, said
    assert "THREAD DONE" in said and "ATEXIT" in said and "TEARDOWN" not in said, said
    assert said.index("THREAD DONE") < said.index("ATEXIT")
