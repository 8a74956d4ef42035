"""The leaderboard site is built beside ``--out`` and swapped in whole: a build killed or failing half-way
leaves the previous site as it was, and a folder that cannot take the site is refused before any result
is read."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench_stability_gap.harness import atomic
from bench_stability_gap.harness.atomic import STORAGE_EXIT
from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.results.schema import load_result, save_result

FIXTURES = Path(__file__).parent / "browser" / "fixtures"

# a build whose 4th file write pauses, so that the test can SIGKILL it half-way
PAUSING_BUILD = """
import pathlib, sys, time
real = pathlib.Path.write_text
written = []
def write_text(self, *args, **kwargs):
    out = real(self, *args, **kwargs)
    written.append(self)
    if len(written) == 4:
        print("PAUSED", self, flush=True)
        time.sleep(300)
    return out
pathlib.Path.write_text = write_text
from bench_stability_gap.harness.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture()
def results(tmp_path) -> Path:
    root = tmp_path / "results"
    for path in sorted(FIXTURES.glob("*.json")):
        save_result(root, load_result(path))
    return root


def build(results: Path, out: Path):
    return CliRunner().invoke(main, ["leaderboard", "build", "--results", str(results), "--out", str(out)],
                              catch_exceptions=False)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_build_killed_half_way_leaves_the_previous_site_intact(results, tmp_path):
    site = tmp_path / "site"
    assert build(results, site).exit_code == 0
    before = snapshot(site)
    assert "index.html" in before and any(k.startswith("runs/") for k in before)

    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.Popen([sys.executable, "-c", PAUSING_BUILD, "leaderboard", "build", "--results", str(results),
                             "--out", str(site)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PAUSED"), (line, proc.stderr.read() if proc.poll() is not None else "")
        assert snapshot(site) == before  # mid-build: the files being written are elsewhere
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    assert snapshot(site) == before
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".site.")]
    assert leftovers, "the killed build wrote somewhere other than a sibling temporary folder"

    again = build(results, site)
    assert again.exit_code == 0, again.output
    assert snapshot(site).keys() == before.keys()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".site.")], "leftovers of killed builds stay"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_failed_site_write_keeps_the_previous_site(results, tmp_path, monkeypatch, code):
    site = tmp_path / "site"
    assert build(results, site).exit_code == 0
    (site / "notes.txt").write_text("mine")  # the user's own file beside the site
    before = snapshot(site)
    real, calls = Path.write_text, []

    def write_text(self, *args, **kwargs):
        calls.append(self)
        if len(calls) == 5:
            raise OSError(code, os.strerror(code), str(self))
        return real(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "write_text", write_text)
        failed = build(results, site)
    assert failed.exit_code == STORAGE_EXIT, failed.output
    assert "Traceback" not in failed.output
    for needle in ("Could not write the leaderboard site", os.strerror(code), f"previous site in {site} is unchanged",
                   "run the same command"):
        assert needle in failed.output, (needle, failed.output)
    assert snapshot(site) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".site.")]
    rebuilt = build(results, site)
    assert rebuilt.exit_code == 0 and (site / "notes.txt").read_text() == "mine"  # the user's file stays


def test_a_read_only_out_is_refused_before_any_result_is_read(results, tmp_path, monkeypatch):
    site = tmp_path / "ro" / "site"
    real = atomic.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kw):
        if Path(dir) == site.parent:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return real(*args, dir=dir, **kw)

    read = []
    monkeypatch.setattr(atomic.tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr("bench_stability_gap.leaderboard.sources.load", lambda *a, **k: read.append(a))
    out = build(results, site)
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output and str(site.parent) in out.output and "Read-only file system" in out.output
    assert not read


def test_out_that_is_not_a_folder_is_named(results, tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("x")
    out = build(results, taken)
    assert out.exit_code == 2 and f"--out {taken} exists but is not a folder" in out.output
    dev = build(results, Path("/dev/zero"))
    assert dev.exit_code == 2 and "is not a folder" in dev.output
