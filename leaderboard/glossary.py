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

TERMS: tuple[Term, ...] = tuple(term(m) for m in CATALOG)
