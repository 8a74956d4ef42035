"""A stored result's metrics against their recomputation from the curves and the references stored
beside it: what ``bench validate`` checks, so a file whose numbers were edited is refused before ``bench
sync`` mirrors them as they are (the leaderboard always ranks the recomputed ones)."""

from __future__ import annotations

from pathlib import Path

from ..harness.results.schema import RunResult

COMPARED = ("S_delta", "P_delta", "CK_delta", "sigma", "mu", "alpha", "min_acc", "wc_acc")
TOLERANCE = 5e-4  # the site's "changed" mark: numbers stored rounded by an older bench still agree


def results_root(path: Path) -> Path | None:
    """The results folder a result file lies in (``<root>/runs/<protocol>/<method>/<file>``), if it does."""
    parts = path.resolve().parents
    return parts[3] if len(parts) > 3 and parts[2].name == "runs" else None


def recomputed_problem(path: Path, result: RunResult) -> str | None:
    """Which stored metric differs from its recomputation (None when all agree, or when the references to
    recompute them are not beside the file)."""
    from .aggregate import scored_entries, summarize
    from .sources import load_folder

    root = results_root(path)
    if root is None or result.metrics is None:
        return None
    loaded = load_folder(root, with_trials=True)  # a tuning trial is checked against the trials' references
    entry = next((e for e in scored_entries(summarize(loaded.entries)) if e.result.run_id == result.run_id), None)
    if entry is None or entry.metrics is None:
        return None
    for key in COMPARED:
        stored, now = getattr(result.metrics, key), getattr(entry.metrics, key)
        if (stored is None) != (now is None) or stored is not None and not abs(stored - now) <= TOLERANCE:
            return f"metrics.{key} is stored as {stored!r}, but its curves and references give {now!r}"
    return None
