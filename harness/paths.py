"""Where things go: results in the working directory, caches in the user's cache directory."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import BenchError


def results_dir(override: str | Path | None = None) -> Path:
    """Results and the MLflow store: --results-dir, else $BENCH_RESULTS_DIR, else ./bench-results."""
    return Path(override or os.environ.get("BENCH_RESULTS_DIR") or "bench-results").expanduser().resolve()


def cache_dir_path() -> Path:
    """Deployed models and trunk features, keyed by spec hash: $BENCH_CACHE_DIR, else ~/.cache/bench."""
    base = os.environ.get("BENCH_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "bench"
    return Path(base).expanduser()


def cache_dir() -> Path:
    """``cache_dir_path()``, created if needed."""
    path = cache_dir_path()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BenchError(f"The cache folder {path} cannot be created ({exc.strerror or exc}); set "
                         f"BENCH_CACHE_DIR to a writable folder.") from None
    return path
