"""Render the static leaderboard: HTML (Jinja2, autoescaped), hand-written SVG plots, run JSON copies.

The site is self-contained: relative links only, no server, no CDN; it works from file:// and from
any static host. JavaScript only adds sorting and the family filter; everything reads without it.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata, resources
from pathlib import Path
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined

from ..harness.errors import BenchError
from ..harness.results.catalog import METRICS, TIME_TO_RESULT_KEYS, format_std, format_value
from ..harness.results.metrics import RECOVERY_FRACTIONS, Metrics
from ..harness.results.tidy import VALUE_KEYS, run_values

from .aggregate import (ALL_COLUMNS, BASELINE, COLUMN_BY_KEY, DEFAULT_ORDER, Board, Entry, MethodRow, Reached, Stat,
                        assign_slugs, column_marks, paired_text, rank_value, seeds_text, summarize)
from .budget_curve import CURVE_COLUMNS, BudgetFamily, budget_families, family_rows, figure_bytes
from .glossary import OMEGA_NOTE, TERMS
from .plots import board_plots, compute_plots, run_plot
from .reported import ReportedTable, load_reported
from .sources import Loaded
from ..methods.metadata import method_family, method_papers

MARKER = ".bench-leaderboard"
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


def protocol_slug(name: str, i: int) -> str:
    return name if _SLUG.match(name) else f"protocol-{i}"


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
            "optional": column.optional, "value": "" if value is None else repr(value),
            "partial": f"{stat.n} of {runs} runs" if 0 < stat.n < runs and reached is None else None, "note": note,
            "reached": None if reached is None else reached.text}


SVG_DASHES = {"dashed": "6 3", "dotted": "1.5 2.5", "dashdot": "6 2 1.5 2"}  # the plots' line styles, for the swatch


def _row_view(row: MethodRow, run_href: dict[int, str], reference: bool = False, most: int = 0) -> dict:
    order = COLUMN_BY_KEY[DEFAULT_ORDER]
    paired = row.paired.get(order.key)
    return {
        "method": row.method, "family": row.family, "color": row.color, "dasharray": SVG_DASHES.get(row.dash, ""),
        "reference": reference, "effort": row.effort, "partial": row.partial, "most": most,
        "n": len(row.runs), "distribution": row.distribution,
        "group": method_family(row.method.split(" ")[0]),
        "papers": [{"name": n, "cite": c, "url": u} for n, c, u in method_papers(row.method.split(" ")[0])],
        "runs": [{"seed": e.result.seed, "href": run_href[id(e)]} for e in row.runs],
        "cells": [_cell(row.stats[c.key], c.key, "" if reference else row.marks.get(c.key, ""), len(row.runs),
                        row.params_reading if c.key == "params" else None, row.reached.get(c.key))
                  for c in ALL_COLUMNS],
        "paired": None if reference or row.method == BASELINE else {
            "text": paired_text(paired, order, len(row.runs)), "inconclusive": paired is None or paired.inconclusive},
    }


def _reported_view(table: ReportedTable) -> dict:
    keys = table.columns
    ranked = [r for r in table.rows if not r.reference]
    col_marks = {k: column_marks([rank_value(r.stat(k), COLUMN_BY_KEY[k]) for r in ranked], COLUMN_BY_KEY[k]) for k in keys}
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
        field, divisor = info.per_session  # type: ignore[misc]
        values = getattr(m.time_to_result, field)
        if values is not None:
            rows.append({"key": info.key, "name": info.name, "unit": info.unit,
                         "values": [format_value(None if v is None else v / divisor, info) for v in values]})
    return rows


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


def check_out(out: Path) -> None:
    """``--out`` is new, empty or an earlier leaderboard, and its parent folder takes files (the site is
    built beside it and swapped in): checked before anything is read or rendered."""
    from ..harness.atomic import check_writable_folder

    if out.exists() and not out.is_dir():
        raise BenchError(f"--out {out} exists but is not a folder; pass a new or empty folder, or an earlier "
                         f"leaderboard's.")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise BenchError(f"--out {out} is not empty and holds no earlier leaderboard; "
                         "give an empty or new folder (nothing was written).")
    check_writable_folder(out.parent, f"folder of --out (the site is built beside {out.name} and swapped in)", 0)


def _leftovers(out: Path) -> list[Path]:
    """Temporary folders of builds that were killed before they swapped their site in."""
    return [p for p in out.parent.glob(f".{out.name}.*{_TMP}") if p.is_dir() and (p / MARKER).exists()]


_TMP = ".leaderboard-tmp"


def _swap(new: Path, out: Path) -> None:
    """Put the finished site ``new`` at ``out``. Over an earlier site the two folders are exchanged in one
    step where the kernel can (Linux renameat2), else renamed one after the other; either way a reader
    sees the old site or the new one, and the old one is deleted only after the swap."""
    from ..harness.atomic import umask

    new.chmod(0o777 & ~umask())  # mkdtemp made it private; a site is as shareable as any folder
    if not out.exists():
        new.rename(out)
        return
    for name in (p.name for p in out.iterdir() if p.name not in OWNED and p.name != MARKER):
        src = out / name  # the user's own files beside an earlier site stay with the site
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, new / name)
    if not _exchange(new, out):
        aside = new.with_name(new.name[: -len(_TMP)] + "-old" + _TMP)
        out.rename(aside)
        new.rename(out)
        new = aside
    shutil.rmtree(new)


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
    return env


# -------------------------------------------------------------------------------------- build


def build_site(loaded: Loaded, out: Path, *, mlflow_ui: str | None = None, reported_path: Path | None = None,
               title: str = "Stability-gap leaderboard") -> BuildReport:
    """Render the site into a temporary folder beside ``out`` and swap it in when complete: a build killed or
    failing half-way leaves the previous site (or none) at ``out``, never a partial one."""
    import tempfile

    from ..harness.atomic import StorageFault, fault_message, storage_error

    t0 = time.perf_counter()
    final = Path(out).expanduser()
    check_out(final)
    reported = load_reported(reported_path)
    assign_slugs(loaded.entries)
    boards = summarize(loaded.entries)
    for stale in _leftovers(final):
        shutil.rmtree(stale, ignore_errors=True)
    out = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=_TMP, dir=final.parent))
    try:
        pages = _render(loaded, boards, reported, out, mlflow_ui, title)
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
    (out / MARKER).write_text("Written by `bench leaderboard build`; the folder is rebuilt from scratch each time.\n")
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

    board_slug = {id(b): protocol_slug(b.name, i) for i, b in enumerate(boards)}
    entry_board: dict[int, Board] = {id(e): b for b in boards for e in b.entries}
    run_href = {id(e): f"runs/{e.slug}.html" for e in loaded.entries}

    views = []
    for board in boards:
        slug = board_slug[id(board)]
        plots, compute = [], []
        for group, made in ((plots, board_plots(board)), (compute, compute_plots(board))):
            for stem, (plot_title, svg) in made.items():
                path = f"plots/{slug}-{stem}.svg"
                (out / path).write_text(svg)
                group.append({"src": path, "title": plot_title, "stem": stem})
        views.append({
            "board": board, "slug": slug, "plots": plots, "compute_plots": compute,
            "rows": [_row_view(r, run_href, most=board.most_seeds) for r in board.rows],
            "reference": _row_view(board.reference_row, run_href, reference=True) if board.reference_row else None,
            "reported": [_reported_view(t) for t in reported.get(board.name, [])],
            "joints": [{"seed": s, "entry": e, "href": run_href[id(e)]} for s, e in sorted(board.joints.items())],
            "best_new_methods": board.best_new_methods,
            "best_new": [{"seed": seed, "session": s, "value": v, "entry": board.best_new_from.get((seed, s)),
                          "href": run_href[id(board.best_new_from[(seed, s)])] if (seed, s) in board.best_new_from
                          else None}
                         for seed, sessions in sorted(board.best_new.items()) for s, v in sorted(sessions.items())],
            "unranked": [{"entry": e, "href": run_href[id(e)]} for e in board.unranked],
            "n_seeds": max((len(r.runs) for r in board.rows), default=0),
        })
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
        columns=ALL_COLUMNS, reported_only=reported_only, skipped=loaded.skipped,
        order=COLUMN_BY_KEY[DEFAULT_ORDER], baseline=BASELINE,
        n_runs=len(loaded.entries))
    (out / "index.html").write_text(index)
    (out / "glossary.html").write_text(env.get_template("glossary.html").render(**common, root="", terms=TERMS, omega_note=OMEGA_NOTE))
    pages += 2

    run_tpl = env.get_template("run.html")
    for entry in loaded.entries:
        board = entry_board[id(entry)]
        r = entry.result
        (out / "runs" / f"{entry.slug}.json").write_text(_json_text(entry))
        svg = run_plot(entry)
        if svg:
            (out / "runs" / f"{entry.slug}.svg").write_text(svg)
        href, hint = _mlflow_href(entry, mlflow_ui)
        # P_Δ (paper) depends on the other runs of the seed: the value the index averages, never recomputed here
        values = {**run_values(r, entry.metrics), "P_delta_paper": entry.p_delta_paper}
        stored = r.metrics
        compare = []
        for key in ("S_delta", "P_delta", "CK_delta", "min_acc", "wc_acc"):
            now = getattr(entry.metrics, key) if entry.metrics else None
            then = getattr(stored, key) if stored else None
            compare.append({"key": key, "symbol": METRICS[key].symbol, "now": now, "stored": then,
                            "changed": now is not None and then is not None and abs(now - then) > 5e-4})
        sessions = [c.session for c in sorted(r.curves, key=lambda c: c.session)]
        m = entry.metrics or stored
        recovery = ([{"p": p, "values": m.recovery_updates.get(p, [])} for p in sorted(RECOVERY_FRACTIONS, key=float)]
                    if m else [])
        html = run_tpl.render(
            **common, root="../", entry=entry, r=r, board=board, board_slug=board_slug[id(board)],
            values=[{"column": METRICS[k], "text": format_value(values[k], METRICS[k])} for k in VALUE_KEYS],
            compare=compare, sessions=sessions, recovery=recovery, metrics=m, time_to_result=_time_to_result_rows(m),
            plot=f"{entry.slug}.svg" if svg else None, json_href=f"{entry.slug}.json",
            mlflow_href=href, mlflow_hint=hint,
            joint_href=("../" + run_href[id(entry.joint)]) if entry.joint else None,
            stale=r.protocol.hash != board.current_hash,
        )
        (out / "runs" / f"{entry.slug}.html").write_text(html)
        pages += 1
    return pages
