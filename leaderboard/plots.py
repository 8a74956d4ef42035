"""Static SVG line plots, written by hand: no plotting library, no JavaScript needed to read them.

Every piece of text that came from a result (method names) is XML-escaped here, since these files
are written outside the (autoescaping) templates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from ..harness.curves import SessionCurve

from .aggregate import JOINT_COLOR, Board, Entry, MethodRow, accuracy_scale

Point = tuple[float, float]


@dataclass
class Series:
    label: str
    color: str
    points: list[Point]
    band: list[tuple[float, float, float]] = field(default_factory=list)  # (x, low, high)
    dashed: bool = False


@dataclass
class Markers:
    label: str
    color: str
    points: list[Point]


# ------------------------------------------------------------------------------------- geometry


def nice_step(span: float, target: int) -> float:
    """A 1/2/5 × 10^k step giving about ``target`` ticks over ``span``."""
    if span <= 0:
        return 1.0
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _ticks(lo: float, hi: float, target: int) -> list[float]:
    step = nice_step(hi - lo, target)
    start = math.ceil(lo / step - 1e-9) * step
    out, v = [], start
    while v <= hi + 1e-9 * max(1.0, abs(hi)):
        out.append(round(v, 10))
        v += step
    return out


def _fmt_tick(v: float) -> str:
    if abs(v) >= 1000 and float(v).is_integer():
        return f"{v / 1000:g}k" if v % 1000 == 0 else f"{int(v):,}"
    return f"{v:g}"


def _text_width(text: str, size: float = 12) -> float:
    return len(text) * size * 0.6


def line_plot(
    series: Sequence[Series],
    markers: Sequence[Markers] = (),
    *,
    title: str,
    x_label: str,
    y_label: str,
    boundaries: Sequence[tuple[float, str]] = (),
    width: int = 760,
    height: int = 300,
    y_range: tuple[float, float] | None = None,
) -> str:
    """An SVG document: lines (with optional ± bands), star markers, dotted session boundaries, legend."""
    left, right, top, bottom = 56, 18, 44, 42
    # legend rows under the plot
    entries = [(s.label, s.color, "line", s.dashed) for s in series] + [(m.label, m.color, "star", False) for m in markers]
    rows: list[list[tuple[str, str, str, bool, float]]] = [[]]
    x_cursor = left
    for label, color, kind, dashed in entries:
        w = 30 + _text_width(label) + 18
        if x_cursor + w > width - right and rows[-1]:
            rows.append([])
            x_cursor = left
        rows[-1].append((label, color, kind, dashed, x_cursor))
        x_cursor += w
    legend_h = 20 * len(rows) if entries else 0
    total_h = height + legend_h
    pw, ph = width - left - right, height - top - bottom

    xs = [p[0] for s in series for p in s.points] + [p[0] for m in markers for p in m.points]
    xs += [b[0] for b in boundaries]
    ys = [p[1] for s in series for p in s.points] + [p[1] for m in markers for p in m.points]
    ys = [y for y in ys if math.isfinite(y)]
    if ys:  # the ± bands widen the range, but never past 0..100 when the lines stay inside it
        band = [v for s in series for _, lo, hi in s.band for v in (lo, hi)]
        ys += [min(100.0, v) if max(ys) <= 100 else v for v in band if v >= 0 or min(ys) < 0]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x1 <= x0:
        x1 = x0 + 1
    if y_range:
        y0, y1 = y_range
    elif ys:
        lo, hi = min(ys), max(ys)
        pad = max((hi - lo) * 0.06, 0.5)
        y0, y1 = max(0.0, lo - pad), min(100.0, hi + pad) if hi <= 100 else hi + pad
        step = nice_step(y1 - y0, 5)
        y0, y1 = math.floor(y0 / step) * step, math.ceil(y1 / step) * step
    else:
        y0, y1 = 0.0, 100.0
    if y1 <= y0:
        y1 = y0 + 1

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {total_h}" width="{width}" height="{total_h}" '
        f'role="img" aria-label="{escape(title)}" font-family="system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{total_h}" fill="#ffffff"/>',
        f'<text x="{left}" y="20" font-size="14" font-weight="600" fill="#1a1a1a">{escape(title)}</text>',
    ]
    # grid + axes
    for t in _ticks(y0, y1, 5):
        y = sy(t)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{_fmt_tick(t)}</text>')
    for t in _ticks(x0, x1, 8):
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 4}" stroke="#888"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 17}" text-anchor="middle" fill="#555">{_fmt_tick(t)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{top + ph + 34}" text-anchor="middle" fill="#333">{escape(x_label)}</text>')
    out.append(f'<text transform="translate(15 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle" fill="#333">{escape(y_label)}</text>')
    # session boundaries
    for bx, label in boundaries:
        x = sx(bx)
        if left < x < left + pw:
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#999" stroke-dasharray="2 3"/>')
    for i, (bx, label) in enumerate(boundaries):
        nxt = boundaries[i + 1][0] if i + 1 < len(boundaries) else x1
        if label:
            out.append(f'<text x="{(sx(bx) + sx(nxt)) / 2:.1f}" y="{top - 5}" text-anchor="middle" fill="#777" font-size="11">{escape(label)}</text>')
    # clip lines to the plot area
    out.append(f'<defs><clipPath id="plot"><rect x="{left}" y="{top}" width="{pw}" height="{ph}"/></clipPath></defs>')
    out.append('<g clip-path="url(#plot)">')
    for s in series:
        if len(s.band) >= 2:
            upper = " ".join(f"{sx(x):.1f},{sy(hi):.1f}" for x, _, hi in s.band)
            lower = " ".join(f"{sx(x):.1f},{sy(lo):.1f}" for x, lo, _ in reversed(s.band))
            out.append(f'<polygon points="{upper} {lower}" fill="{s.color}" fill-opacity="0.14" stroke="none"/>')
    for s in series:
        for segment in _segments(s.points):
            pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in segment)
            dash = ' stroke-dasharray="6 4"' if s.dashed else ""
            out.append(f'<polyline points="{pts}" fill="none" stroke="{s.color}" stroke-width="1.8" '
                       f'stroke-linejoin="round"{dash}><title>{escape(s.label)}</title></polyline>')
    out.append("</g>")
    for m in markers:
        for x, y in m.points:
            out.append(f'<path d="{_star(sx(x), sy(y), 7)}" fill="{m.color}" stroke="#fff" stroke-width="0.8">'
                       f"<title>{escape(m.label)}: {y:.2f}</title></path>")
    # legend
    for r, row in enumerate(rows):
        y = height + 6 + r * 20
        for label, color, kind, dashed, x in row:
            if kind == "line":
                dash = ' stroke-dasharray="6 4"' if dashed else ""
                out.append(f'<line x1="{x}" y1="{y}" x2="{x + 24}" y2="{y}" stroke="{color}" stroke-width="2.5"{dash}/>')
            else:
                out.append(f'<path d="{_star(x + 12, y, 7)}" fill="{color}"/>')
            out.append(f'<text x="{x + 30}" y="{y + 4}" fill="#222">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _segments(points: Sequence[Point]) -> list[list[Point]]:
    """Split a line where the x values restart (a new session) or a value is missing."""
    segs: list[list[Point]] = [[]]
    for p in points:
        if segs[-1] and p[0] < segs[-1][-1][0]:
            segs.append([])
        if math.isfinite(p[1]):
            segs[-1].append(p)
    return [s for s in segs if len(s) >= 1]


def _star(cx: float, cy: float, r: float) -> str:
    pts = []
    for k in range(10):
        rad = r if k % 2 == 0 else r * 0.45
        a = -math.pi / 2 + k * math.pi / 5
        pts.append(f"{cx + rad * math.cos(a):.1f},{cy + rad * math.sin(a):.1f}")
    return "M" + " L".join(pts) + " Z"


# --------------------------------------------------------------------------------- curve data


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + t * (ys[i] - ys[i - 1])
    return ys[-1]


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, s


def _global(curves: Sequence[SessionCurve], key: str, scale: float) -> tuple[list[float], list[float]]:
    """One run's accuracy over all sessions: x = updates since the first learning session began."""
    xs: list[float] = []
    ys: list[float] = []
    offset = 0
    for c in sorted(curves, key=lambda c: c.session):
        xs += [offset + u for u in c.updates]
        ys += [v * scale for v in getattr(c, key)]
        offset += c.total_updates
    return xs, ys


def _average_over_sessions(curves: Sequence[SessionCurve], key: str, scale: float) -> tuple[list[float], list[float]]:
    """The mean curve over sessions, on the first session's eval points (paper Fig. 1b)."""
    ordered = sorted(curves, key=lambda c: c.session)
    grid = [float(u) for u in ordered[0].updates]
    ys = [sum(_interp(c.updates, getattr(c, key), x) for c in ordered) / len(ordered) * scale for x in grid]
    return grid, ys


def _seed_mean(runs: Sequence[tuple[list[float], list[float]]]) -> tuple[list[Point], list[tuple[float, float, float]]]:
    """Mean ± std over seeds on the first run's x grid (seeds share eval points under one protocol)."""
    xs = runs[0][0]
    points, band = [], []
    for i, x in enumerate(xs):
        vals = [ys[i] if len(rx) == len(xs) and rx[i] == x else _interp(rx, ys, x) for rx, ys in runs]
        m, s = _mean_std(vals)
        points.append((x, m))
        band.append((x, m - s, m + s))
    return points, (band if len(runs) > 1 else [])


def _row_series(row: MethodRow, key: str, average: bool) -> Series:
    curves = [(e.result.curves, accuracy_scale(e.result)) for e in row.runs]
    per_run = [(_average_over_sessions if average else _global)(c, key, s) for c, s in curves]
    points, band = _seed_mean(per_run)
    n = len(row.runs)
    return Series(label=f"{row.method} (n={n})" if n > 1 else row.method, color=row.color, points=points, band=band)


def _joint_markers(board: Board, key: str, average: bool) -> Markers | None:
    """The joint model's accuracy at the end of each session, mean over the seeds in use."""
    joints = list(board.joints.values())
    template = board.rows[0].runs[0].result.curves if board.rows else None
    if not joints or not template:
        return None
    ends: dict[int, float] = {}
    offset = 0
    for c in sorted(template, key=lambda c: c.session):
        offset += c.total_updates
        ends[c.session] = offset
    per_session: dict[int, list[float]] = {}
    for j in joints:
        scale = accuracy_scale(j.result)
        for ref in j.result.reference:
            per_session.setdefault(ref.session, []).append(getattr(ref, key) * scale)
    means = {s: sum(v) / len(v) for s, v in per_session.items() if s in ends}
    if not means:
        return None
    if average:
        last = max(c.updates[-1] for c in template)
        return Markers("joint (upper bound)", JOINT_COLOR, [(float(last), sum(means.values()) / len(means))])
    return Markers("joint (upper bound)", JOINT_COLOR, [(ends[s], v) for s, v in sorted(means.items())])


def _boundaries(board: Board) -> list[tuple[float, str]]:
    if not board.rows:
        return []
    out, offset = [], 0
    for c in sorted(board.rows[0].runs[0].result.curves, key=lambda c: c.session):
        out.append((float(offset), f"S{c.session}"))
        offset += c.total_updates
    return out


PLOTS: tuple[tuple[str, str, str, bool, int], ...] = (
    # (file stem, curve key, title, averaged over sessions, width): the first is shown full width
    ("old", "old", "Old-class accuracy over all sessions (the stability gap)", False, 1160),
    ("new", "new", "New-class accuracy over all sessions", False, 460),
    ("all", "all", "All-class accuracy over all sessions", False, 460),
    ("old-avg", "old", "Old-class accuracy, average over sessions", True, 460),
)


def board_plots(board: Board) -> dict[str, tuple[str, str]]:
    """``stem -> (title, svg)`` for one protocol; empty when nothing is ranked."""
    if not board.rows:
        return {}
    out = {}
    for stem, key, title, average, width in PLOTS:
        series = [_row_series(row, key, average) for row in board.rows]
        marker = _joint_markers(board, key, average)
        svg = line_plot(
            series, [marker] if marker else [], title=title,
            x_label="updates within a session" if average else "updates (all learning sessions)",
            y_label=f"{key}-class accuracy (%)",
            boundaries=[] if average else _boundaries(board),
            width=width, height=340 if width > 1000 else 300,
        )
        out[stem] = (title, svg)
    return out


RUN_COLORS = {"old": "#1f77b4", "new": "#d62728", "all": "#2ca02c"}


def run_plot(entry: Entry) -> str | None:
    """Old / new / all-class accuracy of one run, with its joint reference's old-class accuracy."""
    r = entry.result
    if not r.curves:
        return None
    scale = accuracy_scale(r)
    series = []
    for key in ("old", "new", "all"):
        xs, ys = _global(r.curves, key, scale)
        series.append(Series(label=f"{key} classes", color=RUN_COLORS[key], points=list(zip(xs, ys))))
    markers = []
    if entry.joint is not None:
        ends, offset = {}, 0
        for c in sorted(r.curves, key=lambda c: c.session):
            offset += c.total_updates
            ends[c.session] = offset
        js = accuracy_scale(entry.joint.result)
        pts = [(ends[ref.session], ref.old * js) for ref in entry.joint.result.reference if ref.session in ends]
        if pts:
            markers.append(Markers("joint, old classes", JOINT_COLOR, pts))
    bounds, offset = [], 0
    for c in sorted(r.curves, key=lambda c: c.session):
        bounds.append((float(offset), f"S{c.session}"))
        offset += c.total_updates
    return line_plot(series, markers, title=f"{r.method.spec}, seed {r.seed}", x_label="updates (all learning sessions)",
                     y_label="accuracy (%)", boundaries=bounds, height=280)
