"""Render the static leaderboard: HTML (Jinja2, autoescaped), hand-written SVG plots, run JSON copies.

The site is self-contained: relative links only, no server, no CDN; it works from file:// and from
any static host. JavaScript only adds sorting and the family filter; everything reads without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata, resources
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from jinja2 import Environment, PackageLoader, StrictUndefined

from ..harness.errors import BenchError
from ..harness.paths import SITE_MARKER as MARKER
from ..harness.results.catalog import ACCURACY_KEYS, METRICS, TIME_TO_RESULT_KEYS, MetricInfo, format_std, format_value
from ..harness.results.metrics import RECOVERY_FRACTIONS, Metrics
from ..harness.results.tidy import VALUE_KEYS, accuracy_scale, run_values
from ..harness.results.uncertainty import Paired
from ..methods.metadata import method_family, method_papers
from .aggregate import (
    ALL_COLUMNS,
    BASELINE,
    COLUMN_BY_KEY,
    DEFAULT_ORDER,
    Board,
    Entry,
    MethodRow,
    Reached,
    Stat,
    assign_slugs,
    column_marks,
    paired_text,
    rank_value,
    scored_entries,
    seeds_text,
    summarize,
)
from .budget_curve import CURVE_COLUMNS, BudgetFamily, budget_families, family_rows, figure_bytes
from .glossary import BEFORE_NOTE, INTERVAL_NOTE, OMEGA_NOTE, TERMS
from .options_view import option_node
from .paper_distance import paper_distance
from .plots import board_plots, compute_plots, run_plot
from .reported import ReportedTable, load_reported
from .sources import Loaded

OWNED = ("index.html", "glossary.html", "runs", "plots", "static")


@dataclass
class BuildReport:
    out: Path
    boards: list[Board]
    skipped: list[tuple[str, str]]
    pages: int
    seconds: float
    warnings: list[str] = field(default_factory=list)

    @property
    def index(self) -> Path:
        return self.out / "index.html"


# ------------------------------------------------------------------------------------ helpers


_SLUG = re.compile(r"^[a-z0-9_]{1,64}$")
# where the paired text's test part begins: its p-value, or "n.s." alone where one shared seed allows no test
PAIRED_TEST_START = re.compile(r"\s(?=p[=<]|n\.s\.)")


def protocol_slug(name: str, i: int) -> str:
    return name if _SLUG.match(name) else f"protocol-{i}"


# Columns behind the table's "+ #P, budget and time" toggle: what a method may change (#P, with its reading
# note the widest numeric cell), the same for every method of a protocol (updates), or read per session and
# never ranked (time to result, wall time). Hidden, the seed count, the gap columns with their paired
# difference and σ, μ, α fit a 1280 px window without scrolling.
EXTRA_KEYS = frozenset(("params", "updates", "tflops", "wall", *TIME_TO_RESULT_KEYS))


def column_label(column: MetricInfo) -> str:
    """A column's name as plain text, for the stacked (phone) layout where each value carries its label."""
    unit = f" ({column.unit})" if column.unit else ""
    return f"{column.symbol}{unit} {column.arrow}".rstrip() if column.ranked else f"{column.symbol}{unit}"


PRECISION_ORDER = ("fp32", "tf32", "bf16")


def board_order(board: Board) -> tuple:
    """Where a board stands on the index: boards with ranked methods first, grouped by precision (fp32
    first), the default protocol first within its group, then a protocol before its scaled budgets
    (NAME@Kx), then by name. Alphabetical order put a user's main board after every budget variant."""
    from ..harness.spec.protocol import DEFAULT_PROTOCOL

    base, _, budget = board.name.partition("@")
    rank = PRECISION_ORDER.index(board.precision) if board.precision in PRECISION_ORDER else len(PRECISION_ORDER)
    return (not board.rows, rank, board.precision, base != DEFAULT_PROTOCOL, base, budget != "", board.name)


def _cell(stat: Stat, key: str, mark: str = "", runs: int = 0, note: str | None = None,
          reached: Reached | None = None) -> dict:
    """One table cell; ``partial`` says how many of the row's runs had the value, when not all did, or for a
    time-to-result column ``reached`` how many of the row's sessions reached the level."""
    column = COLUMN_BY_KEY[key]
    std = format_std(stat.std, column)
    value = rank_value(stat, column)
    ci = (f"[{format_value(stat.ci.low, column)}, {format_value(stat.ci.high, column)}]"
          if stat.ci is not None and stat.ci.low < stat.ci.high else None)
    return {"key": key, "text": format_value(stat.mean, column), "std": std, "mark": mark, "ci": ci,
            "optional": column.optional, "extra": key in EXTRA_KEYS, "label": column_label(column),
            "value": "" if value is None else repr(value),
            "partial": f"{stat.n} of {runs} runs" if 0 < stat.n < runs and reached is None else None, "note": note,
            "reached": None if reached is None else reached.text}


SVG_DASHES = {"dashed": "6 3", "dotted": "1.5 2.5", "dashdot": "6 2 1.5 2"}  # the plots' line styles, for the swatch


def _row_view(row: MethodRow, run_href: dict[int, str], reference: bool = False, most: int = 0,
              columns: Sequence[MetricInfo] = ALL_COLUMNS) -> dict:
    order = COLUMN_BY_KEY[DEFAULT_ORDER]
    paired = row.paired.get(order.key)
    return {
        "method": row.method, "family": row.family, "color": row.color, "dasharray": SVG_DASHES.get(row.dash, ""),
        "reference": reference, "effort": row.effort, "partial": row.partial, "most": most,
        "n": len(row.runs), "distribution": row.distribution, "notes": row.notes,
        "group": method_family(row.method.split(" ")[0]),
        "papers": [{"name": n, "cite": c, "url": u} for n, c, u in method_papers(row.method.split(" ")[0])],
        "runs": [{"seed": e.result.seed, "href": run_href[id(e)]} for e in row.runs],
        "cells": [_cell(row.stats[c.key], c.key, "" if reference else row.marks.get(c.key, ""), len(row.runs),
                        row.params_reading if c.key == "params" else None, row.reached.get(c.key))
                  for c in columns],
        "paired": None if reference or row.method == BASELINE else _paired_view(paired, order, len(row.runs)),
        "details": _row_details(row),
    }


def _paired_view(paired: Paired | None, order: MetricInfo, row_seeds: int) -> dict:
    """The paired difference in two short lines, so its column stays narrow: the difference and its interval,
    then the test (p, n.s., its power, whose seed count the row's Seeds cell shows); the whole text is the
    cell's title."""
    text = paired_text(paired, order, row_seeds)
    parts = PAIRED_TEST_START.split(paired_text(paired, order, row_seeds, with_seeds=False), maxsplit=1)
    difference, test = parts[0], (parts[1] if len(parts) > 1 else "")
    return {"text": text, "difference": difference, "test": test.lstrip(", "),
            "inconclusive": paired is None or paired.inconclusive}


def _row_details(row: MethodRow) -> str:
    """What the compact Method cell leaves to its tooltip: settings, family, papers, the code that made the
    runs and their seeds."""
    base = row.method.split(" ")[0]
    papers = "; ".join(cite for _, cite, _ in method_papers(base))
    seeds = ", ".join(str(e.result.seed) for e in row.runs)
    return " · ".join(x for x in (f"settings: {row.effort}", f"family: {method_family(base)}",
                                  f"paper: {papers}" if papers else "", f"supplied by {row.distribution}",
                                  f"seeds {seeds}", *(f"note: {n}" for n in row.notes)) if x)


def _reported_view(table: ReportedTable) -> dict:
    keys = table.columns
    ranked = [r for r in table.rows if not r.reference]
    col_marks = {k: column_marks([rank_value(r.stat(k), COLUMN_BY_KEY[k]) for r in ranked], COLUMN_BY_KEY[k])
                 for k in keys}
    rows = []
    for r in table.rows:
        idx = ranked.index(r) if r in ranked else None
        cells = []
        for k in keys:
            cell = _cell(r.stat(k), k, col_marks[k][idx] if idx is not None else "")
            std = r.stat(k).std
            cell["std"] = None if std is None else f"{std:g}"  # as the paper prints it
            cells.append(cell)
        rows.append({"name": r.name, "method": r.method, "reference": r.reference, "cells": cells})
    has_std = any(r.stat(k).std is not None for r in table.rows for k in keys)
    return {"table": table.table, "label": table.label, "caption": table.caption, "runs": table.runs,
            "summary": ("mean ± std" if has_std else "mean") + f" over {table.runs} runs" if table.runs > 1 else "",
            "columns": [COLUMN_BY_KEY[k] for k in keys], "rows": rows}


def _family_view(family: BudgetFamily, src: str, slugs: dict[int, str]) -> dict:
    """A budget family for the index: its figure and its budget x method table (cells as the boards')."""
    return {
        "base": family.base, "precision": family.precision, "slug": family.slug, "src": src,
        "points": [{"name": p.board.name, "slug": slugs[id(p.board)], "factor": f"{p.factor:g}x",
                    "tflops": f"{p.tflops:.4g}"} for p in family.points],
        "rows": [{"factor": f"{p.factor:g}x", "tflops": f"{p.tflops:.4g}", "method": row.method, "color": row.color,
                  "dasharray": SVG_DASHES.get(row.dash, ""), "seeds": seeds_text(row, p.board.most_seeds),
                  "cells": [_cell(row.stats[c.key], c.key, runs=len(row.runs)) for c in CURVE_COLUMNS]}
                 for p, row in family_rows(family)],
        "apart": family.apart,
    }


def _time_to_result_rows(m: Metrics | None) -> list[dict]:
    """The run page's time-to-result rows: per session, updates and TFLOPs ("–": not reached; a TFLOPs row
    only when the run recorded FLOPs)."""
    if m is None or m.time_to_result is None:
        return []
    rows = []
    for info in (METRICS[k] for k in TIME_TO_RESULT_KEYS):
        field, divisor = info.per_session  # type: ignore[misc]  # TIME_TO_RESULT_KEYS: the metrics that have one
        values = getattr(m.time_to_result, field)
        if values is not None:
            rows.append({"key": info.key, "name": info.name, "unit": info.unit,
                         "values": [format_value(None if v is None else v / divisor, info) for v in values]})
    return rows


def _compare_rows(entry: Entry) -> list[dict]:
    """The run page's "recomputed vs. stored" rows, each in its catalog unit (min-ACC and WC-ACC in %, as in
    the Numbers table beside it)."""
    scale = accuracy_scale(entry.result)
    rows = []
    for key in ("S_delta", "P_delta", "CK_delta", "min_acc", "wc_acc"):
        info = METRICS[key]
        factor = scale if key in ACCURACY_KEYS else 1.0
        now = getattr(entry.metrics, key) if entry.metrics else None
        then = getattr(entry.result.metrics, key) if entry.result.metrics else None
        rows.append({"key": key, "symbol": info.symbol, "unit": info.unit,
                     "now": format_value(None if now is None else now * factor, info),
                     "stored": format_value(None if then is None else then * factor, info),
                     "changed": now is not None and then is not None and abs(now - then) > 5e-4})
    return rows


def check_mlflow_ui(ui: str | None) -> None:
    """``--mlflow-ui`` is an http(s) address with a host: every run page links to it, and a ``javascript:``
    or ``data:`` URL there would run in the browser of whoever opens the site."""
    if ui is None:
        return
    parts = urlsplit(ui)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise BenchError(f"--mlflow-ui {ui!r}: the MLflow UI's address is an http:// or https:// URL with a host "
                         f"(e.g. http://127.0.0.1:5000); the run pages link to it.")


def _mlflow_href(entry: Entry, ui: str | None) -> tuple[str | None, str | None]:
    """(link to the run in the MLflow UI, how to open that UI) for an entry logged to MLflow."""
    link = entry.mlflow
    if link is None:
        return None, None
    base = ui or (link.tracking_uri if link.tracking_uri.startswith(("http://", "https://")) else None)
    hint = None if base else f"mlflow ui --backend-store-uri {link.tracking_uri}"
    base = (base or "http://127.0.0.1:5000").rstrip("/")
    exp = quote(str(link.experiment_id or "0"), safe="")
    return f"{base}/#/experiments/{exp}/runs/{quote(link.run_id, safe='')}", hint


def _json_text(entry: Entry) -> str:
    """The run's JSON as stored (byte for byte when it came from a file)."""
    src = Path(entry.source)
    if src.suffix == ".json" and src.is_file():
        try:
            return src.read_text()
        except OSError:
            pass
    return entry.result.model_dump_json(indent=1)


def check_out(out: Path, results: Path | None = None) -> Path:
    """``--out`` is new, empty or an earlier leaderboard, never a results folder (``results``: the one the
    build reads), and its parent folder takes files (the site is built beside it and swapped in): checked
    before anything is read or rendered. Returns the folder the site goes to, links followed."""
    from ..harness.atomic import check_writable_folder
    from ..harness.paths import resolve_folder, results_content

    given, out = out, resolve_folder(out, "--out folder")
    if out.exists() and not out.is_dir():
        raise BenchError(f"--out {given} exists but is not a folder; pass a new or empty folder, or an earlier "
                         f"leaderboard's.")
    if results is not None:
        _apart(out, resolve_folder(results, "results folder"))
    for folder in (out, *out.parents):
        found = results_content(folder) if folder.is_dir() else None
        if found is not None:
            raise BenchError(f"--out {given} {'holds' if folder == out else 'lies inside'} a results folder "
                             f"({found}); a site is rebuilt from scratch, so it never goes where results are: "
                             f"pass a folder of its own (nothing was written).")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise BenchError(f"--out {given} is not empty and holds no earlier leaderboard; "
                         "give an empty or new folder (nothing was written).")
    check_writable_folder(out.parent, f"folder of --out (the site is built beside {out.name} and swapped in)", 0)
    return out


def _apart(out: Path, results: Path) -> None:
    """The site and the results folder it is built from are separate folders, neither inside the other."""
    how = ("is" if out == results else "lies inside" if results in out.parents
           else "contains" if out in results.parents else None)
    if how is not None:
        raise BenchError(f"--out {out} {how} the results folder {results}; a site is rebuilt from scratch, so it "
                         f"never goes where results are: pass a folder of its own (nothing was written).")


def _leftovers(out: Path) -> list[Path]:
    """Temporary folders of builds that were killed before they swapped their site in."""
    return [p for p in out.parent.glob(f".{out.name}.*{_TMP}") if p.is_dir() and (p / MARKER).exists()]


_TMP = ".leaderboard-tmp"


def _swap(new: Path, out: Path) -> None:
    """Put the finished site ``new`` at ``out``. Over an earlier site the two folders are exchanged in one
    step where the kernel can (Linux renameat2), else renamed one after the other; either way a reader
    sees the old site or the new one. Every file of the earlier site that its marker does not list (the
    user's own) is carried into the new one first, so deleting the old folder removes only files a build
    wrote."""
    from ..harness.atomic import umask

    new.chmod(0o777 & ~umask())  # mkdtemp made it private; a site is as shareable as any folder
    if not out.exists():
        new.rename(out)
        return
    _carry_unlisted(out, new)
    if not _exchange(new, out):
        aside = new.with_name(new.name[: -len(_TMP)] + "-old" + _TMP)
        out.rename(aside)
        new.rename(out)
        new = aside
    shutil.rmtree(new)


_FILES_LINE = "Files this build wrote (the only ones the next build replaces):"


def _write_marker(out: Path) -> None:
    """The site marker, listing every file of the site in ``out``: what the next build may replace."""
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    (out / MARKER).write_text("Written by `bench leaderboard build`; the folder is rebuilt from scratch each time.\n"
                              f"{_FILES_LINE}\n" + "".join(f"{f}\n" for f in files))


def _written(site: Path) -> set[str] | None:
    """The files an earlier build listed in its marker (None for a marker from before builds listed them)."""
    lines = (site / MARKER).read_text(errors="replace").splitlines()
    return set(lines[lines.index(_FILES_LINE) + 1:]) if _FILES_LINE in lines else None


def _site_shaped(rel: Path) -> bool:
    """For an unlisting marker: whether ``rel`` has the shape of a file a build writes (a top-level page, or
    a file directly inside runs/, plots/ or static/); anything else is the user's."""
    return (len(rel.parts) == 1 and rel.name in OWNED) or (len(rel.parts) == 2 and rel.parts[0] in OWNED)


def _carry_unlisted(old: Path, new: Path) -> None:
    """Copy into ``new`` every file (or link) of the earlier site ``old`` that no build wrote."""
    written = _written(old)
    for folder, dirs, files in os.walk(old):
        here = Path(folder)
        for name in dirs + files:
            src = here / name
            rel = src.relative_to(old)
            if src.is_dir() and not src.is_symlink():
                (new / rel).mkdir(exist_ok=True)
                continue
            if str(rel) == MARKER or (str(rel) in written if written is not None else _site_shaped(rel)):
                continue
            if os.path.lexists(new / rel):
                raise BenchError(f"{src} is not a file an earlier build wrote, and the new site has a file of "
                                 f"that name; move it elsewhere and build again (nothing was changed).")
            shutil.copy2(src, new / rel, follow_symlinks=False)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders atomically (Linux renameat2 with RENAME_EXCHANGE); False where unsupported."""
    import ctypes
    import os
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    return False  # e.g. a file system without exchange support: the two-rename path


def environment() -> Environment:
    env = Environment(loader=PackageLoader("bench_stability_gap.leaderboard", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True, default=str)
    env.filters["num"] = lambda v, d=3: "–" if v is None else f"{v:.{d}f}"
    env.filters["short"] = lambda h: (h or "")[:12]
    env.globals["paper_distance"] = paper_distance  # a protocol section's distance from the paper's setting
    return env


# -------------------------------------------------------------------------------------- build


def build_site(loaded: Loaded, out: Path, *, mlflow_ui: str | None = None, reported_path: Path | None = None,
               title: str = "Stability-gap leaderboard", results: Path | None = None) -> BuildReport:
    """Render the site into a temporary folder beside ``out`` and swap it in when complete: a build killed or
    failing half-way leaves the previous site (or none) at ``out``, never a partial one. ``results``: the
    results folder read, which the site never is, contains or lies inside."""
    import tempfile

    from ..harness.atomic import StorageFault, fault_message, storage_error

    t0 = time.perf_counter()
    check_mlflow_ui(mlflow_ui)
    final = check_out(Path(out), results)
    reported = load_reported(reported_path)
    assign_slugs(loaded.entries)
    boards = summarize(loaded.entries)
    for stale in _leftovers(final):
        shutil.rmtree(stale, ignore_errors=True)
    out = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=_TMP, dir=final.parent))
    try:
        pages = _render(loaded, boards, reported, out, mlflow_ui, title)
        _write_marker(out)
        _swap(out, final)
    except BaseException as exc:
        shutil.rmtree(out, ignore_errors=True)
        fault = storage_error(exc)
        if fault is None:
            raise
        kept = (f"The previous site in {final} is unchanged." if (final / MARKER).exists()
                else f"Nothing was written to {final}.")
        raise StorageFault(fault_message(fault, "the leaderboard site", fault.filename or out, kept)) from None
    return BuildReport(out=final, boards=boards, skipped=list(loaded.skipped), pages=pages,
                       seconds=time.perf_counter() - t0)


def _render(loaded: Loaded, boards: list[Board], reported: dict, out: Path, mlflow_ui: str | None,
            title: str) -> int:
    """Every page, plot and JSON copy of the site into the (empty) folder ``out``; returns the page count."""
    (out / MARKER).write_text("Written by `bench leaderboard build`; the folder is being built.\n")
    for d in ("runs", "plots", "static"):
        (out / d).mkdir()
    static = resources.files("bench_stability_gap.leaderboard") / "static"
    for item in static.iterdir():
        if item.is_file() and not item.name.startswith("."):
            (out / "static" / item.name).write_bytes(item.read_bytes())

    env = environment()
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        bench_version = metadata.version("bench-stability-gap")
    except metadata.PackageNotFoundError:
        bench_version = "unknown"
    common = {"title": title, "generated": generated, "bench_version": bench_version, "origin": loaded.origin}

    boards = sorted(boards, key=board_order)
    board_slug = {id(b): protocol_slug(b.name, i) for i, b in enumerate(boards)}
    entry_board: dict[int, Board] = {id(e): b for b in boards for e in b.entries}
    run_href = {id(e): f"runs/{e.slug}.html" for b in boards for e in b.entries}

    views = [_board_view(board, board_slug[id(board)], out, run_href, reported) for board in boards]
    several = len({b.numerics for b in boards}) > 1  # a board's machine arithmetic named where two differ
    for view in views:
        view["numerics_shown"] = several
    families = []
    for family in budget_families(boards):
        path = f"plots/budget-{family.slug}.svg"
        (out / path).write_bytes(figure_bytes(family, "svg"))
        families.append(_family_view(family, path, {id(v["board"]): v["slug"] for v in views}))
    measured = {b.name for b in boards}
    reported_only = [{"name": name, "tables": [_reported_view(t) for t in tables]}
                     for name, tables in sorted(reported.items()) if name not in measured]

    pages = 0
    index = env.get_template("index.html").render(
        **common, root="", boards=views, families=families, curve_columns=CURVE_COLUMNS,
        columns=ALL_COLUMNS, split=[c.key for c in ALL_COLUMNS].index(DEFAULT_ORDER) + 1, extra_keys=EXTRA_KEYS,
        reported_only=reported_only, skipped=loaded.skipped,
        order=COLUMN_BY_KEY[DEFAULT_ORDER], baseline=BASELINE,
        n_runs=len(loaded.entries))
    (out / "index.html").write_text(index)
    glossary = env.get_template("glossary.html").render(**common, root="", terms=TERMS, omega_note=OMEGA_NOTE,
                                                         before_note=BEFORE_NOTE, interval_note=INTERVAL_NOTE)
    (out / "glossary.html").write_text(glossary)
    pages += 2

    run_tpl = env.get_template("run.html")
    for entry in scored_entries(boards):
        board = entry_board[id(entry)]
        _write_run_page(run_tpl, common, entry, board, board_slug[id(board)], run_href, out, mlflow_ui)
        pages += 1
    return pages


def _board_view(board: Board, slug: str, out: Path, run_href: dict[int, str], reported: dict) -> dict[str, Any]:
    """One board's part of the index: its plots (written under ``out``), rows, references and runs apart."""
    plots: list[dict[str, str]] = []
    compute: list[dict[str, str]] = []
    for group, made in ((plots, board_plots(board)), (compute, compute_plots(board))):
        for stem, (plot_title, svg) in made.items():
            path = f"plots/{slug}-{stem}.svg"
            (out / path).write_text(svg)
            group.append({"src": path, "title": plot_title, "stem": stem})
    columns = board.columns(ALL_COLUMNS)  # FWT only where it can differ from 0
    return {
        "board": board, "slug": slug, "plots": plots, "compute_plots": compute, "columns": columns,
        "rows": [_row_view(r, run_href, most=board.most_seeds, columns=columns) for r in board.rows],
        "reference": _row_view(board.reference_row, run_href, reference=True, columns=columns)
        if board.reference_row else None,
        "reported": [_reported_view(t) for t in reported.get(board.name, [])],
        "joints": [{"seed": s, "entry": e, "href": run_href[id(e)]} for s, e in sorted(board.joints.items())],
        "best_new_methods": board.best_new_methods,
        "best_new": [{"seed": seed, "session": s, "value": v, "entry": board.best_new_from.get((seed, s)),
                      "href": run_href[id(board.best_new_from[(seed, s)])] if (seed, s) in board.best_new_from
                      else None}
                     for seed, sessions in sorted(board.best_new.items()) for s, v in sorted(sessions.items())],
        "unranked": [{"entry": e, "href": run_href[id(e)]} for e in board.unranked],
        "n_seeds": max((len(r.runs) for r in board.rows), default=0),
    }


def _write_run_page(run_tpl: Any, common: dict[str, Any], entry: Entry, board: Board, board_slug: str,
                    run_href: dict[int, str], out: Path, mlflow_ui: str | None) -> None:
    """One run's page, its JSON copy and its figure under ``out/runs``."""
    r = entry.result
    (out / "runs" / f"{entry.slug}.json").write_text(_json_text(entry))
    svg = run_plot(entry)
    if svg:
        (out / "runs" / f"{entry.slug}.svg").write_text(svg)
    href, hint = _mlflow_href(entry, mlflow_ui)
    # P_Δ (paper) depends on the other runs of the seed: the value the index averages, never recomputed here
    values = {**run_values(r, entry.metrics), "P_delta_paper": entry.p_delta_paper}
    m = entry.metrics or r.metrics
    recovery = ([{"p": p, "values": m.recovery_updates.get(p, [])} for p in sorted(RECOVERY_FRACTIONS, key=float)]
                if m else [])
    html = run_tpl.render(
        **common, root="../", entry=entry, r=r, board=board, board_slug=board_slug,
        values=[{"column": METRICS[k], "text": format_value(values[k], METRICS[k])} for k in VALUE_KEYS],
        compare=_compare_rows(entry), options=[(k, option_node(k, v)) for k, v in r.options.items()],
        sessions=[c.session for c in sorted(r.curves, key=lambda c: c.session)], recovery=recovery, metrics=m,
        time_to_result=_time_to_result_rows(m), plot=f"{entry.slug}.svg" if svg else None,
        json_href=f"{entry.slug}.json", mlflow_href=href, mlflow_hint=hint,
        joint_href=("../" + run_href[id(entry.joint)]) if entry.joint else None,
        stale=r.protocol.hash != board.current_hash,
    )
    (out / "runs" / f"{entry.slug}.html").write_text(html)
