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
    assert not any(r.method.startswith("vanilla") for r in board.rows)  # never one row over two code versions
    reasons = {e.method: e.reason for e in board.unranked if e.result.method.base == "vanilla"}
    assert "missing seeds" in reasons["vanilla #bbbbbbbb"] and "missing seeds" in reasons["vanilla #aaaaaaaa"]
    assert "superseded" in reasons["vanilla"]  # hash a's seed-0 run: the newer run of its seed is used
