"""The map from tiny_cil to laptop_table1: SGM's effect on the gaps at each step, as a figure and a table.

    python ci/map_figure.py --results-dir R [--out docs/figures/map-tiny-to-table1.png] [--metrics S_delta,CK_delta]

Each step is a protocol that moves one factor from tiny_cil to laptop_table1's value (sweep
map_tiny_to_table1); the last is laptop_table1 itself (sweep laptop_table1). At each, the effect is
vanilla+sgm − vanilla on the seeds both have (same seed: same class order and data), with its paired-t 95 %
interval, computed as the leaderboard computes it (metrics recomputed against the stored references). Only
runs at published settings count. A step with one seed has no interval and is drawn hollow; a step with no
pair is left out of the figure and named in the table.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
import pandas as pd  # noqa: E402

from bench_stability_gap.harness.api import load_results  # noqa: E402
from bench_stability_gap.harness.results.uncertainty import Paired, paired_difference  # noqa: E402

# (protocol, the step's label): tiny_cil, one factor moved at a time, then every factor moved
STEPS: tuple[tuple[str, str], ...] = (
    ("tiny_cil", "tiny_cil"),
    ("tiny_cil_u600", "600 updates"),
    ("tiny_cil_b128", "batch 64+64"),
    ("tiny_cil_lite2", "Lite2 backbone"),
    ("tiny_cil_fmnist60k", "pre-training\n60k images"),
    ("laptop_table1", "laptop_table1\n(all moved)"),
)
BASE, TREATED = "vanilla", "vanilla+sgm"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "figures" / "map-tiny-to-table1.png"


@dataclass(frozen=True)
class Step:
    protocol: str
    label: str
    effects: dict[str, Paired | None]  # metric -> SGM − vanilla


def published_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """The runs of the two methods at their published settings that were scored, one per protocol, method
    and seed; a second run of the same cell (another precision or kernel set) is refused, not averaged."""
    runs = frame[frame["method"].isin([BASE, TREATED]) & (frame["settings"] == "defaults")
                 & (frame["reason"] == "")]
    doubled = runs[runs.duplicated(["protocol", "method", "seed"], keep=False)]
    if not doubled.empty:
        cells = sorted({f"{r.protocol} {r.method} seed {r.seed}" for r in doubled.itertuples()})
        raise SystemExit(f"more than one stored run of {', '.join(cells)}: keep one identity per folder")
    return runs


def effects(runs: pd.DataFrame, metrics: Sequence[str]) -> list[Step]:
    """Each step's SGM − vanilla on each metric, paired by seed."""
    steps = []
    for protocol, label in STEPS:
        mine = runs[runs["protocol"] == protocol]
        by_method = {m: mine[mine["method"] == m].set_index("seed") for m in (BASE, TREATED)}
        found: dict[str, Paired | None] = {}
        for metric in metrics:
            treated = {int(s): float(v) for s, v in by_method[TREATED][metric].items()}
            base = {int(s): float(v) for s, v in by_method[BASE][metric].items()}
            found[metric] = paired_difference(treated, base)
        steps.append(Step(protocol, label, found))
    return steps


def table(steps: Sequence[Step], metrics: Sequence[str]) -> str:
    """Markdown: each step's effect per metric, its interval, the seeds it pairs, and the test's p."""
    head = "| step | protocol | " + " | ".join(f"Δ{m} (SGM − vanilla) [95 % CI]" for m in metrics) + " | seeds |"
    lines = [head, "|---|---|" + "---:|" * len(metrics) + "---|"]
    for step in steps:
        cells, seeds = [], "none"
        for metric in metrics:
            e = step.effects[metric]
            if e is None:
                cells.append("no pair")
                continue
            seeds = ",".join(map(str, e.seeds))
            ci = f" [{e.interval.low:+.3f}, {e.interval.high:+.3f}]" if e.interval else " (one seed: no interval)"
            p = f", p {e.p:.3f}" if e.p is not None else ""
            cells.append(f"{e.mean:+.3f}{ci}{p}")
        label = step.label.replace("\n", " ")
        lines.append(f"| {label} | `{step.protocol}` | " + " | ".join(cells) + f" | {seeds} |")
    return "\n".join(lines)


def figure(steps: Sequence[Step], metrics: Sequence[str], out: Path) -> None:
    """One panel per metric: the effect at each step with its interval; zero (no effect) as a line."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for x, step in enumerate(steps):
            e = step.effects[metric]
            if e is None:
                continue
            if e.interval is not None:
                ax.errorbar(x, e.mean, yerr=[[e.mean - e.interval.low], [e.interval.high - e.mean]], fmt="o",
                            color="C0", capsize=4)
            else:
                ax.plot(x, e.mean, "o", markerfacecolor="white", color="C0")
            ax.annotate(f"n={len(e.seeds)}", (x, e.mean), textcoords="offset points", xytext=(6, 4), fontsize=7)
        ax.axhline(0.0, color="0.5", linewidth=0.8)
        ax.set_xticks(range(len(steps)), [s.label for s in steps], rotation=35, ha="right", fontsize=8)
        ax.set_xlim(-0.5, len(steps) - 0.5)
        ax.set_ylabel(f"{metric}: vanilla+sgm − vanilla")
        ax.set_title(f"{metric} (below 0: SGM narrows the gap)", fontsize=9, loc="left")
    fig.suptitle("tiny_cil → laptop_table1, one factor at a time (paired-t 95 % intervals; hollow: one seed)",
                 fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", required=True, type=Path)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--metrics", default="S_delta,CK_delta", help="comma-separated metric columns")
    args = parser.parse_args(argv)
    metrics = [m for m in args.metrics.split(",") if m]
    runs = published_runs(load_results(args.results_dir))
    unknown = [m for m in metrics if m not in runs.columns]
    if unknown:
        raise SystemExit(f"unknown metric column(s): {', '.join(unknown)}")
    steps = effects(runs, metrics)
    print(table(steps, metrics))
    if not any(e is not None for s in steps for e in s.effects.values()):
        print(f"no step has both methods on a shared seed in {args.results_dir}: no figure written")
        return 1
    figure(steps, metrics, args.out)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
