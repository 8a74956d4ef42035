"""One metric catalog feeds the CLI summary, the leaderboard's columns and the glossary."""

from __future__ import annotations

from pathlib import Path

import pytest
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness.cli import print_summary
from bench_stability_gap.harness.results.catalog import (
    CATALOG,
    METRICS,
    SUMMARY_KEYS,
    TABLE_KEYS,
    TIME_TO_RESULT_KEYS,
    format_std,
    format_value,
)
from bench_stability_gap.harness.results.metrics import TimeToResult, best_new_accuracy, compute_metrics
from bench_stability_gap.leaderboard.aggregate import COLUMNS, Board, MethodRow, Stat, format_table
from bench_stability_gap.leaderboard.glossary import TERMS


def test_every_key_is_described_once() -> None:
    keys = [m.key for m in CATALOG]
    assert len(keys) == len(set(keys))
    assert set(TABLE_KEYS) <= set(keys) and set(SUMMARY_KEYS) <= set(keys)
    for m in CATALOG:
        assert m.symbol and m.name and m.description and m.meaning and m.equation
        assert m.arrow == {"min": "↓", "max": "↑", "ref": ""}[m.direction]


def test_each_time_to_result_list_is_read_by_exactly_one_catalog_entry() -> None:
    """The catalog names the stored list each time-to-result column averages: a list added to, or renamed
    in, the result model without its entry would be stored and never shown."""
    fields = [METRICS[k].per_session[0] for k in TIME_TO_RESULT_KEYS]  # type: ignore[index]
    assert sorted(fields) == sorted(TimeToResult.model_fields)
    units = {METRICS[k].per_session[1] for k in TIME_TO_RESULT_KEYS if k.endswith("_tflops")}  # type: ignore[index]
    assert units == {1e12}  # the stored lists hold FLOPs; the columns read TFLOPs


def test_the_columns_are_the_catalog_entries() -> None:
    assert [c.key for c in COLUMNS] == list(TABLE_KEYS)
    assert all(c is METRICS[c.key] for c in COLUMNS)


def test_the_glossary_is_the_catalog() -> None:
    assert [t.key for t in TERMS] == [m.key for m in CATALOG]
    for term, info in zip(TERMS, CATALOG):
        assert (str(term.symbol), term.name, term.direction, str(term.equation), term.meaning) == (
            info.html_symbol, info.name, info.arrow if info.ranked else "", info.equation, info.meaning)


def test_format_value_and_std_follow_the_digits() -> None:
    assert format_value(0.05649, METRICS["S_delta"]) == "0.056"
    assert format_value(86.004, METRICS["sigma"]) == "86.00"
    assert format_value(1200.0, METRICS["updates"]) == "1,200"
    assert format_value(0.004, METRICS["tflops"]) == "4.00e-03"
    assert format_value(None, METRICS["alpha"]) == "–"
    assert format_std(0.01384, METRICS["S_delta"]) == "0.0138"  # one more digit for the gaps, as the paper
    assert format_std(4.534, METRICS["sigma"]) == "4.53"
    assert format_std(0.0, METRICS["sigma"]) is None and format_std(None, METRICS["sigma"]) is None


def test_the_cli_summary_prints_every_summary_metric_from_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    run, joint = two_session_run(), joint_run()
    metrics = compute_metrics(run.curves, joint.reference, best_new_accuracy([run.curves]))
    print_summary(run.model_copy(update={"metrics": metrics}), Path("r.json"))
    lines = capsys.readouterr().out.splitlines()
    expected = {"params": "1.50", "sigma": "65.00", "mu": "72.50", "alpha": "70.00",
                "S_delta": format_value(metrics.S_delta, METRICS["S_delta"])}
    for key in SUMMARY_KEYS:
        info = METRICS[key]
        line = next(line for line in lines if line.split()[:1] == [key])
        assert info.description in line and info.arrow in line
        if key in expected:
            assert line.split()[1] == expected[key], line


def test_the_text_table_header_reads_the_catalog() -> None:
    stats = {c.key: Stat(None, None, 0) for c in COLUMNS}
    board = Board(name="p", current_hash="h", hash_origin="", description=None, paper_ref=None, version=1,
                  rows=[MethodRow("m", "base", [], stats)], reference_row=None, joints={}, best_new={},
                  best_new_from={}, best_new_methods=("vanilla",), unranked=[], entries=[])
    header = next(line for line in format_table([board]).splitlines() if line.startswith("| method"))
    cells = [c.strip() for c in header.strip("|").split("|")][3:-1]  # after method, seeds, settings; the last: the paired difference
    assert cells == [f"{c.symbol}{f' ({c.unit})' if c.unit else ''}{' ' + c.arrow if c.ranked else ''}" for c in COLUMNS]
    assert cells[-1] == "wall time (s)"  # shown, never ranked: no better-direction arrow
