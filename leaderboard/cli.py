"""``bench leaderboard build`` and ``bench leaderboard table``: render stored results, never re-run anything."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from ..harness.errors import BenchError

if TYPE_CHECKING:
    from .aggregate import Board


def _warn(message: str) -> None:
    click.secho(f"warning: {message}", err=True, fg="yellow")


ALIAS_KEY = "bench.results_alias"


def results_dir_option(help: str, envvar: str | None = None) -> Callable[[Callable], Callable]:
    """``--results-dir DIR``, the name every command gives the results folder, with ``--results`` (the
    old name of ``sync`` and ``leaderboard``) kept as a deprecated alias that warns."""

    def alias(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
        if value is not None:
            _warn("--results is deprecated; use --results-dir (the name every bench command takes).")
            ctx.meta[ALIAS_KEY] = value

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def command(*args: Any, results_dir: Path | None = None, **kwargs: Any) -> Any:
            old = click.get_current_context().meta.get(ALIAS_KEY)
            if old is not None and results_dir is not None and old != results_dir:
                raise BenchError(f"--results {old} and --results-dir {results_dir} name two folders; --results "
                                 f"is the old name of --results-dir: give one.")
            return f(*args, results_dir=results_dir if results_dir is not None else old, **kwargs)

        command = click.option("--results", type=click.Path(path_type=Path, file_okay=False), hidden=True,
                               expose_value=False, callback=alias)(command)
        return click.option("--results-dir", "results_dir", type=click.Path(path_type=Path, file_okay=False),
                            envvar=envvar, help=help)(command)

    return decorate


_results_option = results_dir_option(
    "results folder written by `bench run` [default: $BENCH_RESULTS_DIR, else ./bench-results]")
_tracking_option = click.option(
    "--tracking-uri", "tracking_uri", default=None,
    help="read the RunResult JSON artifacts of an MLflow store instead of a folder")


@click.group()
def leaderboard() -> None:
    """Build the static leaderboard site, or print its tables, from stored results."""


@leaderboard.command()
@_results_option
@_tracking_option
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="folder to write the site into")
@click.option("--mlflow-ui", "mlflow_ui", default=None, metavar="URL",
              help="base URL of an MLflow UI for the per-run links [default: the tracking URI if it is http(s), "
                   "else http://127.0.0.1:5000]")
@click.option("--title", default="Stability-gap leaderboard", show_default=True)
def build(results_dir: Path | None, tracking_uri: str | None, out: Path, mlflow_ui: str | None, title: str) -> None:
    """Write a self-contained static site (open OUT/index.html; no server needed)."""
    from .site import build_site, check_mlflow_ui, check_out
    from .sources import load

    if results_dir is not None and tracking_uri is not None:
        raise BenchError("Give either --results-dir DIR or --tracking-uri URI, not both.")
    check_mlflow_ui(mlflow_ui)
    results = _results_folder(results_dir, tracking_uri)
    check_out(out, results)  # before any result is read
    loaded = load(results_dir, tracking_uri, warn=_warn)
    report = build_site(loaded, out, mlflow_ui=mlflow_ui, title=title, results=results)
    ranked = sum(len(b.ranked_runs) for b in report.boards)
    unranked = sum(len(b.unranked) for b in report.boards)
    click.echo(f"Leaderboard: {len(report.boards)} protocol(s), {ranked} ranked run(s), {unranked} not ranked, "
               f"{len(report.skipped)} file(s) skipped; {report.pages} pages in {report.seconds:.2f} s")
    click.echo(f"Open {report.index.resolve().as_uri()}")


def _results_folder(results_dir: Path | None, tracking_uri: str | None) -> Path | None:
    """The folder the results are read from (an sqlite store's folder for --tracking-uri sqlite:///...)."""
    from ..harness.paths import results_dir_given

    if tracking_uri is None:
        return results_dir_given(results_dir)
    return Path(tracking_uri[len("sqlite:///"):]).parent if tracking_uri.startswith("sqlite:///") else None


@leaderboard.command()
@_results_option
@_tracking_option
@click.option("--protocol", "-p", "protocols", multiple=True, help="only this protocol (repeatable)")
@click.option("--format", "fmt", type=click.Choice(["markdown", "text", "csv", "latex", "json"]), default="markdown",
              show_default=True, help="csv: one row per run the table averages (the tidy frame), for pandas & co.; "
                                      "latex: booktabs, best bold, second underlined; json: every number of the table")
@click.option("--columns", "extra", default=None, metavar="KEYS",
              help="comma-separated: optional columns to add (acc, avg_acc, forgetting, bwt, fwt, or 'all'), and any "
                   "column to remove with a leading - (e.g. -wall,-tflops)")
def table(results_dir: Path | None, tracking_uri: str | None, protocols: tuple[str, ...],
          fmt: Literal["markdown", "text", "csv", "latex", "json"], extra: str | None) -> None:
    """Print the leaderboard's aggregated numbers (mean ± std [95 % Student-t CI] over seeds, the paired
    difference with vanilla) as a Markdown, text, LaTeX or JSON table, or the per-run numbers behind them as CSV."""
    from .aggregate import boards_frame, format_table, summarize, table_columns
    from .sources import load

    keys = [k.strip() for k in (extra or "").split(",") if k.strip()]
    if extra is not None and not keys:  # given but blank: a mistake, not a request for the standard columns
        raise BenchError(f"--columns {extra!r} names no column: give comma-separated keys, e.g. bwt,fwt or -wall.")
    columns = table_columns(keys)
    if results_dir is not None and tracking_uri is not None:
        raise BenchError("Give either --results-dir DIR or --tracking-uri URI, not both.")
    loaded = load(results_dir, tracking_uri, warn=_warn)
    boards = chosen_boards(summarize(loaded.entries), protocols, loaded.origin)
    if not boards:
        click.echo(f"No results in {loaded.origin}.")
        return
    if fmt == "csv":
        click.echo(boards_frame(boards).to_csv(index=False), nl=False)
        return
    click.echo(format_table(boards, fmt, columns), nl=False)


def chosen_boards(boards: list[Board], protocols: tuple[str, ...], origin: str) -> list[Board]:
    """The boards of ``protocols`` (all when none is given); a protocol without results is a BenchError
    naming the ones with results."""
    if not protocols:
        return boards
    known = {b.name for b in boards}
    missing = [p for p in protocols if p not in known]
    if missing:
        from ..harness.errors import did_you_mean

        if not known:
            raise BenchError(f"No results at all in {origin}.")
        raise did_you_mean(missing[0], known, "protocol", plural="protocols with results")
    return [b for b in boards if b.name in protocols]


FIGURE_FORMATS = ("png", "svg", "pdf")


@leaderboard.command("budget-curve")
@_results_option
@_tracking_option
@click.option("--family", "family", default=None, metavar="BASE",
              help="the family's base protocol (BASE of the BASE@<k>x protocols); needed when the results hold several")
@click.option("--out", "out", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="write the figure to this file (.png, .svg or .pdf)")
@click.option("--format", "fmt", type=click.Choice(["markdown", "text"]), default="markdown", show_default=True,
              help="the printed table's format")
def budget_curve(results_dir: Path | None, tracking_uri: str | None, family: str | None, out: Path | None,
                 fmt: Literal["markdown", "text"]) -> None:
    """Print a budget family's table (each budget x method: S_Δ, P_Δ, CK_Δ and α, mean ± std over seeds) and,
    with --out, write its figure (the gaps against the training TFLOPs per session, log scale)."""
    from ..harness.atomic import atomic_write
    from ..harness.errors import did_you_mean
    from ..harness.paths import check_output_file
    from .aggregate import summarize
    from .budget_curve import budget_families, figure_bytes, format_family_table
    from .sources import load

    if results_dir is not None and tracking_uri is not None:
        raise BenchError("Give either --results-dir DIR or --tracking-uri URI, not both.")
    if out is not None:  # before any result is read
        out = out.expanduser()
        if out.suffix.lower().lstrip(".") not in FIGURE_FORMATS:
            raise BenchError(f"--out {out}: the figure is written as PNG, SVG or PDF, named by its suffix "
                             f"(.png, .svg, .pdf); {out.suffix or 'no suffix'} is none of them.")
        out = check_output_file(out, "--out", results_dir)
    loaded = load(results_dir, tracking_uri, warn=_warn)
    families = budget_families(summarize(loaded.entries))
    if not families:
        raise BenchError(f"No budget family in {loaded.origin}: a family is the results of protocols named "
                         f"BASE@<k>x (BASE with its FLOP budget scaled by k), e.g. "
                         f"`bench run -p tiny_cil_flops@0.5x -m vanilla`.")
    bases = sorted({f.base for f in families})
    if family is None and len(bases) > 1:
        raise BenchError(f"The results hold {len(bases)} budget families ({', '.join(bases)}); name one with --family.")
    if family is not None and family not in bases:
        raise did_you_mean(family, bases, "budget family", plural="budget families with results")
    chosen = [f for f in families if f.base == (family or bases[0])]
    if not any(f.points for f in chosen):  # before anything is written: an empty figure says nothing
        why = "; ".join(f"{name}: {reason}" for f in chosen for name, reason in f.apart) or "no budgets"
        raise BenchError(f"Budget family {chosen[0].base} has no ranked budget to draw ({why}). Rank at least "
                         f"one budget (its runs and its joint reference per seed, e.g. `bench leaderboard table` "
                         f"names what each run lacks), then draw the curve.")
    for i, fam in enumerate(chosen):
        click.echo(("\n" if i else "") + format_family_table(fam, fmt), nl=False)
        if out is None:
            continue
        path = out if len(chosen) == 1 else out.with_stem(f"{out.stem}-{fam.precision}")
        data = figure_bytes(fam, path.suffix.lower().lstrip("."))
        atomic_write(path, lambda fh: fh.write(data), what=f"the budget-curve figure of {fam.base}")
        click.echo(f"Wrote {path}", err=True)
