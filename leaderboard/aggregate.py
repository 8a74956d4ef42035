"""Summarize stored results: validate each run, recompute the metrics that depend on other runs, and
aggregate over seeds (mean ± std per protocol and method).

This is the "summarize" step of DESIGN §3; the static site (``leaderboard.site``) and the plain-text
table (``bench leaderboard table``) both render what ``summarize`` returns, so they always agree.

Reference-dependent metrics are recomputed here, never read from the stored ``RunResult.metrics``:
A_joint comes from the newest complete joint run of the same protocol hash and seed, and A_best from
every complete CL run of that protocol hash (``harness.metrics.best_new_accuracy``), so adding a run
updates P_Δ of every other run of the protocol.

A run is ranked only if it is complete, carries the protocol's current spec hash, has a joint
reference for its seed, and its method has as many seeds as the best-covered method of the protocol.
Everything else is listed apart with the reason.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from ..harness.errors import BenchError
from ..harness.metrics import Metrics, best_new_accuracy, compute_metrics, plasticity_gap
from ..harness.results import RunResult, select_runs

Direction = Literal["min", "max"]


@dataclass(frozen=True)
class Column:
    """One column of the leaderboard table (the paper's Table 1 columns plus the budget figures)."""

    key: str
    label: str  # as the paper writes it (Unicode)
    direction: Direction  # min: lower is better (↓), max: higher is better (↑)
    digits: int
    unit: str  # shown in the header / glossary
    title: str  # one line, for the header's tooltip and the text table's legend

    @property
    def arrow(self) -> str:
        return "↓" if self.direction == "min" else "↑"


COLUMNS: tuple[Column, ...] = (
    Column("params", "#P", "min", 2, "M", "trainable parameters, in millions"),
    Column("S_delta", "S_Δ", "min", 3, "", "stability gap: old-class accuracy missing vs. the joint model"),
    Column("P_delta", "P_Δ", "min", 3, "", "plasticity gap: new-class accuracy missing vs. A_best, the best of the "
           "protocol's reference methods and the run itself (same seed)"),
    Column("P_delta_paper", "P_Δ (paper)", "min", 3, "", "plasticity gap against the paper's A_best: the best "
           "new-class accuracy of any ranked run of the same seed (moves when a run is added)"),
    Column("CK_delta", "CK_Δ", "min", 3, "", "continual knowledge gap: all-class accuracy missing vs. the joint model"),
    Column("sigma", "σ", "max", 2, "%", "final accuracy on the pre-training classes"),
    Column("mu", "μ", "max", 2, "%", "mean end-of-session accuracy on all seen classes, sessions 2..N"),
    Column("alpha", "α", "max", 2, "%", "final accuracy on all classes"),
    Column("updates", "updates", "min", 0, "", "optimizer updates over all learning sessions"),
    Column("tflops", "train TFLOPs", "min", 2, "", "training compute, 10¹² floating-point operations"),
    Column("wall", "wall time", "min", 1, "s", "wall-clock time of the run, in seconds"),
)
COLUMN_BY_KEY = {c.key: c for c in COLUMNS}


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


def accuracy_scale(result: RunResult) -> float:
    """100 when the run stores accuracies as fractions (shown as %), 1 when it stores percentages."""
    values = [v for c in result.curves for v in (*c.old, *c.new, *c.all)]
    values += [v for r in result.reference for v in (r.old, r.new, r.all)]
    return 100.0 if not values or max(values) <= 1.0 + 1e-9 else 1.0


def run_values(result: RunResult, metrics: Metrics | None, p_delta_paper: float | None = None) -> dict[str, float | None]:
    """The table's columns for one run (``None``: not available, shown as "–")."""
    budget = result.budget
    out: dict[str, float | None] = {
        "params": result.trainable_params / 1e6,
        "updates": float(budget.optimizer_steps),
        "tflops": None if budget.train_flops is None else budget.train_flops / 1e12,
        "wall": result.wall_time_s,
        "S_delta": None, "P_delta": None, "CK_delta": None, "sigma": None, "mu": None, "alpha": None,
        "P_delta_paper": p_delta_paper,
    }
    scale = accuracy_scale(result)
    if result.is_reference and result.reference:
        last = max(result.reference, key=lambda r: r.session)
        out["sigma"] = last.tasks[0] * scale if last.tasks else None
        out["alpha"] = last.all * scale
    elif metrics is not None:
        out.update(S_delta=metrics.S_delta, P_delta=metrics.P_delta, CK_delta=metrics.CK_delta,
                   sigma=metrics.sigma * scale, mu=metrics.mu * scale, alpha=metrics.alpha * scale)
    return out


@dataclass(frozen=True)
class Stat:
    """Mean ± sample standard deviation over seeds; ``std`` is None for a single value."""

    mean: float | None
    std: float | None
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat:
        xs = [float(v) for v in values if v is not None and math.isfinite(v)]
        if not xs:
            return cls(None, None, 0)
        mean = sum(xs) / len(xs)
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None
        if std is not None and std <= 1e-12 * max(1.0, abs(mean)):
            std = 0.0  # identical values up to rounding error
        return cls(mean, std, len(xs))


def fmt_number(value: float | None, column: Column) -> str:
    """The column's display precision; "–" for a missing value."""
    if value is None:
        return "–"
    if column.key == "tflops" and 0 < abs(value) < 0.01:
        return f"{value:.2e}"
    return f"{value:,.{column.digits}f}" if column.digits == 0 else f"{value:.{column.digits}f}"


def rank_value(stat: Stat, column: Column) -> float | None:
    """The value a column ranks by: the mean rounded to display precision (as a reader compares)."""
    if stat.mean is None:
        return None
    return round(stat.mean, column.digits if column.key != "tflops" else 6)


def marks(values: Sequence[float | None], direction: Direction) -> list[str]:
    """The paper's marking: ``best`` (bold) and ``second`` (underline) per column; ties share a mark.

    Nothing is marked when fewer than two distinct values exist (all tied: nothing to see).
    """
    distinct = sorted({v for v in values if v is not None}, reverse=direction == "max")
    if len(distinct) < 2:
        return [""] * len(values)
    first, second = distinct[0], distinct[1]
    return ["best" if v == first else "second" if v == second else "" for v in values]


# ---------------------------------------------------------------------------------- aggregation


@dataclass(eq=False)
class MethodRow:
    """One method of one protocol: its runs (one per seed) and the mean ± std of every column."""

    method: str
    family: str
    runs: list[Entry]
    stats: dict[str, Stat]
    color: str = ""
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        return sorted(e.result.seed for e in self.runs)

    @property
    def distribution(self) -> str:
        m = self.runs[0].result.method
        return f"{m.distribution} {m.version}"

    @classmethod
    def of(cls, entries: list[Entry]) -> MethodRow:
        entries = sorted(entries, key=lambda e: e.result.seed)
        per_run = [run_values(e.result, e.metrics, e.p_delta_paper) for e in entries]
        stats = {c.key: Stat.of(v[c.key] for v in per_run) for c in COLUMNS}
        first = entries[0]
        return cls(method=first.method, family=first.family, runs=entries, stats=stats)


@dataclass(eq=False)
class Board:
    """Everything the leaderboard shows for one protocol."""

    name: str
    current_hash: str
    hash_origin: str
    description: str | None
    paper_ref: str | None
    version: int | None
    rows: list[MethodRow]  # ranked methods
    reference_row: MethodRow | None  # the joint upper bound (never ranked)
    joints: dict[int, Entry]  # seed -> joint run used as A_joint
    best_new: dict[int, dict[int, float]]  # seed -> session -> A_best(E_j) of the protocol's reference set
    best_new_from: dict[tuple[int, int], Entry]  # (seed, session) -> the reference run that reached it
    best_new_methods: tuple[str, ...]  # the protocol's A_best reference set
    unranked: list[Entry]
    entries: list[Entry]

    @property
    def ranked_runs(self) -> list[Entry]:
        return [e for row in self.rows for e in row.runs]

    @property
    def seeds(self) -> list[int]:
        return sorted({s for row in self.rows for s in row.seeds})


PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd")
JOINT_COLOR = "#111111"


def _current_hash(name: str, entries: Sequence[Entry]) -> tuple[str, str, object | None]:
    """The hash results must carry to be ranked: the built-in spec's, else the majority's."""
    from ..harness.protocol import builtin_protocol_names, load_protocol

    if name in builtin_protocol_names():
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


def summarize_protocol(name: str, entries: list[Entry]) -> Board:
    """Rank one protocol's runs: which runs count is ``harness.results.select_runs`` (the rule the runner
    and the sweep use too); here only the leaderboard's own rule is added: a method is ranked when it has
    as many seeds as the best-covered method."""
    from ..harness.reference import joint_settings

    current, origin, spec = _current_hash(name, entries)
    for e in entries:
        e.reason, e.metrics, e.joint, e.p_delta_paper = None, None, None, None
    reference_set = spec.best_new_reference if spec is not None else _stored_reference_set(entries)
    sel = select_runs(entries, current, reference_set, joint_settings(spec) if spec is not None else None,
                      result_of=lambda e: e.result)
    for e, reason in sel.apart:
        e.reason = reason
    joints = dict(sel.joints)

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
                        f"(bench run -p {name} -m joint -s {seed})")
            continue
        best, sources = sel.best_new(e.result)
        try:
            e.metrics = compute_metrics(e.result.curves, joints[seed].result.reference, best)
            e.p_delta_paper = plasticity_gap(e.result.curves, paper_best[seed])
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

    by_method: dict[str, list[Entry]] = defaultdict(list)
    for e in valid:
        by_method[e.method].append(e)
    most = max((len(v) for v in by_method.values()), default=0)
    full_seeds = sorted({e.result.seed for v in by_method.values() if len(v) == most for e in v})
    rows: list[MethodRow] = []
    for method, runs in by_method.items():
        if len(runs) < most:
            have = sorted(e.result.seed for e in runs)
            for e in runs:
                e.reason = (f"missing seeds: {method} has {len(have)} seed(s) {have}, other methods have "
                            f"{most} (seeds {full_seeds})")
            continue
        rows.append(MethodRow.of(runs))

    def order(row: MethodRow) -> tuple[float, str]:
        s = row.stats["S_delta"].mean
        return (s if s is not None else math.inf, row.method)

    rows.sort(key=order)
    for i, row in enumerate(sorted(rows, key=lambda r: r.method)):
        row.color = PALETTE[i % len(PALETTE)]
    for column in COLUMNS:
        for row, mark in zip(rows, marks([rank_value(r.stats[column.key], column) for r in rows], column.direction)):
            row.marks[column.key] = mark

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
        unranked=unranked, entries=entries,
    )


def _stored_reference_set(entries: Sequence[Entry]) -> list[str]:
    """A protocol that is not built in: the reference set its newest scored run recorded."""
    scored = [e.result for e in entries if e.result.references and e.result.references.best_new_methods]
    return list(max(scored, key=lambda r: r.started_at).references.best_new_methods) if scored else ["vanilla"]


def summarize(entries: Iterable[Entry]) -> list[Board]:
    """One board per protocol name found in the results, sorted by name."""
    groups: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        groups[e.result.protocol.name].append(e)
    return [summarize_protocol(name, groups[name]) for name in sorted(groups)]


# ------------------------------------------------------------------------------------ text table


def fmt_std(stat: Stat, column: Column) -> str | None:
    """The ± part: one more digit than the mean for the gaps (as the paper prints it); none when 0."""
    if stat.std is None or stat.std == 0:
        return None
    digits = column.digits + 1 if column.digits >= 3 else column.digits
    return f"{stat.std:.{digits}f}"


def cell_text(stat: Stat, column: Column, runs: int = 0) -> str:
    """"mean ± std", with "(n of runs)" when only some of the row's runs had the value."""
    if stat.mean is None:
        return "–"
    text = fmt_number(stat.mean, column)
    std = fmt_std(stat, column)
    text = f"{text} ± {std}" if std else text
    return f"{text} ({stat.n} of {runs})" if 0 < stat.n < runs else text


def format_table(boards: Sequence[Board], fmt: Literal["markdown", "text"] = "markdown") -> str:
    """The aggregated numbers as a Markdown (best **bold**, 2nd _italic_) or plain-text table."""
    out: list[str] = []
    headers = ["method", "seeds"] + [f"{c.label}{' (' + c.unit + ')' if c.unit else ''} {c.arrow}" for c in COLUMNS]
    for board in boards:
        title = f"{board.name} (protocol hash {board.current_hash})"
        out.append(f"## {title}" if fmt == "markdown" else title)
        out.append("")
        body: list[list[str]] = []
        for row in board.rows:
            cells = [row.method, str(len(row.runs))]
            for c in COLUMNS:
                text = cell_text(row.stats[c.key], c, len(row.runs))
                mark = row.marks.get(c.key)
                if fmt == "markdown" and text != "–":
                    text = f"**{text}**" if mark == "best" else f"_{text}_" if mark == "second" else text
                cells.append(text)
            body.append(cells)
        if board.reference_row:
            ref = board.reference_row
            body.append(["joint (upper bound)", str(len(ref.runs))]
                        + [cell_text(ref.stats[c.key], c, len(ref.runs)) for c in COLUMNS])
        if not board.rows:
            out.append("(no ranked runs)")
        if body:
            out.extend(_render(headers, body, fmt))
        if board.unranked:
            out.append("")
            out.append("Not ranked:")
            out.extend(f"- {e.method} seed {e.result.seed} ({e.run_id}): {e.reason}" for e in board.unranked)
        out.append("")
    if fmt == "markdown" and any(b.rows for b in boards):
        out.append("mean ± std over seeds; **best**, _second best_; ↓ lower is better, ↑ higher is better.")
    return "\n".join(out).rstrip() + "\n"


def _render(headers: list[str], rows: list[list[str]], fmt: str) -> list[str]:
    if fmt == "markdown":
        esc = [[c.replace("|", "\\|") for c in r] for r in [headers, *rows]]
        lines = ["| " + " | ".join(r) + " |" for r in esc]
        lines.insert(1, "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|")
        return lines
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [line(headers), "  ".join("-" * w for w in widths), *map(line, rows)]
