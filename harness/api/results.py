"""The stored results: every run as a pandas frame, the leaderboard's table, and a stored run made again."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from ..errors import BenchError
from .checks import FOLDER, FOLDER_OR_NONE, check_flags, check_kinds, name_list
from .execute import quiet

if TYPE_CHECKING:
    import pandas as pd  # loaded where a frame is made: a run's request answers before pandas would load

    from ..tools.reproduce import Report

# load_results' columns besides the metrics: where the run's JSON is, and why it is not ranked (empty: ranked,
# or a joint reference in use)
LOAD_COLUMNS: tuple[str, ...] = ("path", "reason")


def results_columns() -> list[str]:
    """The columns ``load_results`` returns, also for an empty folder: the tidy per-run frame's
    (``harness.results.tidy.runs_frame``: run constants, status, every metric) plus ``LOAD_COLUMNS``."""
    from ..results.tidy import runs_frame

    return [*runs_frame([]).columns, *LOAD_COLUMNS]


def load_results(results_dir: str | Path) -> pd.DataFrame:
    """Every stored run under ``results_dir`` (``bench run``'s layout, or a folder of JSON files), one row
    each, with every metric recomputed against the current references as the leaderboard does (accuracies
    in %). A run that cannot be scored keeps its row with NaN metrics and the ``reason``; a corrupt file
    is skipped with a warning naming it. An empty folder gives an empty frame with the same columns."""
    from ...leaderboard.aggregate import entry_frame, scored_entries, summarize
    from ...leaderboard.sources import load_folder, set_trials_apart

    check_kinds(results_dir=(results_dir, FOLDER))
    warn = lambda message: warnings.warn(message, stacklevel=3)  # noqa: E731 - one line, used twice
    loaded = load_folder(Path(results_dir), warn=warn)
    set_trials_apart(loaded, Path(results_dir), warn)  # tuning trials are never scored as a board
    scored = scored_entries(summarize(loaded.entries))
    if not scored:
        import pandas as pd

        return pd.DataFrame(columns=results_columns())
    frame = entry_frame(scored)
    frame["path"] = [e.source for e in scored]
    frame["reason"] = [e.reason or "" for e in scored]
    return frame[results_columns()]


TableFormat = Literal["markdown", "text", "latex", "json", "csv"]


TABLE_FORMATS: tuple[str, ...] = get_args(TableFormat)


def table(results_dir: str | Path, protocols: Iterable[str] = (), fmt: TableFormat = "markdown",
          columns: Iterable[str] = ()) -> str:
    """The leaderboard's table of the stored runs under ``results_dir`` (``bench leaderboard table``): mean ±
    std [95 % CI] over seeds per row and board, ``protocols`` only when given; ``fmt`` markdown, text,
    latex, json or csv (the per-run numbers behind it); ``columns``: optional columns to add (``bwt``, ...)
    or, with a leading ``-``, to remove."""
    from ...leaderboard.aggregate import boards_frame, format_table, summarize, table_columns
    from ...leaderboard.cli import chosen_boards
    from ...leaderboard.sources import load_folder, set_trials_apart

    check_kinds(results_dir=(results_dir, FOLDER))
    protocols = name_list(protocols, "protocols", "['tiny_cil']")
    columns = name_list(columns, "columns", "['bwt', '-wall']")
    if fmt not in TABLE_FORMATS:  # the Literal binds the type checker only, not a notebook's caller
        raise BenchError(f"table fmt {fmt!r} is not a table format: choose one of {', '.join(TABLE_FORMATS)}.")
    chosen = table_columns(columns)  # checked for every format, csv too (its frame holds every column)
    warn = lambda message: warnings.warn(message, stacklevel=3)  # noqa: E731 - one line, used twice
    loaded = load_folder(Path(results_dir), warn=warn)
    set_trials_apart(loaded, Path(results_dir), warn)
    boards = chosen_boards(summarize(loaded.entries), protocols, loaded.origin)
    if fmt == "csv":
        return boards_frame(boards).to_csv(index=False) if boards else ""
    return format_table(boards, fmt, chosen) if boards else f"No results in {loaded.origin}.\n"


def reproduce(result: str | Path, scratch: str | Path | None = None, *, reuse_caches: bool = False,
              progress: bool = True) -> Report:
    """Make the stored run ``result`` (its JSON) again from what it records, as ``bench reproduce`` does, and
    return the report (``harness.tools.reproduce.Report``: ``identical``, ``identity``, ``point``, ``metrics``,
    ``lines()``). The scratch folder is a new temporary one unless given; caches are made afresh there unless
    ``reuse_caches``. Bad input (no such file, a spec or method code not installed here) raises ``BenchError``."""
    from ..model.compute import cpu_settings_restored
    from ..tools.reproduce import reproduce as make_again

    check_kinds(result=(result, FOLDER_OR_NONE), scratch=(scratch, FOLDER_OR_NONE))
    check_flags(reuse_caches=reuse_caches, progress=progress)
    with cpu_settings_restored():
        return make_again(Path(result), None if scratch is None else Path(scratch), reuse_caches=reuse_caches,
                          progress=progress, echo=print if progress else quiet)
