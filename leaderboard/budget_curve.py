"""The budget curve: one protocol run at several FLOP budgets, each method's gaps against the budget.

Protocols named ``BASE@<k>x`` are BASE with its training budget (TFLOPs per session) scaled by k; their
boards form one *budget family*. Each board is summarized as any other (BASE's joint reference, which
the budget does not change, its own A_best, its own ranking); this module only lines the boards up by
budget, so the family view can never disagree with the per-budget boards. The x of a point is the budget
the runs recorded (``budget.train_tflops_budget``, TFLOPs per session), not k, so a family whose base
budget changed shows where its runs really were.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from ..harness.results.catalog import METRICS, MetricInfo
from ..harness.spec.protocol import BUDGET_SCALE
from .aggregate import Board, MethodRow, Stat, cell_text, header_text, render_rows, seeds_text
from .plots import STYLE, plain

# NAME@Kx: NAME's FLOP budget scaled by K (the protocol loader's naming; K a positive decimal)
CURVE_KEYS: tuple[str, ...] = ("S_delta", "P_delta", "CK_delta", "alpha")
CURVE_COLUMNS: tuple[MetricInfo, ...] = tuple(METRICS[k] for k in CURVE_KEYS)


@dataclass(eq=False)
class BudgetPoint:
    """One budget of a family: its board and the training budget its runs recorded."""

    factor: float
    tflops: float  # TFLOPs per session (budget.train_tflops_budget of the board's ranked runs)
    board: Board

    def row(self, method: str) -> MethodRow | None:
        return next((r for r in self.board.rows if r.method == method), None)


@dataclass(eq=False)
class BudgetFamily:
    """The boards of ``BASE@<k>x`` protocols of one base (and one precision), ordered by budget."""

    base: str
    precision: str
    points: list[BudgetPoint] = field(default_factory=list)
    apart: list[tuple[str, str]] = field(default_factory=list)  # (protocol, why it is not on the curve)

    @property
    def slug(self) -> str:
        safe = re.sub(r"[^a-z0-9_]", "_", self.base.lower())[:48] or "family"
        return f"{safe}-{self.precision}"

    @property
    def methods(self) -> list[str]:
        """Every row label of the family, in the order of the largest budget's board (then the others')."""
        out: list[str] = []
        for point in reversed(self.points):
            out += [r.method for r in point.board.rows if r.method not in out]
        return out

    def style(self, method: str) -> tuple[str, str]:
        row = next(r for p in self.points if (r := p.row(method)) is not None)
        return row.color, row.dash


def _budget_of(board: Board) -> tuple[float | None, str | None]:
    """The one training budget (TFLOPs per session) of a board's ranked runs, or why there is none."""
    budgets = {e.result.budget.train_tflops_budget for e in board.ranked_runs}
    if not budgets:
        return None, "no ranked runs"
    if None in budgets:
        return None, "its runs record no FLOP budget (budget.train_tflops_budget): they were update-budgeted"
    if len(budgets) > 1:
        given = sorted(b for b in budgets if b is not None)
        return None, f"its ranked runs record different budgets ({', '.join(f'{b:g}' for b in given)})"
    return budgets.pop(), None


def budget_families(boards: Sequence[Board]) -> list[BudgetFamily]:
    """The budget families among ``boards`` (every ``BASE@<k>x`` board, grouped by BASE and precision)."""
    families: dict[tuple[str, str], BudgetFamily] = {}
    for board in boards:
        match = BUDGET_SCALE.match(board.name)
        if match is None:
            continue
        key = (match["base"], board.precision)
        family = families.setdefault(key, BudgetFamily(*key))
        tflops, why = _budget_of(board)
        if tflops is None:
            family.apart.append((board.name, why or ""))
        else:
            family.points.append(BudgetPoint(float(match["factor"]), tflops, board))
    for family in families.values():
        family.points.sort(key=lambda p: (p.tflops, p.factor))
    return [families[k] for k in sorted(families)]


# ------------------------------------------------------------------------------------ the table

TableFormat = Literal["markdown", "text"]


def family_rows(family: BudgetFamily) -> list[tuple[BudgetPoint, MethodRow]]:
    """(budget, row) pairs: every method at every budget it was ranked at, budgets in increasing order."""
    return [(p, row) for p in family.points for m in family.methods if (row := p.row(m)) is not None]


def format_family_table(family: BudgetFamily, fmt: TableFormat = "markdown") -> str:
    """Budget × method: S_Δ, P_Δ, CK_Δ and α as mean ± std over seeds, with the seed count."""
    headers = ["k", "TFLOPs / session", "method", "seeds"] + [header_text(c) for c in CURVE_COLUMNS]
    body = [[f"{p.factor:g}x", f"{p.tflops:.4g}", row.method, seeds_text(row, p.board.most_seeds)]
            + [cell_text(row.stats[c.key], c, len(row.runs), ci=False) for c in CURVE_COLUMNS]
            for p, row in family_rows(family)]
    title = f"{family.base}@<k>x budget curve ({family.precision})"
    out = [f"## {title}" if fmt == "markdown" else title, ""]
    out += render_rows(headers, body, fmt) if body else ["(no ranked runs at any budget)"]
    if family.apart:
        out += ["", "Not on the curve:"] + [f"- {name}: {why}" for name, why in family.apart]
    out += ["", "mean ± std over seeds; each budget is its own protocol, scored against the family's joint reference "
                "(one per seed, shared by every budget) and its own A_best (P_Δ at a budget is relative to the "
                "reference set's best at that budget)."]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------- the figure


def _stat_points(family: BudgetFamily, method: str, key: str) -> tuple[list[float], list[float], list[float]]:
    xs, ys, errs = [], [], []
    for p in family.points:
        row = p.row(method)
        stat: Stat | None = row.stats[key] if row is not None else None
        if stat is None or stat.mean is None:
            continue
        xs.append(p.tflops)
        ys.append(stat.mean)
        errs.append(stat.std or 0.0)
    return xs, ys, errs


def budget_figure(family: BudgetFamily) -> Figure:
    """S_Δ, P_Δ, CK_Δ and α against the training budget (TFLOPs per session, log x): one line per method,
    mean over seeds with ± std error bars, a tick at every budget of the family."""
    fig = Figure(figsize=(11.0, 3.6), layout="constrained")
    axes = fig.subplots(1, len(CURVE_COLUMNS))
    budgets = [p.tflops for p in family.points]
    for ax, column in zip(axes, CURVE_COLUMNS):
        for method in family.methods:
            xs, ys, errs = _stat_points(family, method, column.key)
            if not xs:
                continue
            color, dash = family.style(method)
            ax.errorbar(xs, ys, yerr=errs, color=color, linestyle=dash, linewidth=1.6, marker="o", markersize=4,
                        capsize=3, label=plain(method))
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(budgets))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{p.tflops:.3g}\n{p.factor:g}x" for p in family.points])
        if len(budgets) == 1:  # one budget: a log axis needs some room around it
            ax.set_xlim(budgets[0] / 2, budgets[0] * 2)
        unit = f" ({column.unit})" if column.unit else ""
        ax.set_title(f"{column.symbol}{unit} {column.arrow}", fontsize=10)
        ax.set_xlabel("training TFLOPs per session (log), k")
    fig.suptitle(plain(f"{family.base}: gaps against the training budget ({family.precision})"), x=0.01, ha="left",
                 fontsize=10, fontweight="bold")
    handles, labels = axes[0].get_legend_handles_labels()
    if labels:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)))
    return fig


def figure_bytes(family: BudgetFamily, fmt: str) -> bytes:
    """The family's figure as ``fmt`` (png, svg or pdf), without a date in it (same results, same file)."""
    with matplotlib.rc_context(STYLE):
        fig = budget_figure(family)
        buf = io.BytesIO()
        metadata = {"Date": None} if fmt in ("svg", "pdf") else {}
        fig.savefig(buf, format=fmt, dpi=150, metadata=metadata)
    return buf.getvalue()
