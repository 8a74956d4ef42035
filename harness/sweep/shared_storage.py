"""Is the results folder (and the cache) the same storage on every worker? Checked before any training.

A distributed sweep writes each run's JSON from the worker that ran it, and every run reads the deployed
model and trunk features its protocol's first stage cached. A worker with its own private folder at the
same path would train, write results nobody reads, and rebuild caches: hours lost, silently. So the
driver leaves a probe file with a fresh token in each folder, and a check on every node must read it
back and be able to write there.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from ..errors import BenchError

PROBE = ".bench-shared-probe-{token}"


def write_probes(folders: dict[str, Path]) -> str:
    """A probe file with a fresh token in each folder; returns the token."""
    token = secrets.token_hex(8)
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / PROBE.format(token=token)).write_text(token)
    return token


def remove_probes(folders: dict[str, Path], token: str) -> None:
    for folder in folders.values():
        (folder / PROBE.format(token=token)).unlink(missing_ok=True)


def probe_problems(folders: dict[str, Path], token: str) -> list[str]:
    """Run on a worker node: what it cannot see or write, one line per folder ([] when all is well)."""
    problems = []
    for what, folder in folders.items():
        probe = folder / PROBE.format(token=token)
        try:
            seen = probe.read_text()
        except OSError as exc:
            problems.append(f"{what} {folder}: the driver's probe file is not visible here ({exc.strerror})")
            continue
        if seen != token:
            problems.append(f"{what} {folder}: the probe file holds another token (a different folder)")
            continue
        mine = folder / f"{probe.name}-{os.getpid()}"
        try:
            mine.write_text(token)
            mine.unlink()
        except OSError as exc:
            problems.append(f"{what} {folder}: not writable here ({exc.strerror})")
    return problems


def shared_storage_error(problems: dict[str, list[str]]) -> BenchError:
    """One paragraph naming each node and folder that failed the check."""
    lines = "; ".join(f"node {node}: {', '.join(p)}" for node, p in sorted(problems.items()))
    return BenchError(
        f"Not every Ray node sees the sweep's folders ({lines}). Each run writes its JSON result to the "
        f"results folder from the worker that ran it, and reads the deployed model and trunk features from "
        f"the cache folder, so both must be the same shared storage (NFS, a cluster file system, a volume "
        f"mounted at the same path) on every node: point --results-dir and $BENCH_CACHE_DIR at such a "
        f"folder. Nothing was trained."
    )
