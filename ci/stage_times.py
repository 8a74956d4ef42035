"""Print each stored run's stage times (wall seconds, and GPU seconds by CUDA events where measured), for
ci/gpu_checks.sh to set beside ``bench perf --paper``'s projection of the same protocol.

    python3 ci/stage_times.py RESULTS_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench_stability_gap.harness.results.schema import iter_results


def main(folder: str) -> int:
    runs = iter_results(Path(folder))
    if not runs:
        print(f"no stored runs under {folder}")
        return 1
    for _, r in runs:
        stages = ", ".join(f"{'GPU ' if gpu else ''}{name} {sec:.1f} s" for name, sec, gpu in r.stage_times())
        print(f"{r.protocol.name} {r.label} seed {r.seed}: wall {r.wall_time_s:.1f} s ({stages or 'no stage times'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
