"""Provenance: every result records a content hash of the code behind its method string, and the
leaderboard never averages runs made with different code (an edited editable install included)."""

from __future__ import annotations

from pathlib import Path

from bench_stability_gap.methods.registry import Entry, _tree_hash, code_hash, code_root
from bench_stability_gap.leaderboard.aggregate import summarize
from bench_stability_gap.leaderboard.sources import load_folder
from tests.test_leaderboard import clone, real_results, write_results


def test_code_hash_changes_when_a_plugin_file_is_edited_and_not_otherwise(tmp_path, monkeypatch):
    pkg = tmp_path / "bench_hash_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "defaults.yaml").write_text("probe: {default: {lr: 0.1}}\n")
    (pkg / "__pycache__").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = Entry("probe", "bench.methods", "bench_hash_probe:M", "bench-hash-probe", "1.0")
    assert code_root("bench_hash_probe") == pkg
    first = code_hash([entry])
    (pkg / "__pycache__" / "junk.pyc").write_bytes(b"\0")  # byte code is not the distribution's content
    _tree_hash.cache_clear()
    assert code_hash([entry]) == first
    (pkg / "defaults.yaml").write_text("probe: {default: {lr: 0.2}}\n")  # an edit in place: same version
    _tree_hash.cache_clear()
    assert code_hash([entry]) != first
    bumped = Entry("probe", "bench.methods", "bench_hash_probe:M", "bench-hash-probe", "1.1")
    assert code_hash([bumped]) != code_hash([entry])


def test_builtins_hash_the_methods_package_not_the_whole_checkout():
    entry = Entry("vanilla", "bench.methods", "bench_stability_gap.methods.baselines:Vanilla", "bench-stability-gap", "0")
    assert code_root("bench_stability_gap.methods.baselines").name == "methods"
    assert len(code_hash([entry])) == 16


def test_the_leaderboard_gives_each_code_version_its_own_row(tmp_path: Path):
    results = real_results()
    vanilla = [r for r in results if r.method.spec == "vanilla"]
    stamped = [r.model_copy(update={"method": r.method.model_copy(update={"code_hash": "a" * 16})}) for r in vanilla]
    others = [r for r in results if r.method.spec != "vanilla"]
    root = write_results(tmp_path / "results", others + stamped)
    (board,) = summarize(load_folder(root).entries)
    assert "vanilla" in {r.method for r in board.rows}  # one code version: the row as before
    # the plugin is edited and seed 0 re-run: that seed's newest run is now other code than seed 1's
    seed0 = next(r for r in stamped if r.seed == 0)
    edited = clone(seed0, shift=-0.05, method="vanilla", started_at="2999-01-01T00:00:00+00:00")
    edited = edited.model_copy(update={"method": edited.method.model_copy(update={"code_hash": "b" * 16})})
    write_results(root, [edited])
    (board,) = summarize(load_folder(root).entries)
    # never one row over two code versions: each version is its own row, with the one seed it has
    rows = {r.method: r for r in board.rows if r.method.startswith("vanilla")}
    assert set(rows) == {"vanilla #aaaaaaaa", "vanilla #bbbbbbbb"}
    assert all(r.partial and len(r.runs) == 1 for r in rows.values())
    reasons = {e.method: e.reason for e in board.unranked if e.result.method.base == "vanilla"}
    assert "superseded" in reasons["vanilla"]  # hash a's seed-0 run: the newer run of its seed is used


def test_a_process_records_the_code_it_started_with(tmp_path: Path, monkeypatch):
    """The method's code hash and the checkout's commit are read once per process: a checkout edited or
    moved to another commit while a long sweep runs does not relabel the results of the code it loaded."""
    import subprocess
    from types import SimpleNamespace

    from bench_stability_gap.harness.results import schema

    pkg = tmp_path / "bench_started_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = Entry("probe", "bench.methods", "bench_started_probe:M", "bench-started-probe", "1.0")
    first = code_hash([entry])
    (pkg / "__init__.py").write_text("X = 2\n")  # edited after the process read it
    assert code_hash([entry]) == first

    schema.git_commit.cache_clear()
    heads = iter(["a" * 40, "b" * 40])
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=0, stdout=next(heads) + "\n"))
    assert schema.git_commit() == "a" * 40
    assert schema.git_commit() == "a" * 40  # HEAD moved to b...: still the commit the process started from
    schema.git_commit.cache_clear()
    assert schema.git_commit() == "b" * 40  # a fresh process reads the new commit
    schema.git_commit.cache_clear()
