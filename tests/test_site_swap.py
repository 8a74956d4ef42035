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


def test_a_site_built_over_its_own_results_deletes_nothing(results, tmp_path):
    """A folder that holds results and an earlier site (written before run refused site folders) is refused
    as --out with exit 2 naming both, before anything is read; every file stays as it was."""
    site = tmp_path / "site"
    assert build(results, site).exit_code == 0
    from shutil import copytree
    copytree(results / "runs", site / "runs", dirs_exist_ok=True)  # results stored inside the earlier site
    before = snapshot(site)
    out = build(site, site)
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output and f"--out {site}" in out.output and str(site) in out.output
    assert "results folder" in out.output and "nothing was written" in out.output
    assert snapshot(site) == before
    # a results folder elsewhere, the site inside it or around it: refused the same way
    for out_dir in (results / "site", results.parent):
        refused = build(results, out_dir)
        assert refused.exit_code == 2 and str(results) in refused.output, refused.output
    assert not (results / "site").exists()


def test_run_refuses_a_site_folder_as_results(results, tmp_path):
    site = tmp_path / "site"
    assert build(results, site).exit_code == 0
    before = snapshot(site)
    for where in (site, site / "runs"):
        out = CliRunner().invoke(main, ["run", "-p", "tiny_cil", "-m", "vanilla", "--results-dir", str(where),
                                        "--no-mlflow"])
        assert out.exit_code == 2, out.output
        assert f"The results folder {where}" in out.output and "leaderboard site" in out.output, out.output
    assert snapshot(site) == before


def test_a_rebuild_removes_only_the_files_a_build_listed(results, tmp_path):
    site = tmp_path / "site"
    assert build(results, site).exit_code == 0
    listed = (site / ".bench-leaderboard").read_text()
    assert "index.html" in listed and "runs/" in listed
    (site / "runs" / "mine").mkdir()
    (site / "runs" / "mine" / "notes.md").write_text("kept")  # the user's file in a folder a build writes to
    (site / "plots" / "extra.txt").write_text("mine too")
    assert build(results, site).exit_code == 0
    assert (site / "runs" / "mine" / "notes.md").read_text() == "kept"
    assert (site / "plots" / "extra.txt").read_text() == "mine too"


def test_a_symlinked_site_is_rebuilt_through_its_link(results, tmp_path):
    real = tmp_path / "real-site"
    assert build(results, real).exit_code == 0
    link = tmp_path / "link"
    link.symlink_to(real)
    again = build(results, link)
    assert again.exit_code == 0, again.output
    assert link.is_symlink() and (link / "index.html").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".link.", ".real-site."))]


def test_symlink_loops_are_named(results, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for args in (["leaderboard", "build", "--results-dir", str(loop), "--out", str(tmp_path / "s")],
                 ["leaderboard", "build", "--results-dir", str(results), "--out", str(loop)],
                 ["leaderboard", "table", "--results-dir", str(loop)],
                 ["sync", "--results-dir", str(loop)],
                 ["sweep", "table1_tiny_cil", "--dry-run", "--results-dir", str(loop)],
                 ["tune", "tiny_cil", "vanilla", "--results-dir", str(loop)],
                 ["run", "-p", "tiny_cil", "-m", "vanilla", "--results-dir", str(loop), "--no-mlflow"]):
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 2, (args, out.output)
        assert "symlink loop" in out.output and "Traceback" not in out.output, (args, out.output)
