"""The leaderboard's matplotlib plots: valid SVG, the expected series, the zoom on each session's first updates."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest
from results_factory import curve, hand_result, joint_run, two_session_run

from bench_stability_gap.harness.results.schema import RunResult
from bench_stability_gap.harness.results.tidy import curves_frame
from bench_stability_gap.leaderboard.aggregate import Board, Entry, summarize
from bench_stability_gap.leaderboard.plots import board_plots, first_updates, mean_band, run_plot

SVG = "{http://www.w3.org/2000/svg}"


def texts(svg: str) -> list[str]:
    """Every piece of text in the SVG (matplotlib writes real <text> elements: svg.fonttype none)."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def long_run(run_id: str, method: str, seed: int, dip: float) -> RunResult:
    """Two sessions of 10 updates, eval points 0, 1, 2, 3, 4, 6, 10; old-class accuracy dips by ``dip``."""
    points = [0, 1, 2, 3, 4, 6, 10]
    old = [0.9, 0.9 - dip, 0.9 - dip / 2, 0.85, 0.86, 0.87, 0.88]
    new = [0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.85]
    return hand_result(run_id, method, seed, curves=[curve(s, 10, points, old, new, [(o + n) / 2 for o, n in zip(old, new)])
                                                     for s in (2, 3)])


def board(*extra: RunResult) -> Board:
    results = [long_run(f"v{s}", "vanilla", s, 0.3 + 0.1 * s) for s in (0, 1)]
    results += [long_run(f"f{s}", "finetune", s, 0.8) for s in (0, 1)]
    results += [joint_run(f"j{s}", s) for s in (0, 1)] + list(extra)
    (b,) = summarize([Entry(r, source=r.run_id) for r in results])
    assert len(b.rows) >= 2, [e.reason for e in b.unranked]
    return b


def test_board_plots_are_svg_with_one_series_per_method_and_the_joint() -> None:
    b = board()
    plots = board_plots(b)
    assert list(plots) == ["old", "new", "all", "pretrain", "old-avg"]
    for stem, (title, svg) in plots.items():
        words = texts(svg)
        assert title in words
        assert {"vanilla (n=2)", "finetune (n=2)"} <= set(words), stem
        assert ("joint (mean over sessions)" if stem == "old-avg" else "joint (upper bound)") in words, stem
        if stem != "old-avg":
            assert {"S2", "S3"} <= set(words)  # session labels over the stream
    # the stability-gap zoom: one panel per session on its first updates (20% of 10 -> 2, at least points 0..3)
    assert {"S2: first 3 of 10 updates", "S3: first 3 of 10 updates"} <= set(texts(plots["old"][1]))
    assert not any("first" in w for w in texts(plots["new"][1]))


def test_same_results_give_the_same_files() -> None:
    assert board_plots(board()) == board_plots(board())


def test_mean_band_averages_seeds_and_keeps_sessions_apart() -> None:
    frame = curves_frame([two_session_run("a", lift=0.0), two_session_run("b", lift=0.2)])
    band = mean_band(frame, "old", "global_update")
    point = band[(band["session"] == 2) & (band["global_update"] == 2)].iloc[0]
    assert point["mean"] == pytest.approx(60.0) and point["std"] == pytest.approx(math.sqrt(200))  # 50 and 70 %
    assert point["count"] == 2
    # session 2's last point and session 3's first share global update 4, and stay two points
    at4 = band[band["global_update"] == 4].sort_values("session")
    assert at4["mean"].tolist() == pytest.approx([80.0, 70.0]) and at4["std"].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("points, shown", [
    ([0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 30, 40, 100], [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20]),  # 20 % of 100
    ([0, 50, 100, 150, 200, 600], [0, 50, 100, 150]),  # sparse: at least the first 3 points after update 0
])
def test_the_zoom_shows_each_sessions_first_updates(points: list[int], shown: list[int]) -> None:
    acc = [0.5] * len(points)
    r = hand_result("z", curves=[curve(s, points[-1], points, acc, acc, acc) for s in (2, 3)])
    rows = first_updates(curves_frame([r]))
    assert rows[rows["session"] == 2]["update"].tolist() == shown
    assert rows[rows["session"] == 3]["update"].tolist() == shown


def test_names_from_results_stay_literal_text() -> None:
    odd = "a$b$<script>"
    b = board(*[long_run(f"o{s}", odd, s, 0.5) for s in (0, 1)])
    for _, svg in board_plots(b).values():
        assert f"{odd} (n=2)" in texts(svg)  # no mathtext, XML-escaped in the file
        assert "<script>" not in svg


def test_run_plot_shows_each_kind_of_accuracy_and_each_session_dip() -> None:
    b = board()
    entry = next(e for e in b.ranked_runs if e.run_id == "v0")
    words = texts(run_plot(entry))
    assert {"old classes", "new classes", "all classes", "pre-training classes", "joint, old classes"} <= set(words)
    assert "vanilla, seed 0" in words and "old classes, first 20% of each session" in words
    assert run_plot(Entry(joint_run(), source="j")) is None  # a joint run has no curves to plot
