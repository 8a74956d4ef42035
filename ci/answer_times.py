"""How long the commands that need no compute take, each against `bench --version` in the same invocation.

A shared machine's load moves every absolute time; the ratio to `bench --version` (Python's start-up and
the CLI's own import) is what this prints. Each command runs REPEATS times in a fresh process (the median
counts); a run of the stored-identical check needs a results folder holding that run, made here once
(untimed) unless --results-dir names one.

    .venv/bin/python ci/answer_times.py                         # makes tiny_cil_quick vanilla seed 0 first
    .venv/bin/python ci/answer_times.py --results-dir DIR       # DIR holds it already
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = str(REPO / ".venv" / "bin" / "bench")
STORED = ["run", "-p", "tiny_cil_quick", "-m", "vanilla", "-s", "0", "--device", "cpu", "--no-mlflow"]


def timed(args: list[str], repeats: int, want: int) -> tuple[float, str]:
    """The median wall time of ``bench ARGS`` over ``repeats`` runs, and its last output's first line; the
    exit code must be ``want``."""
    times, first = [], ""
    for _ in range(repeats):
        start = time.perf_counter()
        out = subprocess.run([BENCH, *args], capture_output=True, text=True, cwd=REPO)
        times.append(time.perf_counter() - start)
        if out.returncode != want:
            sys.exit(f"bench {' '.join(a[:40] for a in args)} exited {out.returncode}, not {want}:\n"
                     f"{out.stdout}{out.stderr}")
        first = (out.stdout + out.stderr).strip().splitlines()[0][:100] if (out.stdout + out.stderr).strip() else ""
    return statistics.median(times), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results-dir", type=Path, default=None, help="holds tiny_cil_quick vanilla seed 0")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-answers-") as tmp:
        results = args.results_dir or Path(tmp) / "results"
        if args.results_dir is None:
            print(f"making the stored run once (untimed) in {results} ...", flush=True)
            subprocess.run([BENCH, *STORED, "--no-progress", "--results-dir", str(results)], check=True,
                           capture_output=True, cwd=REPO)
        valid = Path(tmp) / "valid.yaml"
        valid.write_text((REPO / "protocols" / "tiny_cil.yaml").read_text().replace("name: tiny_cil\n",
                                                                                    "name: tiny_cil_copy\n"))
        cases = [
            ("bench --version", ["--version"], 0),
            ("bench ls methods", ["ls", "methods"], 0),
            ("bench validate (valid file)", ["validate", str(valid)], 0),
            ("bench run (stored identical run)", [*STORED, "--results-dir", str(results)], 0),
            ("bench check-method --set lr=<5,000 digits>", ["check-method", "vanilla", "--set", "lr=" + "9" * 5000],
             2),
        ]
        rows = [(name, *timed(argv, args.repeats, want)) for name, argv, want in cases]
    base = rows[0][1]
    print(f"{'command':<44} {'median s':>9} {'x --version':>12}  first line")
    for name, seconds, first in rows:
        print(f"{name:<44} {seconds:>9.2f} {seconds / base:>12.1f}  {first}")


if __name__ == "__main__":
    main()
