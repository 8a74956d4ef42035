"""Where things go: results in the working directory, caches in the user's cache directory."""

from __future__ import annotations

import os
from pathlib import Path


def results_dir(override: str | Path | None = None) -> Path:
    """Results and the MLflow store: --results-dir, else $BENCH_RESULTS_DIR, else ./bench-results."""
    return Path(override or os.environ.get("BENCH_RESULTS_DIR") or "bench-results").expanduser().resolve()


def cache_dir() -> Path:
    """Deployed models and trunk features, keyed by spec hash: $BENCH_CACHE_DIR, else ~/.cache/bench."""
    base = os.environ.get("BENCH_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "bench"
    path = Path(base).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path
