"""Drawn figures are kept in the bench cache: a rebuilt site draws only figures whose data, drawing code,
matplotlib or font changed, gives the same bytes as drawing them, and a corrupt or unwritable cache costs
only the drawing."""

from __future__ import annotations

import dataclasses

import matplotlib
import pandas as pd
import pytest
from matplotlib.figure import Figure

from bench_stability_gap.leaderboard import figure_cache, plots
from bench_stability_gap.leaderboard.figure_cache import figure_key
from bench_stability_gap.leaderboard.site import build_site
from bench_stability_gap.leaderboard.sources import load_folder
from test_leaderboard import real_results, write_results


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    figure_cache._warned.clear()
    return tmp_path / "cache" / "figures"


@pytest.fixture()
def drawn(monkeypatch) -> list[int]:
    """How many figures were drawn (``plots.to_svg`` calls), as a one-element count."""
    count = [0]
    to_svg = plots.to_svg

    def counted(fig: Figure) -> str:
        count[0] += 1
        return to_svg(fig)

    monkeypatch.setattr(plots, "to_svg", counted)
    return count


def _line(points: list[float]) -> Figure:
    fig = Figure(figsize=(2, 1))
    fig.add_subplot().plot(points)
    return fig


def _svg(points: list[float]) -> str:
    """``plots.svg_of`` of a figure drawn from ``points`` alone, under the plots' style (fixed element ids)."""
    with matplotlib.rc_context(plots.STYLE):
        return plots.svg_of(lambda: _line(points), "points", tuple(points))


def test_the_key_moves_with_every_value_the_drawing_reads_and_with_the_code():
    frame = pd.DataFrame({"method": ["a", "b"], "value": [0.5, 0.25]})
    line = plots.Line("a", "a", "#000000")
    base = figure_key(b"code", "font.ttf", [frame, [line], "title"])
    assert base == figure_key(b"code", "font.ttf", [frame.copy(), [line], "title"])  # a function of the values
    nudged = frame.assign(value=[0.5, 0.25 + 2**-50])  # the last bits of one value
    assert figure_key(b"code", "font.ttf", [nudged, [line], "title"]) != base
    assert figure_key(b"code", "font.ttf", [frame.rename(columns={"value": "v"}), [line], "title"]) != base
    assert figure_key(b"code", "font.ttf", [frame, [dataclasses.replace(line, color="#111111")], "title"]) != base
    assert figure_key(b"code", "font.ttf", [frame, [line], "title 2"]) != base
    assert figure_key(b"code 2", "font.ttf", [frame, [line], "title"]) != base
    assert figure_key(b"code", "other.ttf", [frame, [line], "title"]) != base


def test_a_figure_is_drawn_once_and_read_back_as_the_same_svg(cache, drawn):
    first, again, other = _svg([1, 2, 3]), _svg([1, 2, 3]), _svg([3, 2, 1])
    assert drawn == [2] and first == again and other != first
    with matplotlib.rc_context(plots.STYLE):
        assert first == plots.to_svg(_line([1, 2, 3]))  # what drawing it gives
    assert len(list(cache.rglob("*.svg"))) == 2


def test_a_corrupt_figure_is_moved_aside_named_and_drawn_again(cache, drawn, capsys):
    svg = _svg([1, 2])
    (stored,) = cache.rglob("*.svg")
    text = stored.read_text()
    stored.write_text(text.replace("<svg", "<svG", 1))  # one changed byte, the seal left as it was
    assert _svg([1, 2]) == svg
    assert drawn == [2]
    said = capsys.readouterr().err
    assert f"cached figure {stored} failed verification" in said and "drawn again" in said
    assert list(stored.parent.glob(stored.name + ".corrupt-*")) and stored.read_text() == text


def test_an_unwritable_cache_costs_only_the_drawing_and_warns_once(cache, drawn, capsys):
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the folder goes")
    assert _svg([1, 2]) != _svg([2, 1])
    assert drawn == [2]
    said = capsys.readouterr().err
    assert said.count("could not store drawn figures") == 1 and "the next build draws them again" in said


def test_a_rebuilt_site_draws_nothing_again_and_is_the_same(cache, drawn, tmp_path):
    results = write_results(tmp_path / "results", real_results())
    build_site(load_folder(results), tmp_path / "first")
    made = drawn[0]
    assert made > 0 and len(list(cache.rglob("*.svg"))) == made
    build_site(load_folder(results), tmp_path / "again")
    assert drawn[0] == made  # every figure read back
    for svg in (tmp_path / "first").rglob("*.svg"):
        assert (tmp_path / "again" / svg.relative_to(tmp_path / "first")).read_bytes() == svg.read_bytes()
