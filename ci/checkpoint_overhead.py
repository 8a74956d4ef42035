"""Benchmark (not a test): wall time of a continual run with and without checkpoints, as ratios measured in
one process (machines are shared, so only ratios taken side by side mean anything), and the checkpoint size.

    .venv/bin/python ci/checkpoint_overhead.py [PROTOCOL] [METHOD] [--reps N]

Variants, interleaved per repetition: no checkpoint; the default (every 2 minutes and at session ends);
every 10 updates. The deployed model and trunk features are prepared once, before any timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench_stability_gap.harness.run.checkpoint import Checkpointer  # noqa: E402
from bench_stability_gap.harness.run.continual import run_cl  # noqa: E402
from bench_stability_gap.harness.spec.protocol import load_protocol  # noqa: E402
from bench_stability_gap.methods.registry import build_method  # noqa: E402
from bench_stability_gap.harness.run.workbench import prepare  # noqa: E402
from bench_stability_gap.harness.run.options import RunOptions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("protocol", nargs="?", default="tiny_cil")
    parser.add_argument("method", nargs="?", default="vanilla")
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    options = RunOptions(results_dir=tmp, progress=False, log=False)
    protocol = load_protocol(args.protocol)
    bench = prepare(protocol, 0, options)
    variants = {"none": None, "default (120 s + session ends)": (None, 120.0), "every 10 updates": (10, 120.0)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    sizes: dict[str, tuple[int, int]] = {}
    for _ in range(args.reps):
        for name, how in variants.items():
            saver = None if how is None else Checkpointer(tmp / f"{len(times[name])}-{hash(name)}.pt", *how)
            _, method = build_method(args.method, protocol.name)
            t0 = time.perf_counter()
            run_cl(bench, method, 0, options, saver)
            times[name].append(time.perf_counter() - t0)
            if saver is not None:
                sizes[name] = (saver.writes, saver.bytes_written)
                saver.discard()
    base = statistics.median(times["none"])
    print(f"{args.protocol} {args.method}: median of {args.reps} run(s) per variant")
    for name, ts in times.items():
        extra = ""
        if name in sizes:
            writes, written = sizes[name]
            extra = f"  {writes} checkpoints, {written / writes / 2**20:.1f} MiB each" if writes else ""
        print(f"  {name:<32} {statistics.median(ts):7.1f} s   ratio {statistics.median(ts) / base:.3f}{extra}")


if __name__ == "__main__":
    main()
