"""The first line of ``bench run``: what the run is about to do and how long it will likely take, said
before anything heavy is imported (torch and the checks that need it take tens of seconds on a loaded
machine, and a silent terminal reads as a hung one). Torch-free: the protocol's spec and the wall times
of the runs stored in the results folder are all it reads."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..progress_bar import duration
from ..spec.protocol import Protocol

STORED_LOOKED_AT = 200  # result files read at most: the line must come at once, whatever the folder holds


def stored_wall_times(results_dir: Path, protocol: str) -> list[float]:
    """Wall times (s) of the complete method runs of ``protocol`` stored under ``results_dir`` (joint
    references left out: their time is a reference's, not a run's); unreadable files are skipped, as the
    run's own checks name them later."""
    runs = results_dir / "runs"
    if not runs.is_dir():
        return []
    times = []
    for i, path in enumerate(sorted(runs.rglob("*.json"))):
        if i >= STORED_LOOKED_AT:
            break
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if (data["protocol"]["name"] == protocol and data.get("status", "complete") == "complete"
                    and data["method"]["spec"] != "joint"):
                times.append(float(data["wall_time_s"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return times


def plan_line(protocol: Protocol, method: str, seed: int, results_dir: Path) -> str:
    """``bench run: vanilla on tiny_cil_quick, seed 0: 4 sessions of 30 updates (batch 32); likely about
    1m30s (the median of 3 runs of this protocol stored here) ...``."""
    t = protocol.training
    updates = f"{t.updates} updates" if isinstance(t.updates, int) else (
        "one update per arriving sample" if t.updates == "per_sample" else "updates within a FLOP budget")
    what = (f"bench run: {method} on {protocol.name}, seed {seed}: {protocol.sessions} sessions of {updates} "
            f"(batch {t.batch.size})")
    times = stored_wall_times(results_dir, protocol.name)
    if times:
        likely = (f"likely about {duration(statistics.median(times))} (the median of {len(times)} run(s) of this "
                  f"protocol stored in {results_dir}), more when the deployed model and the references are "
                  f"not made yet")
    else:
        likely = (f"no run of this protocol is stored in {results_dir} to time it by"
                  + (f"; the protocol says: {protocol.description}" if protocol.description else ""))
    return f"{what}; {likely}. Checking the request first."
