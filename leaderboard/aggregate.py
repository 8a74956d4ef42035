"""Summarize stored results: validate each run, recompute the metrics that depend on other runs, and
aggregate over seeds (mean ± std per protocol and method).

This is the "summarize" step of run -> summarize -> render; the static site (``leaderboard.site``) and the plain-text
table (``bench leaderboard table``) both render what ``summarize`` returns, so they always agree.

Reference-dependent metrics are recomputed here, never read from the stored ``RunResult.metrics``:
A_joint comes from the newest complete joint run of the same protocol hash and seed, and A_best from
every complete CL run of that protocol hash (``harness.results.metrics.best_new_accuracy``), so adding a run
updates P_Δ of every other run of the protocol.

A run is ranked only if it is complete, carries the protocol's current spec hash and has a joint
reference for its seed. Everything else is listed apart with the reason. A row with fewer seeds than the
best-covered row is shown with its seed count and marked (``MethodRow.partial``), never dropped: its
paired comparison with vanilla uses the seeds both have.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd

from ..harness.errors import BenchError
from ..harness.identity import RunIdentity
from ..harness.results.catalog import (
    METRICS,
    OPTIONAL_KEYS,
    TABLE_KEYS,
    TIME_TO_RESULT_KEYS,
    Direction,
    MetricInfo,
    displayed,
    format_std,
    format_value,
)
from ..harness.results.cl_metrics import forward_transfer_possible
from ..harness.results.comparability import select_runs
from ..harness.results.metrics import Metrics, best_new_accuracy, compute_metrics, plasticity_gap
from ..harness.results.schema import RunResult, format_setting, result_numerics, run_identity
from ..harness.results.tidy import runs_frame, seed_stats
from ..harness.results.uncertainty import POWER, Interval, Paired, against_baseline, t_interval
from ..harness.spec.paper import paper_protocol

if TYPE_CHECKING:
    from ..harness.spec.protocol import Protocol

# The table's columns: the paper's Table 1 plus the budget figures, each described once in the catalog.
COLUMNS: tuple[MetricInfo, ...] = tuple(METRICS[k] for k in TABLE_KEYS)
# Columns shown on request (the standard CL metrics); aggregated, marked and exported like the others.
OPTIONAL_COLUMNS: tuple[MetricInfo, ...] = tuple(METRICS[k] for k in OPTIONAL_KEYS if k not in TABLE_KEYS)
ALL_COLUMNS: tuple[MetricInfo, ...] = COLUMNS + OPTIONAL_COLUMNS
COLUMN_BY_KEY = {c.key: c for c in ALL_COLUMNS}
DEFAULT_ORDER = "CK_delta"  # the rows' order before a visitor sorts (see summarize_protocol)
BASELINE = "vanilla"  # every row is compared with this row on the seeds both have


# ------------------------------------------------------------------------------------ run entries


@dataclass(frozen=True)
class MlflowLink:
    run_id: str
    experiment_id: str | None
    tracking_uri: str


@dataclass(eq=False)
class Entry:
    """One stored run as the leaderboard sees it."""

    result: RunResult
    source: str  # where its JSON came from (a file path or an MLflow artifact)
    mlflow: MlflowLink | None = None
    slug: str = ""  # file-name-safe id for the site, unique within a build
    metrics: Metrics | None = None  # recomputed at build time; None when it cannot be
    joint: Entry | None = None  # the joint run that gave its A_joint
    p_delta_paper: float | None = None  # P_Δ against the paper's A_best: best over the counted runs of the seed
    reason: str | None = None  # why it is not ranked (None: ranked, or a reference in use)
    note: str | None = None  # anything else worth saying about where it came from

    @property
    def run_id(self) -> str:
        return self.result.run_id

    @cached_property
    def method(self) -> str:
        """The row this run belongs to: the method string, plus the settings it changed from the
        defaults (``lwf+sgm [lr=0.0002]``), so a ``--set`` variant never averages with the defaults."""
        return self.result.label

    @property
    def is_reference(self) -> bool:
        return self.result.is_reference

    @property
    def family(self) -> str:
        return family(self.result.method.modifiers)

    @property
    def label(self) -> str:
        return f"{self.method} · seed {self.result.seed} · {self.run_id}"


def family(modifiers: Sequence[str]) -> str:
    """The method family the index filters by: ``sgm`` if SGM is among the modifiers, else ``base``."""
    return "sgm" if "sgm" in modifiers else "base"


_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def assign_slugs(entries: Iterable[Entry]) -> None:
    """A unique, file-name-safe slug per entry (a foreign run id never becomes a path)."""
    used: set[str] = set()
    for i, entry in enumerate(entries):
        base = entry.run_id if _SAFE_ID.match(entry.run_id) and ".." not in entry.run_id else f"run-{i:04d}"
        slug, n = base, 1
        while slug in used:
            n += 1
            slug = f"{base}-{n}"
        used.add(slug)
        entry.slug = slug


# ----------------------------------------------------------------------------------- run values


@dataclass(frozen=True)
class Stat:
    """Mean ± sample standard deviation over seeds, as ``seed_stats`` computes it; ``std`` is None
    for a single value, ``mean`` None when no run had the value; ``ci`` the 95 % Student-t interval of
    the mean (``harness.results.uncertainty``), None below two values."""

    mean: float | None
    std: float | None
    n: int
    ci: Interval | None = None

    @classmethod
    def from_stats(cls, stats: pd.Series, key: str) -> Stat:
        """One key of one group of a ``seed_stats`` frame (NaN -> None)."""
        n = int(stats[(key, "count")])
        mean, std = float(stats[(key, "mean")]), float(stats[(key, "std")])
        return cls(mean if n else None, std if n > 1 and math.isfinite(std) else None, n)

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat:
        """The stat of one list of values (None or non-finite: missing), by the same pandas rule, with
        its t interval."""
        xs = [math.nan if v is None else float(v) for v in values]
        if not xs:
            return cls(None, None, 0)
        stat = cls.from_stats(seed_stats(pd.DataFrame({"v": xs, "method": ""}), ["v"]).iloc[0], "v")
        return cls(stat.mean, stat.std, stat.n, t_interval(xs))


def rank_value(stat: Stat, column: MetricInfo) -> float | None:
    """The value a column ranks by: the mean as displayed (as a reader compares)."""
    return None if stat.mean is None else displayed(stat.mean, column)


def marks(values: Sequence[float | None], direction: Direction) -> list[str]:
    """The paper's marking: ``best`` (bold) and ``second`` (underline) per column; ties share a mark.

    Nothing is marked when fewer than two distinct values exist (all tied: nothing to see).
    """
    distinct = sorted({v for v in values if v is not None}, reverse=direction == "max")
    if len(distinct) < 2:
        return [""] * len(values)
    first, second = distinct[0], distinct[1]
    return ["best" if v == first else "second" if v == second else "" for v in values]


def column_marks(values: Sequence[float | None], column: MetricInfo) -> list[str]:
    """``marks`` for a column that is ranked; none for one that is only shown (wall time)."""
    return marks(values, column.direction) if column.ranked else [""] * len(values)


@dataclass(frozen=True)
class Reached:
    """Of a row's learning sessions (over its runs), how many reached a time-to-result level: its mean is
    over those only, so the count is always shown beside it."""

    reached: int
    sessions: int

    @property
    def text(self) -> str:
        return f"{self.reached}/{self.sessions} sessions"


def reached_of(frame: pd.DataFrame) -> dict[str, Reached]:
    """Per time-to-result key, the sessions reached over the runs of ``frame`` (``tidy.reached_counts``), where
    any run recorded it."""
    out = {}
    for key in TIME_TO_RESULT_KEYS:
        counted = frame[f"{key}_reached"].notna()
        if counted.any():
            out[key] = Reached(int(frame.loc[counted, f"{key}_reached"].sum()),
                               int(frame.loc[counted, "sessions"].sum()))
    return out


# ---------------------------------------------------------------------------------- aggregation


@dataclass(eq=False)
class MethodRow:
    """One method of one protocol: its runs (one per seed) and the mean ± std of every column."""

    method: str
    family: str
    runs: list[Entry]
    stats: dict[str, Stat]
    values: dict[str, dict[int, float | None]] = field(default_factory=dict)  # key -> seed -> the run's value
    color: str = ""
    dash: str = "solid"  # matplotlib line style, for rows that share a colour
    marks: dict[str, str] = field(default_factory=dict)
    partial: bool = False  # fewer seeds than the best-covered row of the protocol
    paired: dict[str, Paired | None] = field(default_factory=dict)  # key -> this row − BASELINE, shared seeds
    reached: dict[str, Reached] = field(default_factory=dict)  # time-to-result key -> sessions reached
    # the board's protocol stands for the paper's own setup (``harness.spec.paper.paper_protocol``): only there
    # do vanilla's two readings of the paper (its text's full fine-tuning, its code's LoRA blocks) exist to name
    paper_readings: bool = False

    @property
    def seeds(self) -> list[int]:
        return sorted(e.result.seed for e in self.runs)

    @property
    def effort(self) -> str:
        """How the row's settings were chosen: ``defaults``, ``tuned (N trials, objective)``, ``set by hand``."""
        return self.runs[0].result.effort if self.runs else "defaults"

    @property
    def notes(self) -> list[str]:
        """What the runs themselves recorded about the row's meaning (GDumb on an unlimited memory is vanilla)."""
        return sorted({n for e in self.runs for n in e.result.options.get("notes") or []})

    @property
    def distribution(self) -> str:
        m = self.runs[0].result.method
        return f"{m.distribution} {m.version}"

    @property
    def params_reading(self) -> str | None:
        """Which of vanilla's two readings the row's #P counts (``vanilla_reading``), when it has one: on a
        protocol that stands for the paper only; an embedded protocol's vanilla is simply its own."""
        if not self.paper_readings:
            return None
        readings = {vanilla_reading(e.result) for e in self.runs}
        return readings.pop() if len(readings) == 1 else None

    @classmethod
    def of(cls, entries: list[Entry]) -> MethodRow:
        """The row of one method's runs: mean ± std of every column over them (``seed_stats``)."""
        entries = sorted(entries, key=lambda e: e.result.seed)
        frame = entry_frame(entries)
        stats = seed_stats(frame, [c.key for c in ALL_COLUMNS]).iloc[0]
        values = {c.key: {int(seed): None if math.isnan(v) else float(v)
                          for seed, v in zip(frame["seed"], frame[c.key])}
                  for c in ALL_COLUMNS}
        first = entries[0]
        return cls(method=first.method, family=first.family, runs=entries, values=values,
                   stats={c.key: _with_ci(Stat.from_stats(stats, c.key), values[c.key].values())
                          for c in ALL_COLUMNS}, reached=reached_of(frame))


def _with_ci(stat: Stat, values: Iterable[float | None]) -> Stat:
    return Stat(stat.mean, stat.std, stat.n, t_interval([v for v in values if v is not None]))


def vanilla_reading(result: RunResult) -> str | None:
    """``code: LoRA blocks`` or ``text: full fine-tuning`` for a run of vanilla's body (its ``pointwise``
    setting), None where the setting is absent or a LoRA modifier owns the pointwise layers."""
    pointwise = result.config.get("pointwise")
    sgm = result.config.get("sgm") or {}
    if pointwise is None or "lora" in result.method.modifiers or "lora" in sgm.get("use", []):
        return None
    return "code: LoRA blocks" if pointwise == "lora" else "text: full fine-tuning"


def entry_frame(entries: Sequence[Entry]) -> pd.DataFrame:
    """The tidy per-run frame (``harness.results.tidy.runs_frame``) of these entries, labelled by their rows."""
    return runs_frame([e.result for e in entries], metrics={e.run_id: e.metrics for e in entries},
                      labels={e.run_id: e.method for e in entries},
                      extra={e.run_id: {"P_delta_paper": e.p_delta_paper} for e in entries})


@dataclass(eq=False)
class Board:
    """Everything the leaderboard shows for one protocol."""

    name: str
    current_hash: str
    hash_origin: str
    description: str | None
    paper_ref: str | None
    version: int | None
    rows: list[MethodRow]  # ranked methods, those with fewer seeds included (``MethodRow.partial``)
    reference_row: MethodRow | None  # the joint upper bound (never ranked)
    joints: dict[int, Entry]  # seed -> joint run used as A_joint
    best_new: dict[int, dict[int, float]]  # seed -> session -> A_best(E_j) of the protocol's reference set
    best_new_from: dict[tuple[int, int], Entry]  # (seed, session) -> the reference run that reached it
    best_new_methods: tuple[str, ...]  # the protocol's A_best reference set
    unranked: list[Entry]
    entries: list[Entry]
    precision: str = "fp32"  # what every run on the board computed in (two precisions: two boards)
    # the machine arithmetic of every run on the board (``harness.numerics``): two machines whose code paths
    # differ give two boards, as two precisions do
    numerics: str = "unrecorded"
    # FWT can differ from 0 here (``harness.results.cl_metrics.forward_transfer_possible``); True where the
    # protocol's spec is unknown: nothing then says it cannot
    forward_transfer: bool = True

    @property
    def ranked_runs(self) -> list[Entry]:
        return [e for row in self.rows for e in row.runs]

    @property
    def seeds(self) -> list[int]:
        return sorted({s for row in self.rows for s in row.seeds})

    @property
    def most_seeds(self) -> int:
        return max((len(r.runs) for r in self.rows), default=0)

    def columns(self, chosen: Sequence[MetricInfo]) -> list[MetricInfo]:
        """The ``chosen`` columns this board shows: FWT only where it can differ from 0 (on a class-incremental
        protocol whose head grows, every method's FWT and the reference's are 0 by construction)."""
        return [c for c in chosen if c.key != "fwt" or self.forward_transfer]


# Okabe & Ito's colour-blind-safe palette (yellow left out: unreadable on white; black is the joint
# model's), then two of Paul Tol's muted colours (wine, olive) that no Okabe-Ito colour resembles: a board
# of up to 8 methods gets 8 distinct colours.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#882255", "#999933")
DASHES = ("solid", "dashed", "dotted", "dashdot")
JOINT_COLOR = "#000000"


def method_style(method: str) -> tuple[str, str]:
    """A method's preferred colour and its line style, from its SHA-256: the same on every page, every build
    and whatever other methods exist (a position in a list would recolour every row when one is added)."""
    digest = hashlib.sha256(method.encode()).digest()
    return PALETTE[digest[0] % len(PALETTE)], DASHES[digest[1] % len(DASHES)]


def assign_styles(rows: Sequence[MethodRow]) -> None:
    """Colour and line style per row: each method takes its preferred colour (``method_style``) unless a
    method earlier in hash order on the same board holds it, then the next free colour of the palette. So
    no two methods of a board share a colour while the board has at most ``len(PALETTE)`` methods, and the
    same methods get the same colours on every build. Past the palette, a method keeps its preferred
    colour and is told apart by its line style (from other bits of the hash)."""
    taken: set[str] = set()
    for row in sorted(rows, key=lambda r: hashlib.sha256(r.method.encode()).digest()):
        color, row.dash = method_style(row.method)
        if len(taken) < len(PALETTE):
            start = PALETTE.index(color)
            color = next(c for c in PALETTE[start:] + PALETTE[:start] if c not in taken)
        taken.add(color)
        row.color = color


def _current_hash(name: str, entries: Sequence[Entry]) -> tuple[str, str, Protocol | None]:
    """The hash results must carry to be ranked: the built-in spec's, else the majority's."""
    from ..harness.spec.protocol import builtin_protocol_names, load_protocol

    if name.partition("@")[0] in builtin_protocol_names():  # NAME@Kx: NAME with its FLOP budget scaled
        try:
            spec = load_protocol(name)
            return spec.spec_hash, f"built-in spec {name} v{spec.version}", spec
        except BenchError:
            pass  # a broken built-in spec: fall back to the results themselves
    counts = Counter(e.result.protocol.hash for e in entries if e.result.status == "complete") or Counter(
        e.result.protocol.hash for e in entries)
    top = max(counts.values())
    tied = {h for h, n in counts.items() if n == top}
    newest = max((e for e in entries if e.result.protocol.hash in tied), key=lambda e: e.result.started_at)
    origin = "majority of the stored results (not a built-in protocol)"
    if len(tied) > 1:
        origin += "; tie broken by the newest run"
    return newest.result.protocol.hash, origin, None


def summarize_protocol(name: str, entries: list[Entry], precision: str = "fp32",
                       numerics: str | None = None) -> Board:
    """Rank one protocol's runs: which runs count is ``harness.results.comparability.select_runs`` (the rule
    the runner and the sweep use too); here only the leaderboard's own rule is added: a method is ranked
    when it has as many seeds as the best-covered method.

    The entries given are left as they are: the board scores copies of them (``Board.entries``, in the
    same order), so two boards that share a run (NAME@Kx borrows NAME's joint runs) never overwrite each
    other's scores, and summarizing again starts from the stored runs, not from an earlier board's."""
    from ..methods.configs import joint_settings

    entries = [unscored(e) for e in entries]
    own = [e for e in entries if e.result.protocol.name == name] or entries  # NAME@Kx: not NAME's borrowed joints
    current, origin, spec = _current_hash(name, own)
    reference_set = spec.best_new_reference if spec is not None else _stored_reference_set(entries)
    shared = (spec.reference.spec_hash if spec.reference is not spec else None) if spec is not None \
        else _stored_reference_hash(name, entries, current)
    sel = select_runs(entries, current, reference_set, joint_settings(spec) if spec is not None else None,
                      result_of=lambda e: e.result, precision=precision, reference_hash=shared, numerics=numerics)
    for e, reason in sel.apart:
        e.reason = reason
    joints = dict(sel.joints)

    valid, best_new, best_from = _score_runs(name, entries, sel, joints)
    rows = _ranked_rows(valid)
    for row in rows:
        row.paper_readings = spec is not None and paper_protocol(spec)
    used = [joints[s] for s in sorted(joints)]
    reference_row = MethodRow.of(used) if used else None
    if reference_row:
        reference_row.color = JOINT_COLOR

    unranked = sorted((e for e in entries if e.reason), key=lambda e: (e.method, e.result.seed, e.run_id))
    first = spec or max(entries, key=lambda e: e.result.started_at).result.protocol
    return Board(
        name=name, current_hash=current, hash_origin=origin,
        description=getattr(spec, "description", None), paper_ref=getattr(spec, "paper_ref", None),
        version=getattr(first, "version", None),
        rows=rows, reference_row=reference_row, joints=joints, best_new=best_new, best_new_from=best_from,
        best_new_methods=sel.best_new_methods,
        unranked=unranked, entries=entries, precision=precision,
        numerics=numerics or _board_numerics(entries),
        forward_transfer=spec is None or forward_transfer_possible(spec),
    )


def _board_numerics(entries: list[Entry]) -> str:
    """The machine arithmetic a board's runs share (the label of the first, when a caller gave none)."""
    return result_numerics(entries[0].result) if entries else "unrecorded"


def unscored(entry: Entry) -> Entry:
    """A copy of ``entry`` as loaded: the stored run, where it came from and its slug, without a board's
    scores (metrics, references, reason) or the row name ``split_by_code`` may have given it."""
    return replace(entry, metrics=None, joint=None, p_delta_paper=None, reason=None)


def scored_entries(boards: Iterable[Board]) -> list[Entry]:
    """Every run of ``boards`` once, as the board of its own protocol scored it (a NAME@Kx board scores
    NAME's joint runs too, which it borrows): what a run's own page and ``load_results`` show."""
    return [e for b in boards for e in b.entries if e.result.protocol.name == b.name]


def _score_runs(name: str, entries: list[Entry], sel: Any, joints: dict[int, Entry]
                ) -> tuple[list[Entry], dict[int, dict[int, float]], dict[tuple[int, int], Entry]]:
    """Each counted run's metrics against its seed's joint reference and A_best (and the paper's A_best
    beside it): the runs that could be scored, the protocol's A_best per seed and session, and the run each
    A_best came from. A run that cannot be scored keeps its reason."""
    # The paper's form of A_best, shown beside P_Δ: the best over the counted runs of the same seed.
    paper_best = {seed: best_new_accuracy([e.result.curves for (_, s), e in sel.runs.items() if s == seed])
                  for seed in {s for _, s in sel.runs}}
    best_new: dict[int, dict[int, float]] = {}
    best_from: dict[tuple[int, int], Entry] = {}
    by_id = {e.run_id: e for e in sel.runs.values()}
    valid: list[Entry] = []
    for e in sel.runs.values():
        seed = e.result.seed
        if seed not in joints:
            e.reason = (f"no joint reference for seed {seed} with this protocol hash "
                        f"(bench run -p {_runnable(name, entries)} -m joint -s {seed})")
            continue
        best, sources = sel.best_new(e.result)
        try:
            e.metrics = compute_metrics(e.result.curves, joints[seed].result.reference, best,
                                        eval_weighting=e.result.eval_weighting)
            e.p_delta_paper = plasticity_gap(e.result.curves, paper_best[seed], e.result.eval_weighting)
        except ValueError as exc:
            e.reason = f"metrics cannot be computed: {exc}"
            continue
        e.joint = joints[seed]
        valid.append(e)
        if e.result.label in sel.best_new_methods:  # the protocol's A_best per seed, as the references give it
            for session, value in best.items():
                best_new.setdefault(seed, {})[session] = value
                if sources[session] in by_id:
                    best_from[(seed, session)] = by_id[sources[session]]
    return valid, best_new, best_from


def _ranked_rows(valid: list[Entry]) -> list[MethodRow]:
    """The board's rows in rank order: one per method (split by code), each flagged when it has fewer
    seeds than the best-covered method, paired against the baseline (one Holm family per column),
    styled, and marked best / second best among the rows with every seed."""
    by_method: dict[str, list[Entry]] = defaultdict(list)
    for e in split_by_code(valid):
        by_method[e.method].append(e)
    most = max((len(v) for v in by_method.values()), default=0)
    rows = [MethodRow.of(runs) for runs in by_method.values()]
    for row in rows:
        row.partial = len(row.runs) < most
    baseline = next((r for r in rows if r.method == BASELINE), None)
    if baseline is not None:  # one Holm family per column: the board's rows against the baseline
        others = [r for r in rows if r is not baseline]
        for c in (c for c in ALL_COLUMNS if c.ranked):
            compared = against_baseline({r.method: r.values[c.key] for r in others}, baseline.values[c.key])
            for r in others:
                r.paired[c.key] = compared[r.method]

    def order(row: MethodRow) -> tuple[str, float, str]:
        # CK_Δ (all classes vs. joint): S_Δ alone would put first a method that does not learn (output-only
        # keeps old accuracy by not moving); CK_Δ rewards keeping the old and learning the new. Tuned rows
        # come after the others, beside the rows tuned under the same ruleset only (the same effort)
        s = row.stats[DEFAULT_ORDER].mean
        group = row.effort if row.effort.startswith("tuned") else ""
        return (group, s if s is not None else math.inf, row.method)

    rows.sort(key=order)
    assign_styles(rows)
    # best / second best among the rows with every seed: a mean over fewer seeds is shown, not crowned
    full = [r for r in rows if not r.partial]
    for column in ALL_COLUMNS:
        for row, mark in zip(full, column_marks([rank_value(r.stats[column.key], column) for r in full], column)):
            row.marks[column.key] = mark
    return rows


def split_by_code(entries: list[Entry]) -> list[Entry]:
    """Runs of one row made with different code (``MethodStamp.code_hash``: an edited plugin, a new
    release) or, in a tuned row, with different tuned settings (a study run again chose others) are never
    averaged: when a row has several, each run's row name gets its code hash, then its settings."""
    _split(entries, lambda e: e.result.method.code_hash,
           lambda e: f"#{(e.result.method.code_hash or 'unrecorded')[:8]}")
    _split([e for e in entries if e.result.tuned is not None],
           lambda e: tuple(sorted((k, format_setting(v)) for k, v in e.result.overrides.items())),
           lambda e: "(" + ", ".join(f"{k}={format_setting(v)}" for k, v in sorted(e.result.overrides.items())) + ")")
    return entries


def _split(entries: list[Entry], key: Callable[[Entry], Any], name: Callable[[Entry], str]) -> None:
    """Rename the runs of each row whose ``key`` differs within it: each gets ``name`` after its row's."""
    keys: dict[str, set[Any]] = defaultdict(set)
    for e in entries:
        keys[e.method].add(key(e))
    for e in entries:
        if len(keys[e.method]) > 1:
            e.__dict__["method"] = f"{e.method} {name(e)}"


def _stored_reference_hash(name: str, entries: Sequence[Entry], current: str) -> str | None:
    """For NAME@Kx of a protocol file of one's own (no built-in spec to ask): the hash of NAME's joint
    references, which every budget of the family shares. Read from the joint runs the board's scored runs
    named (``References.joint_run``), else the newest of NAME's joint runs; None when NAME is no family."""
    base = name.partition("@")[0]
    if base == name:
        return None
    borrowed = [e for e in entries if e.result.is_reference and e.result.protocol.name == base]
    named = {e.result.references.joint_run for e in entries
             if e.result.protocol.name == name and e.result.protocol.hash == current and e.result.references}
    used = Counter(e.result.protocol.hash for e in borrowed if e.result.run_id in named)
    if used:
        return used.most_common(1)[0][0]
    return max(borrowed, key=lambda e: e.result.started_at).result.protocol.hash if borrowed else None


def _runnable(name: str, entries: Sequence[Entry]) -> str:
    """What ``bench run -p`` takes for this protocol: its name when built in, else the protocol file its
    runs recorded (NAME@Kx: the file with @Kx), else the name with a pointer to the file."""
    from ..harness.spec.protocol import builtin_protocol_names

    base, at, factor = name.partition("@")
    if base in builtin_protocol_names():
        return name
    files = [e.result.options.get("protocol_file") for e in entries if e.result.options.get("protocol_file")]
    if not files:
        return f"<the YAML file of protocol {base}>{at}{factor}"
    return f"{max(set(files), key=files.count)}{at}{factor}"


def _stored_reference_set(entries: Sequence[Entry]) -> list[str]:
    """A protocol that is not built in: the reference set its newest scored run recorded."""
    scored = [(e.result.started_at, refs.best_new_methods) for e in entries
              if (refs := e.result.references) is not None and refs.best_new_methods]
    return list(max(scored, key=lambda s: s[0])[1]) if scored else ["vanilla"]


def summarize(entries: Iterable[Entry]) -> list[Board]:
    """One board per protocol name, precision and machine arithmetic found in the results, sorted by name:
    runs made in two precisions, or on two machines whose code paths differ, never share a row, a joint
    reference or an A_best. The entries given are left as they are (each board scores copies:
    ``summarize_protocol``; each run as scored: ``scored_entries``)."""
    groups: dict[tuple[str, str, str], list[Entry]] = defaultdict(list)
    for e in entries:
        groups[RunIdentity.from_result(e.result).board_key].append(e)
    for name, precision, numerics in list(groups):  # NAME@Kx is scored against NAME's joint references
        base = name.partition("@")[0]
        if base != name:
            groups[(name, precision, numerics)] += [e for e in groups.get((base, precision, numerics), [])
                                                    if e.result.is_reference]
    return [summarize_protocol(key[0], groups[key], key[1], key[2]) for key in sorted(groups)]


def boards_frame(boards: Sequence[Board]) -> pd.DataFrame:
    """The tidy per-run frame of what the tables average: every ranked run and every joint run in use
    (``is_reference``), one row each, with the row it belongs to as ``method``."""
    return entry_frame([e for b in boards for e in b.ranked_runs + [b.joints[s] for s in sorted(b.joints)]])


# ------------------------------------------------------------------------------------ text table

TableFormat = Literal["brief", "markdown", "text", "latex", "json"]
REACHED_NOTE = ("T_old, T_new: time to result (99 % of A_joint old; 99 % of A_best new), mean over the sessions "
                "that reached it (r/t: sessions reached of all the row's sessions); never ranked")
PAIRED_NOTE = ("Δ vs vanilla: mean paired difference on shared seeds [95 % paired-t CI], p of the paired t test "
               "Holm-adjusted over the board's rows; n.s.: adjusted p ≥ 0.05 (or one seed: no test); power P at n "
               "seeds (where below 0.80): the chance the test at level 0.05/m (m the rows compared) finds a true "
               "difference of the size seen, at the spread seen, with the n seeds compared.")
PARTIAL_NOTE = ("* fewer seeds than the best-covered row: shown with its n, never marked best, compared with "
                "vanilla on the seeds both have")


def table_columns(extra: Iterable[str] = ()) -> tuple[MetricInfo, ...]:
    """The table's columns plus the optional ones asked for by key (``all``: every optional column), less
    those named with a leading ``-`` (``-wall``, ``-tflops``: any column, standard or optional)."""
    keys = list(extra)
    drop = {k[1:] for k in keys if k.startswith("-")}
    add = [k for k in keys if not k.startswith("-")]
    known = {c.key for c in ALL_COLUMNS}
    unknown = [k for k in add if k != "all" and k not in {c.key for c in OPTIONAL_COLUMNS}] + \
        [f"-{k}" for k in drop if k not in known]
    if unknown:
        raise BenchError(f"Unknown column {unknown[0]!r} in --columns: add an optional column by its key "
                         f"({', '.join(c.key for c in OPTIONAL_COLUMNS)}, or all), remove any column with a "
                         f"leading - ({', '.join('-' + c.key for c in COLUMNS)}, ...).")
    chosen = ALL_COLUMNS if "all" in add else COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if c.key in add)
    return tuple(c for c in chosen if c.key not in drop)


def cell_text(stat: Stat, column: MetricInfo, runs: int = 0, ci: bool = True, reached: Reached | None = None) -> str:
    """"mean ± std [95 % CI]", with "(n of runs)" when only some of the row's runs had the value, or for a
    time-to-result column "(r/t sessions)": how many of the row's sessions reached the level."""
    if stat.mean is None:
        return f"– ({reached.text})" if reached is not None else "–"
    text = format_value(stat.mean, column)
    std = format_std(stat.std, column)
    text = f"{text} ± {std}" if std else text
    if ci and stat.ci is not None and stat.ci.low < stat.ci.high:  # no spread: nothing an interval adds
        text += f" [{format_value(stat.ci.low, column)}, {format_value(stat.ci.high, column)}]"
    if reached is not None:
        return f"{text} ({reached.text})"
    return f"{text} ({stat.n} of {runs})" if 0 < stat.n < runs else text


def seeds_text(row: MethodRow, most: int) -> str:
    return f"{len(row.runs)} of {most}*" if row.partial else str(len(row.runs))


def power_text(paired: Paired, with_seeds: bool = True) -> str:
    """``power 0.62 at 3 seeds`` where the test has less than 80 % power at the seeds it has ("" otherwise):
    the chance it would find a true difference of the size seen, at the spread seen, significant. Said as the
    power at hand, not as a seed count the test "needs", which read as a contradiction beside a significant p.
    Cut, never rounded, to two digits: 0.799 reads 0.79, never 0.80."""
    if paired.power is None or paired.power >= POWER:
        return ""
    power = f"power {math.floor(paired.power * 100) / 100:.2f}"
    return f"{power} at {len(paired.seeds)} seeds" if with_seeds else power


def paired_text(paired: Paired | None, column: MetricInfo, row_seeds: int, with_seeds: bool = True) -> str:
    """``+0.012 [-0.003, +0.027] p=0.21 n.s., power 0.31 at 3 seeds``: the mean difference with the baseline on
    the shared seeds, its paired-t interval, the Holm-adjusted p, ``n.s.`` when that is 0.05 or more (or there
    is no test), the test's power where it is below 80 % (``power_text``), ``on k seeds`` when fewer than the
    row's. ``with_seeds`` False: the power without its seed count, where the row shows that beside it."""
    if paired is None:
        return "–"
    text = f"{paired.mean:+.{column.digits}f}"
    if paired.interval is not None:
        text += f" [{paired.interval.low:+.{column.digits}f}, {paired.interval.high:+.{column.digits}f}]"
    p = paired.p_holm if paired.p_holm is not None else paired.p
    if p is not None:
        text += f" p={p:.2g}" if p >= 0.001 else " p<0.001"
    if paired.inconclusive:
        text += " n.s."
    if power := power_text(paired, with_seeds):
        text += f", {power}"
    if len(paired.seeds) < row_seeds:
        text += f" (on {len(paired.seeds)} seeds)"
    return text


def header_text(c: MetricInfo) -> str:
    return f"{c.symbol}{' (' + c.unit + ')' if c.unit else ''}{' ' + c.arrow if c.ranked else ''}"


def identity_line(board: Board) -> str:
    """What every run of the board shares beyond protocol and method, as the CSV's identity columns give it per
    run (``run_identity``): ``precision fp32, 1 thread, kernels gemm1x1+..., arithmetic <label>``. Threads and
    kernels are those of the board's CPU runs (a CPU run stored before bench recorded them: unrecorded); a
    board of GPU runs has neither. Settings can differ between rows, so each row names its own."""
    ids = [run_identity(e.result) for e in board.ranked_runs + [board.joints[s] for s in sorted(board.joints)]]
    cpu = [i for i in ids if i["cpu_kernels"]]  # a CUDA run's kernels are "" (not applicable)
    parts = [f"precision {board.precision}"]
    if cpu:
        threads = sorted({int(i["threads"]) for i in cpu})
        counts = "/".join(str(t) if t else "unrecorded" for t in threads)
        parts.append(f"{counts} thread{'' if threads == [1] else 's'}")
        parts.append("kernels " + "/".join(sorted({str(i["cpu_kernels"]) for i in cpu})))
    elif ids:
        parts.append("on a GPU (no CPU threads or kernels)")
    parts.append(f"arithmetic {board.numerics}")
    return ", ".join(parts)


def _board_body(board: Board, columns: Sequence[MetricInfo], fmt: TableFormat) -> list[list[str]]:
    """The rows of one board's markdown or text table, the joint reference last (its settings as the CSV and
    ``load_results`` give them)."""
    order = COLUMN_BY_KEY[DEFAULT_ORDER]
    body: list[list[str]] = []
    for row in board.rows:
        cells = [row.method, seeds_text(row, board.most_seeds), row.effort]
        for c in columns:
            text = cell_text(row.stats[c.key], c, len(row.runs), reached=row.reached.get(c.key))
            mark = row.marks.get(c.key)
            if fmt == "markdown" and text != "–":
                text = f"**{text}**" if mark == "best" else f"_{text}_" if mark == "second" else text
            if c.key == "params" and row.params_reading:
                text += f" ({row.params_reading})"
            cells.append(text)
        cells.append(paired_text(row.paired.get(order.key), order, len(row.runs)) if row.method != BASELINE
                     else "(baseline)")
        body.append(cells)
    if board.reference_row:
        ref = board.reference_row
        body.append([JOINT_ROW, str(len(ref.runs)), ref.effort]
                    + [cell_text(ref.stats[c.key], c, len(ref.runs)) for c in columns] + [""])
    return body


def format_table(boards: Sequence[Board], fmt: TableFormat = "markdown",
                 columns: Sequence[MetricInfo] = COLUMNS) -> str:
    """The aggregated numbers as Markdown (best **bold**, 2nd _italic_), plain text, LaTeX (booktabs, best
    bold, 2nd underlined) or JSON; mean ± std [95 % CI] over seeds and the paired difference with vanilla
    on the ranking column; under each board's title, what its runs share (``identity_line``)."""
    if fmt == "brief":
        return format_brief(boards)
    if fmt == "json":
        return board_json(boards, columns)
    if fmt == "latex":
        return format_latex(boards, columns)
    order = COLUMN_BY_KEY[DEFAULT_ORDER]
    out: list[str] = []
    for board in boards:
        shown = board.columns(columns)
        headers = (["method", "seeds", "settings"] + [header_text(c) for c in shown] +
                   [f"Δ{order.symbol} vs {BASELINE} [95% CI]"])
        title = f"{board.name} (protocol hash {board.current_hash}, {board.precision}, {board.numerics})"
        out += [f"## {title}" if fmt == "markdown" else title, "", f"Runs: {identity_line(board)}.", ""]
        body = _board_body(board, shown, fmt)
        if not board.rows:
            out.append("(no ranked runs)")
        if body:
            out.extend(render_rows(headers, body, fmt))
        out += _board_notes(board)
        out.append("")
    if fmt == "markdown" and any(b.rows for b in boards):
        out.append("mean ± std [95 % Student-t CI] over seeds, rows in order of CK_Δ, tuned rows grouped by their "
                   "ruleset after the others; settings: defaults (published), tuned (trials, objective on the "
                   "validation split) or set by hand; **best**, _second best_ (values that read the same are tied); "
                   "↓ lower is better, ↑ higher is better; wall time is shown, never ranked. " + PAIRED_NOTE)
        if any(c.key in TIME_TO_RESULT_KEYS for c in columns):
            out.append("")
            out.append(REACHED_NOTE + ".")
        if any(c.key == "fwt" for c in columns) and not all(b.forward_transfer for b in boards):
            out += ["", FWT_NOTE]
    return "\n".join(out).rstrip() + "\n"


def _board_notes(board: Board) -> list[str]:
    """What follows a board's table: the partial rows' mark, the runs' own notes and the runs not ranked."""
    out: list[str] = []
    if any(r.partial for r in board.rows):
        out += ["", PARTIAL_NOTE]
    if any(r.notes for r in board.rows):
        out += ["", "Notes:"]
        out.extend(f"- {r.method}: {n}" for r in board.rows for n in r.notes)
    if board.unranked:
        out += ["", "Not ranked:"]
        out.extend(f"- {e.method} seed {e.result.seed} ({e.run_id}): {e.reason}" for e in board.unranked)
    return out


FWT_NOTE = ("FWT is left out where it is 0 by construction: on a class-incremental protocol whose head grows, the "
            "model has no unit for a class before its session, so every method and the reference score 0 there.")
JOINT_ROW = "joint (upper bound)"
BRIEF_KEYS = ("S_delta", "P_delta", "CK_delta")  # the gaps: what a sweep is run to see
BRIEF_WIDTH = 120  # a terminal's width the brief table keeps to


def format_brief(boards: Sequence[Board], width: int = BRIEF_WIDTH) -> str:
    """The table at a glance, for a terminal: per protocol, each row's seeds, the gaps as mean ± std and the
    paired difference with vanilla on CK_Δ with its interval and p, in at most ``width`` columns (a long
    method string is cut to fit, ending in "…"); every other column, the intervals of the means and the
    notes are in the other formats."""
    order = COLUMN_BY_KEY[DEFAULT_ORDER]
    columns = [COLUMN_BY_KEY[k] for k in BRIEF_KEYS]
    headers = ["method", "n"] + [header_text(c) for c in columns] + [f"Δ{order.symbol} vs {BASELINE}"]
    out: list[str] = []
    for board in boards:
        out += [f"{board.name} ({board.precision}, {board.numerics}; hash {board.current_hash})", ""]
        body = [[row.method, seeds_text(row, board.most_seeds)]
                + [cell_text(row.stats[c.key], c, len(row.runs), ci=False) for c in columns]
                + ["(baseline)" if row.method == BASELINE else _brief_paired(row.paired.get(order.key), order)]
                for row in board.rows]
        if board.reference_row:
            ref = board.reference_row
            body.append([JOINT_ROW, str(len(ref.runs))]
                        + [cell_text(ref.stats[c.key], c, len(ref.runs), ci=False) for c in columns] + [""])
        if not body:
            out += ["(no ranked runs)", ""]
            continue
        rest = sum(max(len(r[i]) for r in [headers, *body]) + 2 for i in range(1, len(headers)))
        room = max(12, width - rest)
        body = [[r[0] if len(r[0]) <= room else r[0][:room - 1] + "…", *r[1:]] for r in body]
        out += render_rows(headers, body, "text") + [""]
        if board.unranked:
            out += [f"{len(board.unranked)} run(s) not ranked (bench leaderboard table says why)", ""]
    if any(b.rows for b in boards):
        out += ["mean ± std over seeds; Δ: paired difference on shared seeds [95 % CI], Holm-adjusted p "
                "(n.s.: ≥ 0.05).", "Every column, interval and note: --format markdown (--columns all)."]
    return "\n".join(out).rstrip() + "\n"


def _brief_paired(paired: Paired | None, column: MetricInfo) -> str:
    """The paired difference, its interval and p, without the power note (the other formats give it)."""
    if paired is None:
        return "–"
    return paired_text(replace(paired, needed=None, power=None), column, len(paired.seeds))


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_SYMBOLS = {"Δ": r"\Delta", "σ": r"\sigma", "μ": r"\mu", "α": r"\alpha", "Ā": r"\bar{A}", "Ω": r"\Omega"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def latex_symbol(c: MetricInfo) -> str:
    """The catalog symbol in LaTeX math: ``S_Δ`` -> ``$S_{\\Delta}$``, words as text."""
    match = re.fullmatch(r"(\w+?)_(\S+)(.*)", c.symbol)
    greek = lambda t: "".join(_LATEX_SYMBOLS.get(ch, ch) for ch in t)  # noqa: E731
    if match:
        head, sub, rest = match.groups()
        text = f"${greek(head)}_{{{greek(sub)}}}${latex_escape(rest)}"
    elif c.symbol in _LATEX_SYMBOLS:
        text = f"${_LATEX_SYMBOLS[c.symbol]}$"
    else:
        text = latex_escape(c.symbol)
    unit = f" (\\{c.unit})" if c.unit == "%" else f" ({c.unit})" if c.unit else ""
    arrow = {"min": r" $\downarrow$", "max": r" $\uparrow$"}.get(c.direction, "") if c.ranked else ""
    return text + unit + arrow


def _latex_cell(stat: Stat, c: MetricInfo, mark: str | None, reached: Reached | None) -> str:
    """"mean $\\pm$ std [t interval]", best bold, second underlined, and the sessions reached where counted."""
    count = f" ({reached.reached}/{reached.sessions})" if reached is not None else ""
    if stat.mean is None:
        return "--" + count
    text = format_value(stat.mean, c).replace(",", "{,}")
    std = format_std(stat.std, c)
    text = f"{text} $\\pm$ {std}" if std else text
    text = f"\\textbf{{{text}}}" if mark == "best" else f"\\underline{{{text}}}" if mark == "second" else text
    if stat.ci is not None and stat.ci.low < stat.ci.high:
        low, high = (format_value(v, c).replace(",", "{,}") for v in (stat.ci.low, stat.ci.high))
        text += f" [{low}, {high}]"
    return text + count


def format_latex(boards: Sequence[Board], columns: Sequence[MetricInfo] = COLUMNS) -> str:
    """One booktabs ``tabular`` per protocol: mean ± std [95 % t interval] over seeds, best \\textbf, second
    \\underline, and the paired difference with the baseline on the ranking column; a row under the header
    names what the board's runs share (``identity_line``), a column each row's settings, so the table that goes
    into a paper says what it measured, not only a comment beside it."""
    order = COLUMN_BY_KEY[DEFAULT_ORDER]
    out: list[str] = []
    for board in boards:
        shown = board.columns(columns)
        spec = "l r l " + " ".join("r" for _ in shown) + " r"
        paired_head = f"$\\Delta${latex_symbol(order).split(' ')[0]} vs {latex_escape(BASELINE)}"
        out += [f"% {board.name} (protocol hash {board.current_hash}, {board.precision}, {board.numerics}); "
                f"mean $\\pm$ std [95 \\% Student-t CI] over seeds",
                r"\begin{tabular}{" + spec + "}", r"\toprule",
                " & ".join(["Method", "$n$", "Settings"] + [latex_symbol(c) for c in shown] + [paired_head]) + r" \\",
                f"\\multicolumn{{{len(shown) + 4}}}{{l}}{{\\footnotesize Runs: {latex_escape(identity_line(board))}}} "
                r"\\", r"\midrule"]
        for row in board.rows:
            cells = [latex_escape(row.method), f"{len(row.runs)}" + ("$^*$" if row.partial else ""),
                     latex_escape(row.effort)]
            cells += [_latex_cell(row.stats[c.key], c, row.marks.get(c.key), row.reached.get(c.key)) for c in shown]
            cells.append("(baseline)" if row.method == BASELINE
                         else latex_escape(paired_text(row.paired.get(order.key), order, len(row.runs))))
            out.append(" & ".join(cells) + r" \\")
        if board.reference_row:
            ref = board.reference_row
            out.append(r"\midrule")
            out.append(" & ".join([latex_escape(JOINT_ROW), str(len(ref.runs)), latex_escape(ref.effort)]
                                  + [cell_text(ref.stats[c.key], c, ci=False).replace("±", "$\\pm$")
                                     .replace("–", "--") for c in shown] + [""]) + r" \\")
        out += [r"\bottomrule", r"\end{tabular}"]
        if board.rows:
            out.append("% " + PAIRED_NOTE)
        if any(r.partial for r in board.rows):
            out.append("% $^*$ " + PARTIAL_NOTE.lstrip("* "))
        out.extend(f"% {latex_escape(r.method)}: {latex_escape(n)}" for r in board.rows for n in r.notes)
        if any(c.key in TIME_TO_RESULT_KEYS for c in shown):
            out.append("% " + REACHED_NOTE)
        if len(shown) < len(columns):
            out.append("% " + FWT_NOTE)
        out.append("")
    return "\n".join(out)


def _stat_json(stat: Stat) -> dict[str, object]:
    return {"mean": stat.mean, "std": stat.std, "n": stat.n,
            "ci95": None if stat.ci is None else [stat.ci.low, stat.ci.high]}


def _paired_json(p: Paired | None) -> dict[str, object] | None:
    if p is None:
        return None
    return {"mean": p.mean, "ci95": None if p.interval is None else [p.interval.low, p.interval.high],
            "seeds": list(p.seeds), "p": p.p, "p_holm": p.p_holm, "holm_family": p.family,
            "power": p.power, "seeds_for_80pct_power": p.needed, "inconclusive": p.inconclusive}


def board_json(boards: Sequence[Board], columns: Sequence[MetricInfo] = COLUMNS) -> str:
    """The tables as JSON: per protocol, per row, every column's mean, std, n, 95 % CI and mark, and the
    paired difference with vanilla per column."""
    import json

    def reached(row: MethodRow, key: str) -> dict[str, object]:
        r = row.reached.get(key)
        return {} if key not in TIME_TO_RESULT_KEYS else {
            "reached": None if r is None else {"sessions": r.reached, "of": r.sessions}}

    def row_json(row: MethodRow, reference: bool = False) -> dict[str, object]:
        return {"method": row.method, "seeds": row.seeds, "n": len(row.runs), "partial": row.partial,
                "reference": reference, "color": row.color, "settings": row.effort, "notes": row.notes,
                **{k: sorted({run_identity(e.result)[k] for e in row.runs})
                   for k in ("threads", "cpu_kernels", "numerics")},
                "metrics": {c.key: {**_stat_json(row.stats[c.key]), "mark": row.marks.get(c.key, ""),
                                    **reached(row, c.key)} for c in columns},
                "vs_baseline": {c.key: _paired_json(row.paired.get(c.key)) for c in columns if c.key in row.paired}}

    data = {"baseline": BASELINE, "level": 0.95, "columns": [c.key for c in columns], "protocols": [
        {"name": b.name, "protocol_hash": b.current_hash, "precision": b.precision, "numerics": b.numerics,
         "most_seeds": b.most_seeds,
         "rows": [row_json(r) for r in b.rows] + ([row_json(b.reference_row, True)] if b.reference_row else []),
         "unranked": [{"method": e.method, "seed": e.result.seed, "run_id": e.run_id, "reason": e.reason}
                      for e in b.unranked]} for b in boards]}
    return json.dumps(data, indent=1, allow_nan=False) + "\n"


def render_rows(headers: list[str], rows: list[list[str]], fmt: str) -> list[str]:
    if fmt == "markdown":
        esc = [[c.replace("|", "\\|") for c in r] for r in [headers, *rows]]
        lines = ["| " + " | ".join(r) + " |" for r in esc]
        lines.insert(1, "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|")
        return lines
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [line(headers), "  ".join("-" * w for w in widths), *map(line, rows)]
