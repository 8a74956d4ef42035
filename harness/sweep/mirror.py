"""The one MLflow mirror of a stored result, for every path that mirrors one: a run's live record when it
ends, the reference runs it trained on the way, a local sweep's shared stages, a Ray task or its driver,
and ``bench sync``. Each record gets the same tags (``tracking._tags``: the reference role among them,
read from the result) and the same artifacts (the JSON, ``curves.csv`` and the run's plot ``curves.svg``),
so what MLflow shows of a run never depends on which path stored it; ``bench sync`` adds what an older
record lacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..results.schema import RunResult
from ..results.store_read import has_whole_record
from ..results.tracking import (
    Artifacts,
    LiveRun,
    SyncReport,
    default_tracking_uri,
    log_run_or_explain,
    mirror_missing,
)
from ..results.tracking import sync as sync_store

if TYPE_CHECKING:
    from ..spec.protocol import Protocol


def run_plot_svg(result: RunResult) -> str | None:
    """The run's plot as the leaderboard draws it on the run's page (None for a run without curves)."""
    from ...leaderboard.aggregate import Entry
    from ...leaderboard.plots import run_plot

    return (run_plot(Entry(result, source="")) or None) if result.curves else None


# the files MLflow gets beside a run's JSON and curves.csv
RUN_ARTIFACTS: Artifacts = {"curves.svg": run_plot_svg}


def mirror(result: RunResult, path: Path, results_dir: Path, tracking_uri: str | None = None,
           protocol: Protocol | None = None) -> tuple[str, str]:
    """Log a stored result as one whole MLflow record; returns (MLflow run id, store URI). A failure says
    what is kept and how to mirror it later (``bench sync``). ``protocol``: the run's spec, when known."""
    return log_run_or_explain(result, path, results_dir, tracking_uri, artifacts=RUN_ARTIFACTS, protocol=protocol)


def mirror_stored(result: RunResult, path: Path, results_dir: Path, tracking_uri: str | None = None,
                  protocol: Protocol | None = None) -> str | None:
    """The record of a stored result a rerun found, made when the store lacks a complete one (the first run
    had no MLflow, or was stopped while it logged); returns the new MLflow run id, None when it was there."""
    uri = tracking_uri or default_tracking_uri(results_dir)
    if has_whole_record(uri, result.protocol.name, result.run_id):  # read with sqlite3: no MLflow to load
        return None
    return mirror_missing(result, path, results_dir, tracking_uri, artifacts=RUN_ARTIFACTS, protocol=protocol)


def finish_live(live: LiveRun, result: RunResult, path: Path) -> str | None:
    """Close a live record with the stored result: the same tags and artifacts as ``mirror`` gives."""
    return live.finish(result.status, result, path, artifacts=RUN_ARTIFACTS)


def sync(results_dir: Path, tracking_uri: str | None = None) -> SyncReport:
    """``bench sync``: mirror what the store lacks, and add to mirrored records the tags and artifacts
    ``mirror`` gives and they lack."""
    return sync_store(results_dir, tracking_uri, artifacts=RUN_ARTIFACTS)
