"""Static SVG plots drawn by matplotlib (Agg, no pyplot state) from the tidy curves frame.

Every plot reads ``harness.results.tidy.curves_frame``: mean over seeds with a ± std band per method, the
joint model's accuracy at the end of each session as stars, dotted session boundaries. The
stability gap lives in the first updates of each session, so the old-class figure and each run's
figure add a row of small multiples zoomed on the first ``ZOOM_FRACTION`` of every session.

Text stays text in the SVG (``svg.fonttype: none``), which matplotlib XML-escapes; a ``$`` in a
name from a result is escaped so it never turns into mathtext. Colours are colour-blind safe
(Okabe & Ito, ``aggregate.PALETTE``); rows past the palette differ by line style too.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from ..harness.results.tidy import curves_frame, references_frame
from .aggregate import JOINT_COLOR, PALETTE, Board, Entry
from .figure_cache import cached_svg, figure_key

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

ZOOM_FRACTION = 0.2  # the zoomed panels show this share of each session's updates (at least ZOOM_POINTS points)
ZOOM_POINTS = 3
MAX_ZOOM_COLUMNS = 6

STYLE: dict[RcKeyType, Any] = {
    "svg.fonttype": "none",  # real <text>: selectable, escaped, readable by a screen reader
    "svg.hashsalt": "bench-leaderboard",  # stable element ids: the same results give the same file
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial"],
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e6e6e6",
    "grid.linewidth": 0.6,
    "legend.frameon": False,
}


@dataclass(frozen=True)
class Line:
    """One plotted series: a label and its look (``frame`` rows are selected by ``method``)."""

    method: str
    label: str
    color: str
    dash: str = "solid"


def plain(text: str) -> str:
    """Text from a result, shown as typed: matplotlib would read ``$..$`` as mathtext."""
    return text.replace("\\", "\\\\").replace("$", r"\$")


def to_svg(fig: Figure) -> str:
    """The figure as an SVG document (no date in it: the same results give the same file)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


CODE = Path(__file__).read_bytes()  # the drawing code: a change to it draws every figure again


@functools.cache
def _font() -> str:
    """The font file STYLE lays text out with (its metrics place every label)."""
    from matplotlib import font_manager

    with matplotlib.rc_context(STYLE):
        return font_manager.findfont(font_manager.FontProperties())


def svg_of(draw: Callable[[], Figure], *parts: object) -> str:
    """``draw()``'s figure as SVG (call it under ``STYLE``); ``parts``: everything the drawing reads. The
    same parts give the SVG drawn before, from the bench cache (``figure_cache``)."""
    return cached_svg(figure_key(CODE, _font(), parts), draw, to_svg)


def legend(fig: Figure, ax: Axes, ncols: int) -> None:
    """One legend under the figure, for the main panel's series (the zoomed panels repeat them)."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=max(1, min(ncols, len(labels))))


# ------------------------------------------------------------------------------------ drawing


def mean_band(frame: pd.DataFrame, key: str, x: str, within: Sequence[str] = ("session",)) -> pd.DataFrame:
    """Per method, ``within`` group and ``x``: mean and sample std over the runs (seeds) of ``key`` in %.

    Grouping by session keeps a session's last point and the next one's first apart although they
    share a global update (the old classes change between them).
    """
    values = frame.assign(value=frame[key] * frame["scale"])
    keys = ["method", *within, x]
    return values.groupby(keys, sort=True)["value"].agg(["mean", "std", "count"]).reset_index()


def draw_lines(ax: Axes, stats: pd.DataFrame, lines: Sequence[Line], x: str) -> None:
    """Mean line per method, and a ± std band where more than one run contributed."""
    for line in lines:
        s = stats[stats["method"] == line.method]
        if s.empty:
            continue
        ax.plot(s[x], s["mean"], color=line.color, linestyle=line.dash, linewidth=1.6, label=line.label)
        band = s[s["count"] > 1]
        if not band.empty:
            ax.fill_between(band[x], band["mean"] - band["std"], band["mean"] + band["std"], color=line.color,
                            alpha=0.15, linewidth=0)


def session_starts(frame: pd.DataFrame) -> pd.DataFrame:
    """Per session: its first and last global update (from any run: a protocol fixes them)."""
    first = frame.drop_duplicates("session").sort_values("session")
    start = first["global_update"] - first["update"]
    return pd.DataFrame({"session": first["session"].to_numpy(), "start": start.to_numpy(),
                         "end": (start + first["total_updates"]).to_numpy()})


def draw_sessions(ax: Axes, sessions: pd.DataFrame) -> None:
    """Dotted boundaries and an S_j label above each session."""
    for session, start, end in zip(sessions["session"], sessions["start"], sessions["end"]):
        if start > 0:
            ax.axvline(start, color="#999999", linestyle=":", linewidth=0.9)
        ax.annotate(f"S{session}", xy=((start + end) / 2, 1.0), xycoords=("data", "axes fraction"),
                    ha="center", va="bottom", fontsize=8, color="#666666")


def draw_joint(ax: Axes, refs: pd.DataFrame, key: str, sessions: pd.DataFrame, label: str) -> None:
    """Stars: the joint model at the end of each session (mean over the seeds in use)."""
    if refs.empty:
        return
    ends = sessions.set_index("session")["end"]
    joint = (refs[key] * refs["scale"]).groupby(refs["session"]).mean()
    joint = joint[joint.index.isin(ends.index)]
    if not joint.empty:
        ax.plot(ends[joint.index], joint.to_numpy(), linestyle="none", marker="*", markersize=11,
                color=JOINT_COLOR, markeredgecolor="white", markeredgewidth=0.6, label=label, zorder=5)


def first_updates(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of each session's first ``ZOOM_FRACTION`` of updates, and at least its first
    ``ZOOM_POINTS`` eval points after update 0 (a sparse schedule still shows a dip)."""
    return frame[(frame["fraction"] <= ZOOM_FRACTION + 1e-9) | (frame["point"] <= ZOOM_POINTS)]


def draw_zoom_row(fig: Figure, grid, frame: pd.DataFrame, refs: pd.DataFrame, lines: Sequence[Line],
                  key: str = "old") -> None:
    """One small panel per session on its first updates (the stability-gap dip), with the joint model's
    end-of-session accuracy as a dashed level. Each panel's y axis spans its own data: a y range shared
    with the other sessions (or the whole stream) flattens the dip the panel exists to show."""
    zoom = first_updates(frame)
    sessions = sorted(zoom["session"].unique())
    joint = (refs[key] * refs["scale"]).groupby(refs["session"]).mean() if not refs.empty else pd.Series(dtype=float)
    cols = min(len(sessions), MAX_ZOOM_COLUMNS)
    sub = grid.subgridspec(math.ceil(len(sessions) / cols), cols)
    for i, session in enumerate(sessions):
        ax = fig.add_subplot(sub[i // cols, i % cols])
        part = zoom[zoom["session"] == session]
        draw_lines(ax, mean_band(part, key, "update"), lines, "update")
        if session in joint.index:
            ax.axhline(joint[session], color=JOINT_COLOR, linestyle="--", linewidth=1.0)
        ax.set_title(f"S{session}: first {int(part['update'].max()):,} "
                     f"of {int(part['total_updates'].iloc[0]):,} updates",
                     fontsize=8, fontweight="normal")
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        if i % cols == 0:
            ax.set_ylabel(f"{key}-class acc. (%)")


def stream_axes(ax: Axes, sessions: pd.DataFrame, y_label: str) -> None:
    draw_sessions(ax, sessions)
    ax.set_xlabel("updates (all learning sessions)")
    ax.set_ylabel(y_label)
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    lo, hi = sessions["start"].min(), sessions["end"].max()
    ax.set_xlim(lo, hi + 0.015 * (hi - lo))  # room for the last session's star


# ------------------------------------------------------------------------------- board plots


def board_lines(board: Board) -> list[Line]:
    return [Line(row.method, plain(f"{row.method} (n={len(row.runs)})" if len(row.runs) > 1 else row.method),
                 row.color, row.dash) for row in board.rows]


def board_frames(board: Board) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The curves of the ranked runs and the joint references in use, labelled by their rows."""
    runs = [e for row in board.rows for e in row.runs]
    curves = curves_frame([e.result for e in runs], labels={e.run_id: e.method for e in runs})
    refs = references_frame([e.result for e in board.joints.values()])
    return curves, refs


PLOTS: tuple[tuple[str, str, str], ...] = (
    # (file stem, curve column, title): "old" is shown full width with the zoomed row under it
    ("old", "old", "Old-class accuracy: the stability gap"),
    ("new", "new", "New-class accuracy"),
    ("all", "all", "All-class accuracy"),
    ("pretrain", "task_1", "Pre-training classes (session 1) only"),
    ("old-avg", "old", "Old-class accuracy, mean over sessions"),
)


def stream_figure(curves: pd.DataFrame, refs: pd.DataFrame, lines: Sequence[Line], key: str, title: str,
                  zoom: bool, width: float) -> Figure:
    """Accuracy over the whole stream (and, with ``zoom``, the first updates of each session below)."""
    fig = Figure(figsize=(width, 5.4 if zoom else 3.6), layout="constrained")
    grid = fig.add_gridspec(2 if zoom else 1, 1, height_ratios=[1.5, 1] if zoom else [1])
    ax = fig.add_subplot(grid[0])
    sessions = session_starts(curves)
    draw_lines(ax, mean_band(curves, key, "global_update"), lines, "global_update")
    draw_joint(ax, refs, key, sessions, "joint (upper bound)")
    what = "pre-training-class" if key == "task_1" else f"{key}-class"
    stream_axes(ax, sessions, f"{what} accuracy (%)")
    ax.set_title(title, loc="left", pad=14)
    if zoom:
        draw_zoom_row(fig, grid[1], curves, refs, lines, key)
    legend(fig, ax, 4 if width > 8 else 2)
    return fig


def average_figure(curves: pd.DataFrame, refs: pd.DataFrame, lines: Sequence[Line], title: str) -> Figure:
    """Old-class accuracy averaged over sessions at each update within a session (paper Fig. 1b)."""
    fig = Figure(figsize=(5.2, 3.6), layout="constrained")
    ax = fig.add_subplot()
    per_run = (curves.groupby(["method", "run_id", "update"], sort=True)
               .agg(old=("old", "mean"), scale=("scale", "first")).reset_index())
    draw_lines(ax, mean_band(per_run, "old", "update", within=()), lines, "update")
    if not refs.empty:
        level = (refs["old"] * refs["scale"]).groupby(refs["run_id"]).mean().mean()
        ax.axhline(level, color=JOINT_COLOR, linestyle="--", linewidth=1.0, label="joint (mean over sessions)")
    ax.set_xlabel("updates within a session")
    ax.set_ylabel("old-class accuracy (%)")
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_title(title, loc="left")
    legend(fig, ax, 2)
    return fig


COMPUTE_PLOTS: tuple[tuple[str, str, str], ...] = (
    # (file stem, curve column, title): the same accuracies against training compute, one panel per session
    ("old-tflops", "old", "Old-class accuracy against training compute"),
    ("new-tflops", "new", "New-class accuracy against training compute"),
    ("all-tflops", "all", "All-class accuracy against training compute"),
)


def compute_band(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    """Per method, session and eval point: the mean training TFLOPs since the session's start (``x``) and the
    mean, sample std and count of ``key`` in % over the runs (seeds).

    Grouped by eval point, not by x: the seeds of a method evaluate at the same points, and under a FLOP
    budget at the same compute, but an update-budgeted run's FLOPs can differ by a few samples between seeds.
    """
    values = frame.assign(value=frame[key] * frame["scale"])
    return (values.groupby(["method", "session", "point"], sort=True)
            .agg(x=("session_tflops", "mean"), mean=("value", "mean"), std=("value", "std"), count=("value", "count"))
            .reset_index())


def compute_figure(curves: pd.DataFrame, refs: pd.DataFrame, lines: Sequence[Line], key: str, title: str) -> Figure:
    """Accuracy against the training TFLOPs spent since each session's update-0 point, one panel per session
    (methods spend different compute per update, so under an update budget their sessions end at different
    x; each panel has its own x), with the joint model's end-of-session accuracy as a dashed level."""
    sessions = sorted(curves["session"].unique())
    cols = min(len(sessions), MAX_ZOOM_COLUMNS)
    rows = math.ceil(len(sessions) / cols)
    fig = Figure(figsize=(11.0, 1.3 + 2.5 * rows), layout="constrained")
    joint = (refs[key] * refs["scale"]).groupby(refs["session"]).mean() if not refs.empty else pd.Series(dtype=float)
    share = None
    for i, session in enumerate(sessions):
        ax = fig.add_subplot(rows, cols, i + 1, sharey=share)
        share = share or ax
        draw_lines(ax, compute_band(curves[curves["session"] == session], key), lines, "x")
        if session in joint.index:
            ax.axhline(joint[session], color=JOINT_COLOR, linestyle="--", linewidth=1.0, label="joint (end of session)")
        ax.set_title(f"S{session}", fontsize=8, fontweight="normal")
        ax.set_xlim(left=0)
        ax.set_xlabel("training TFLOPs since its start", fontsize=8)
        if i % cols == 0:
            ax.set_ylabel(f"{key}-class acc. (%)")
    fig.suptitle(title, x=0.01, ha="left", fontsize=10, fontweight="bold")
    if share is not None:  # no session, no panel: nothing to label
        legend(fig, share, 4)
    return fig


def compute_plots(board: Board) -> dict[str, tuple[str, str]]:
    """``stem -> (title, svg)``: the curves against training compute; empty when nothing is ranked or no
    ranked run recorded FLOPs at its eval points."""
    if not board.rows:
        return {}
    curves, refs = board_frames(board)
    curves = curves[curves["session_tflops"].notna()]
    if curves.empty:
        return {}
    lines = board_lines(board)
    with matplotlib.rc_context(STYLE):
        return {stem: (title, svg_of(functools.partial(compute_figure, curves, refs, lines, key, title),
                                     "compute", curves, refs, lines, key, title))
                for stem, key, title in COMPUTE_PLOTS}


def board_plots(board: Board) -> dict[str, tuple[str, str]]:
    """``stem -> (title, svg)`` for one protocol; empty when nothing is ranked."""
    if not board.rows:
        return {}
    curves, refs = board_frames(board)
    lines = board_lines(board)
    out = {}
    with matplotlib.rc_context(STYLE):
        for stem, key, title in PLOTS:
            if stem == "old-avg":
                draw = functools.partial(average_figure, curves, refs, lines, title)
            else:
                draw = functools.partial(stream_figure, curves, refs, lines, key, title, zoom=stem == "old",
                                         width=11.0 if stem == "old" else 5.2)
            out[stem] = (title, svg_of(draw, "board", stem, curves, refs, lines, key, title))
    return out


# --------------------------------------------------------------------------------- run plots

RUN_LINES = (  # the run's own curves: which classes, in the palette's first colours
    ("old", "old classes", PALETTE[0]),
    ("new", "new classes", PALETTE[1]),
    ("all", "all classes", PALETTE[2]),
    ("task_1", "pre-training classes", PALETTE[3]),
)


def run_plot(entry: Entry) -> str | None:
    """One run: old / new / all / pre-training-class accuracy over the stream with the joint model's
    old-class accuracy per session, and beside it the first updates of every session overlaid (the
    stability-gap dip; later sessions darker)."""
    r = entry.result
    if not r.curves:
        return None
    one = curves_frame([r])
    # one "method" per kind of accuracy, so the same drawing code serves
    long = pd.concat([one.assign(method=name, value=one[key]) for key, name, _ in RUN_LINES], ignore_index=True)
    lines = [Line(name, name, color) for _, name, color in RUN_LINES]
    refs = references_frame([entry.joint.result] if entry.joint is not None else [])
    sessions = session_starts(one)
    zoom = first_updates(one)
    title = plain(f"{r.method.spec}, seed {r.seed}")
    with matplotlib.rc_context(STYLE):
        return svg_of(functools.partial(_run_figure, long, lines, refs, sessions, zoom, title),
                      "run", long, lines, refs, sessions, zoom, title)


def _run_figure(long: pd.DataFrame, lines: Sequence[Line], refs: pd.DataFrame, sessions: pd.DataFrame,
                zoom: pd.DataFrame, title: str) -> Figure:
    """The figure ``run_plot`` draws, from the frames it reads."""
    fig = Figure(figsize=(9.0, 3.4))
    fig.subplots_adjust(left=0.07, right=0.93, top=0.86, bottom=0.27, wspace=0.2)
    grid = fig.add_gridspec(1, 2, width_ratios=[2.6, 1])
    ax = fig.add_subplot(grid[0])
    draw_lines(ax, mean_band(long, "value", "global_update"), lines, "global_update")
    draw_joint(ax, refs, "old", sessions, "joint, old classes")
    stream_axes(ax, sessions, "accuracy (%)")
    ax.set_title(title, loc="left", pad=14)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncols=5)
    dip = fig.add_subplot(grid[1])
    shades = matplotlib.colormaps["viridis"](np.linspace(0.7, 0.0, len(sessions)))
    for (session, part), shade in zip(zoom.groupby("session"), shades):
        dip.plot(part["update"], part["old"] * part["scale"], color=shade, linewidth=1.4, label=f"S{session}")
    dip.set_title(f"old classes, first {ZOOM_FRACTION:.0%} of each session", fontsize=8, fontweight="normal")
    dip.set_xlabel("updates within the session")
    dip.xaxis.set_major_formatter(EngFormatter(sep=""))
    # beside the panel, never over it: an inset legend hid the last session's curve
    dip.legend(fontsize=7, ncols=1, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig
