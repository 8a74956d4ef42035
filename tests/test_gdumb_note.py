"""GDumb on an unlimited memory is vanilla by construction (its only rule is the memory's eviction, and
nothing is evicted): the run warns before any compute, the result records why, and the leaderboard's row
carries the note in every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness.results.schema import save_result
from bench_stability_gap.harness.run import pipeline
from bench_stability_gap.harness.run.budget_guards import eviction_note
from bench_stability_gap.harness.run.options import RunOptions
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.leaderboard.aggregate import format_table, summarize
from bench_stability_gap.leaderboard.sources import load_folder
from bench_stability_gap.methods.registry import build_method


def test_the_note_applies_to_gdumb_on_unlimited_memory_only() -> None:
    unlimited = load_protocol("tiny_cil")
    assert unlimited.memory.policy == "unlimited"
    note = eviction_note(unlimited, build_method("gdumb", unlimited)[1])
    assert note is not None and "nothing is ever evicted" in note and "vanilla" in note
    assert eviction_note(unlimited, build_method("vanilla", unlimited)[1]) is None
    capped = unlimited.model_copy(update={"memory": unlimited.memory.model_copy(
        update={"policy": "reservoir", "capacity": 100})})
    assert eviction_note(capped, build_method("gdumb", capped)[1]) is None


class Stop(Exception):
    pass


def test_the_run_warns_before_any_compute(monkeypatch, tmp_path: Path, capsys) -> None:
    def no_compute(*_a, **_k):
        raise Stop
    monkeypatch.setattr(pipeline, "prepare", no_compute)
    with pytest.raises(Stop):
        pipeline.execute(load_protocol("tiny_cil"), "gdumb", 0, RunOptions(results_dir=tmp_path, log=False))
    assert "Warning: gdumb's own rule is its memory's eviction" in capsys.readouterr().err


def test_the_row_carries_the_note(tmp_path: Path) -> None:
    note = "gdumb's own rule ... nothing is ever evicted"
    for seed in (0, 1):
        save_result(tmp_path, joint_run(f"j{seed}", seed))
        save_result(tmp_path, two_session_run(f"v{seed}", "vanilla", seed))
        g = two_session_run(f"g{seed}", "gdumb", seed)
        save_result(tmp_path, g.model_copy(update={"options": {"notes": [note]}}))
    (board,) = summarize(load_folder(tmp_path).entries)
    assert {r.method: r.notes for r in board.rows} == {"vanilla": [], "gdumb": [note]}
    assert f"- gdumb: {note}" in format_table([board])
    assert f"% gdumb: {note}" in format_table([board], "latex")
    rows = {r["method"]: r for r in json.loads(format_table([board], "json"))["protocols"][0]["rows"]}
    assert rows["gdumb"]["notes"] == [note]
