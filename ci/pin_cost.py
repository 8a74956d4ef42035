"""What the CPU pins cost in speed: ``bench perf`` with BENCH_CPU_PINS=off, on and portable, interleaved in one
invocation (the pins are read when torch loads, so each setting runs in its own process), and the ratio of
the medians of the harness's update time and cached-trunk evaluation time to the unpinned ones.

    python ci/pin_cost.py [-p tiny_cil] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(sys.executable).with_name("bench")
MODES = ("off", "on", "portable")


def measure(protocol: str, mode: str) -> tuple[float, float]:
    """(ms per harness update, seconds of the cached-trunk evaluation) of one ``bench perf`` under ``mode``."""
    out = subprocess.run([str(BENCH), "perf", "-p", protocol, "--device", "cpu", "--repeats", "3", "--updates", "10"],
                         capture_output=True, text=True, env={**os.environ, "BENCH_CPU_PINS": mode}, check=True).stdout
    update = re.search(r"harness update\s+[\d.]+ images/s\s+([\d.]+) ms/update", out)
    evaluation = re.search(r"^\s+cached trunk\s+[\d.]+ images/s\s+([\d.]+) s", out, re.M)
    if update is None or evaluation is None:
        raise SystemExit(f"bench perf printed no timing to read:\n{out}")
    return float(update.group(1)), float(evaluation.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", "--protocol", default="tiny_cil")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            times[mode].append(measure(args.protocol, mode))
    base = [statistics.median(t[k] for t in times["off"]) for k in (0, 1)]
    print(f"pin cost on {args.protocol}, {args.rounds} round(s) interleaved, medians; load {os.getloadavg()[0]:.1f}")
    for mode in MODES:
        update, evaluation = (statistics.median(t[k] for t in times[mode]) for k in (0, 1))
        print(f"  BENCH_CPU_PINS={mode:<9} update {update:8.2f} ms ({update / base[0]:.2f}x)   "
              f"cached eval {evaluation:6.3f} s ({evaluation / base[1]:.2f}x)")


if __name__ == "__main__":
    main()
