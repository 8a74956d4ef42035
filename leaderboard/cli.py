"""``bench leaderboard build`` and ``bench leaderboard table``: render stored results, never re-run anything."""

from __future__ import annotations

from pathlib import Path

import click

from ..harness.errors import BenchError


def _warn(message: str) -> None:
    click.secho(f"warning: {message}", err=True, fg="yellow")


_results_option = click.option(
    "--results", "results", type=click.Path(path_type=Path, file_okay=False),
    help="results folder written by `bench run` [default: $BENCH_RESULTS_DIR, else ./bench-results]")
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
def build(results: Path | None, tracking_uri: str | None, out: Path, mlflow_ui: str | None, title: str) -> None:
    """Write a self-contained static site (open OUT/index.html; no server needed)."""
    from .site import build_site, check_out
    from .sources import load

    if results is not None and tracking_uri is not None:
        raise BenchError("Give either --results DIR or --tracking-uri URI, not both.")
    check_out(out.expanduser())  # before any result is read
    loaded = load(results, tracking_uri, warn=_warn)
    report = build_site(loaded, out, mlflow_ui=mlflow_ui, title=title)
    ranked = sum(len(b.ranked_runs) for b in report.boards)
    unranked = sum(len(b.unranked) for b in report.boards)
    click.echo(f"Leaderboard: {len(report.boards)} protocol(s), {ranked} ranked run(s), {unranked} not ranked, "
               f"{len(report.skipped)} file(s) skipped; {report.pages} pages in {report.seconds:.2f} s")
    click.echo(f"Open {report.index.resolve().as_uri()}")


@leaderboard.command()
@_results_option
@_tracking_option
@click.option("--protocol", "-p", "protocols", multiple=True, help="only this protocol (repeatable)")
@click.option("--format", "fmt", type=click.Choice(["markdown", "text", "csv"]), default="markdown",
              show_default=True, help="csv: one row per run the table averages (the tidy frame), for pandas & co.")
def table(results: Path | None, tracking_uri: str | None, protocols: tuple[str, ...], fmt: str) -> None:
    """Print the leaderboard's aggregated numbers (mean ± std over seeds) as a Markdown or text table,
    or the per-run numbers behind them as CSV."""
    from .aggregate import boards_frame, format_table, summarize
    from .sources import load

    if results is not None and tracking_uri is not None:
        raise BenchError("Give either --results DIR or --tracking-uri URI, not both.")
    loaded = load(results, tracking_uri, warn=_warn)
    boards = summarize(loaded.entries)
    if protocols:
        known = {b.name for b in boards}
        missing = [p for p in protocols if p not in known]
        if missing:
            from ..harness.errors import did_you_mean

            if not known:
                raise BenchError(f"No results at all in {loaded.origin}.")
            raise did_you_mean(missing[0], known, "protocol", plural="protocols with results")
        boards = [b for b in boards if b.name in protocols]
    if not boards:
        click.echo(f"No results in {loaded.origin}.")
        return
    if fmt == "csv":
        click.echo(boards_frame(boards).to_csv(index=False), nl=False)
        return
    click.echo(format_table(boards, fmt), nl=False)
