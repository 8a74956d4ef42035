"""Results folders tolerate junk, results keep the user's umask, and a full disk never loses a result
silently."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench_stability_gap.harness import atomic
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.results.schema import RunResult, iter_results, load_result, result_path, save_result
from bench_stability_gap.leaderboard.sources import load_folder

FIXTURES = Path(__file__).parent / "browser" / "fixtures"


def a_result() -> RunResult:
    return load_result(sorted(FIXTURES.glob("*.json"))[0])


@pytest.fixture(autouse=True)
def no_read_for_root(monkeypatch) -> None:
    """Root reads files whatever their mode: make a mode-0 file unreadable for every user."""
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.exists() and stat.S_IMODE(self.stat().st_mode) == 0 and self.is_file():
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)


@pytest.fixture
def junk_folder(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A results folder with one good run and every kind of junk beside it; junk name -> expected reason."""
    root = tmp_path / "results"
    good = save_result(root, a_result())
    proto = good.parents[1]
    junk = {
        "dangling.json": "dangling symbolic link",
        "loop.json": "symbolic link loop",
        "folder.json": "a folder named like a result file",
        "copy.json": "symbolic link (->",
        "linked_dir": "symbolic link (->",
    }
    (proto / "dangling.json").symlink_to(proto / "nowhere.json")
    (proto / "loop.json").symlink_to(proto / "loop.json")
    (proto / "folder.json").mkdir()
    (proto / "copy.json").symlink_to(good)
    (proto / "linked_dir").symlink_to(good.parent, target_is_directory=True)
    unreadable = proto / "unreadable.json"
    unreadable.write_text("{}")
    unreadable.chmod(0)
    junk["unreadable.json"] = "cannot be read (Permission denied)"
    if os.geteuid() != 0:  # root lists every folder
        locked = proto / "locked"
        locked.mkdir()
        locked.chmod(0)
        junk["locked"] = "cannot be read (Permission denied)"
    yield root, good, junk
    for name in ("locked", "unreadable.json"):
        if (proto / name).exists():
            (proto / name).chmod(0o700)


def test_runner_scan_skips_junk_with_a_warning_naming_each_entry(junk_folder, capsys) -> None:
    root, good, junk = junk_folder
    found = iter_results(root, a_result().protocol.name)
    assert [p for p, _ in found] == [good] and isinstance(found[0][1], RunResult)
    err = capsys.readouterr().err
    for name, reason in junk.items():
        line = next((l for l in err.splitlines() if f"/{name}:" in l), None)
        assert line is not None and line.startswith("Warning: skipped ") and reason in line, (name, err)


def test_a_corrupt_result_beside_a_run_is_said_not_silently_retrained(tmp_path, capsys) -> None:
    """A cut-short result is set apart from the selection a run or sweep reads (so the run trains again),
    and a warning names the file and why."""
    from bench_stability_gap.harness.results.comparability import stored_selection

    good = a_result()
    path = save_result(tmp_path, good)
    cut = path.with_name("seed0-cut.json")
    cut.write_bytes(path.read_bytes()[:300])
    sel = stored_selection(tmp_path, good.protocol.name, good.protocol.hash, [])
    assert cut in [p for (p, _), _ in sel.apart]
    err = capsys.readouterr().err
    assert f"Warning: skipped {cut}: " in err and "corrupt or not a bench result" in err, err
    assert f"skipped {path}" not in err  # a result set apart for a reason of its own is no junk to warn of


def test_leaderboard_folder_source_skips_junk_and_names_it(junk_folder) -> None:
    root, good, junk = junk_folder
    warnings: list[str] = []
    loaded = load_folder(root, warnings.append)
    assert [e.source for e in loaded.entries] == [str(good)]
    skipped = {Path(source).name: reason for source, reason in loaded.skipped}
    assert set(skipped) == set(junk)
    for name, reason in junk.items():
        assert reason in skipped[name]
    assert len(warnings) == len(junk)


def test_leaderboard_build_survives_junk(junk_folder, tmp_path) -> None:
    from bench_stability_gap.harness.cli import main

    root, _, junk = junk_folder
    out = CliRunner().invoke(main, ["leaderboard", "build", "--results-dir", str(root), "--out", str(tmp_path / "site")])
    assert out.exit_code == 0, out.output
    assert "Traceback" not in out.output and (tmp_path / "site" / "index.html").is_file()


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_results_are_created_with_the_users_umask(tmp_path, umask) -> None:
    old = os.umask(umask)
    try:
        path = save_result(tmp_path, a_result())
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def _full_disk_below(folder: Path, monkeypatch) -> None:
    """Every write under ``folder`` fails as on a full disk (fsync is where a full disk shows)."""
    real_fsync, real_mkstemp = os.fsync, atomic.tempfile.mkstemp
    doomed: set[int] = set()

    def mkstemp(*args, dir=None, **kw):
        fd, name = real_mkstemp(*args, dir=dir, **kw)
        doomed.discard(fd)  # descriptor numbers are reused
        if Path(dir).resolve().is_relative_to(folder.resolve()):
            doomed.add(fd)
        return fd, name

    def fsync(fd):
        if fd in doomed:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(atomic.tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(atomic.os, "fsync", fsync)


def test_full_disk_at_the_final_write_keeps_the_result_elsewhere(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(atomic, "rescue_folder", lambda: tmp_path / "rescue")
    result = a_result()
    root = tmp_path / "results"
    _full_disk_below(root, monkeypatch)
    with pytest.raises(BenchError) as err:
        save_result(root, result)
    kept = tmp_path / "rescue" / result_path(root, result).name
    message = str(err.value)
    assert "No space left on device" in message and str(kept) in message and str(result_path(root, result)) in message
    assert load_result(kept) == result
    assert not any(p.is_file() for p in root.rglob("*")), "no half-written file left behind"


def test_full_disk_everywhere_says_exactly_what_was_lost(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(atomic, "rescue_folder", lambda: tmp_path / "rescue")
    result = a_result()
    _full_disk_below(tmp_path, monkeypatch)
    with pytest.raises(BenchError) as err:
        save_result(tmp_path / "results", result)
    assert f"the result of run {result.run_id} is lost" in str(err.value)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_validate_a_folder_named_like_a_result(tmp_path) -> None:
    from bench_stability_gap.harness.cli import main

    folder = tmp_path / "x.json"
    folder.mkdir()
    out = CliRunner().invoke(main, ["validate", str(folder)], catch_exceptions=False)
    assert out.exit_code == 2 and f"Result file {folder} is a folder, not a file" in out.output and "Traceback" not in out.output


def test_a_table_or_figure_never_replaces_stored_work_or_an_input(tmp_path) -> None:
    from bench_stability_gap.harness.cli import main
    from bench_stability_gap.harness.paths import SITE_MARKER, check_output_file

    results = tmp_path / "R"
    stored = save_result(results, a_result())
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: x\nseeds: [0]\nruns: [{protocol: tiny_cil, methods: [vanilla]}]\n")
    kept = {stored: stored.read_bytes(), sweep: sweep.read_bytes()}
    for target, results_dir, words in (
        (stored, results, "lies inside a results folder"),  # a stored result
        (tmp_path, results, "is a folder"),
        (sweep, results, "is the command's own input"),
        (tmp_path / "new" / "t.md", tmp_path / "new", "lies inside the results folder"),  # nothing stored there yet
    ):
        res = CliRunner().invoke(main, ["sweep", str(sweep), "--dry-run", "--results-dir", str(results_dir),
                                        "--table", str(target)])
        assert res.exit_code == 2 and words in res.output and "nothing has run" in res.output, res.output
    assert all(path.read_bytes() == data for path, data in kept.items())
    site = tmp_path / "site"
    site.mkdir()
    (site / SITE_MARKER).write_text("")
    with pytest.raises(BenchError, match="lies inside a leaderboard site"):
        check_output_file(site / "curve.png", "--out")
    beside = tmp_path / "tables" / "t.md"
    assert check_output_file(beside, "--table", results) == beside.resolve() and beside.parent.is_dir()


def test_a_checkpoint_unreadable_twice_keeps_both_copies_for_a_post_mortem(tmp_path) -> None:
    from bench_stability_gap.harness.run.checkpoint import Checkpointer

    saver = Checkpointer(tmp_path / "run-x.pt", every=2)
    for garbage in (b"first", b"second"):
        saver.path.write_bytes(garbage)
        assert saver.load() is None and not saver.path.exists()
    kept = sorted(p.read_bytes() for p in tmp_path.glob("run-x.pt.corrupt-*"))
    assert kept == [b"first", b"second"]



def test_a_stop_during_a_checkpoint_write_is_the_stop_not_the_writers_error(tmp_path) -> None:
    """Ctrl-C inside torch.save makes its zip writer's clean-up raise a RuntimeError ('unexpected pos');
    that must surface as the KeyboardInterrupt it was (exit 130 and the resume note), with the checkpoint
    written before it intact and no temporary file left."""
    import torch

    from bench_stability_gap.harness.run.checkpoint import Checkpointer

    saver = Checkpointer(tmp_path / "run-x.pt", every=2)
    saver.save({"w": torch.ones(3)})
    before = saver.path.read_bytes()

    class Stopped(KeyboardInterrupt):  # as SIGTERM is delivered: a KeyboardInterrupt of its own kind
        pass

    real_save = torch.save
    writes = []

    def interrupted(obj, fh, *args, **kwargs):
        class Stopping:
            def write(self, data):
                writes.append(len(data))
                if len(writes) == 3:
                    raise Stopped
                return fh.write(data)

            def flush(self):
                return fh.flush()

        return real_save(obj, Stopping(), *args, **kwargs)

    torch.save = interrupted
    try:
        with pytest.raises(Stopped):
            saver.save({"w": torch.zeros(1000, 1000)})
    finally:
        torch.save = real_save
    assert len(writes) == 3 and saver.path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["run-x.pt"]
