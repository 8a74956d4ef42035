"""The glossary page's terms: every metric of ``harness.results.catalog``, with its HTML marked safe here."""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup

from ..harness.results.catalog import CATALOG, MetricInfo


@dataclass(frozen=True)
class Term:
    key: str
    symbol: Markup
    name: str
    direction: str  # "↓", "↑" or "" (a reference, or a number shown but never ranked)
    equation: Markup
    meaning: Markup  # constant HTML too: the catalog writes A<sub>best</sub> and the like in it
    ranked: bool = True


def _m(html: str) -> Markup:
    return Markup(html)  # noqa: S704 - constant HTML written in harness/results/catalog.py or here, never user data


def term(info: MetricInfo) -> Term:
    return Term(info.key, _m(info.html_symbol), info.name, info.arrow if info.ranked else "", _m(info.equation),
                _m(info.meaning), info.ranked)


OMEGA_NOTE = _m(
    "Ω is averaged over a session's eval points i = 1..L (the point at update 0 is plotted but not "
    "averaged), each weighted by the updates since the previous point, w<sub>i</sub> = (u<sub>i</sub> − "
    "u<sub>i−1</sub>) / U<sub>j</sub>; with evenly spaced points this is the paper's plain mean 1/L."
)

BEFORE_NOTE = _m(
    "R<sub>i,k</sub> (ACC, Ā, F, BWT, FWT) is read at two kinds of points: R<sub>i,k</sub> for i ≥ 2 at the "
    "last eval point of session i, and “before session j” (R<sub>1,1</sub>, R<sub>j−1,j</sub>) at the session's "
    "<em>before</em> point: the model at the end of session j−1 (the deployed model for j = 2), evaluated before "
    "the head grows and before the method's begin_session. The curve's update-0 point comes after begin_session "
    "(a data-driven head init has already acted there); S<sub>Δ</sub>, P<sub>Δ</sub>, CK<sub>Δ</sub> and the "
    "plots read it. Results stored before the before point was recorded show “–” for F, BWT and FWT."
)

INTERVAL_NOTE = _m(
    "Intervals and tests over seeds. A mean's interval is Student-t: mean ± t<sub>n−1, 0.975</sub> · s/√n. "
    "A row's difference with the baseline is taken seed by seed on the seeds both have (same seed: same class "
    "order and data), with a paired-t interval and the two-sided p of the paired t test; the p-values of one "
    "column's comparisons on a board (every row against the baseline) are Holm-adjusted, and <em>n.s.</em> means "
    "the adjusted p is 0.05 or more (or one shared seed: no test). “power 0.47 at 3 seeds”, where below 0.80: "
    "the chance that test, at level 0.05/m (m the rows compared), finds a true difference of the size seen at "
    "the spread seen significant with the seeds compared; with 3 seeds a rough figure. A significant p beside a "
    "low power is no contradiction: the difference was found, and another set of seeds might miss it. "
    "FWT is left out on class-incremental protocols whose head grows: the model has no unit for a class before "
    "its session, so every method and the reference score 0 there by construction. Assumptions: per-seed "
    "values independent and roughly normal. A percentile bootstrap is never used below 10 seeds: on 3 it covers "
    "about 76 %, not 95 %."
)

TERMS: tuple[Term, ...] = tuple(term(m) for m in CATALOG)
