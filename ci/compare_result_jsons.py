"""Do two results folders hold the same numbers? Pairs the stored runs by protocol/method folder and
compares every leaf of their JSONs; prints, per run, the leaves that differ. Run ids, the commit, wall
times and the machine's free space differ between any two runs; everything else (curves, metrics,
budget and FLOPs, references' scores) must be equal to the last bit for a change that claims to keep
the numbers. Usage: python ci/compare_result_jsons.py BEFORE_DIR AFTER_DIR  (exit 1 on a difference)"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# leaves that name or time a run, or describe the machine, rather than its numbers
IDENTITY = ("run_id", "best_new_runs", "joint_run", "git_commit", "started_at", "wall_time_s", "stage_seconds",
            "cache_root", "disk_budget", "ram_budget")


def leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{prefix}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, f"{prefix}[{i}]")
    else:
        yield prefix, value


def runs(folder: Path) -> dict[Path, Path]:
    return {path.parent.relative_to(folder): path for path in sorted(folder.glob("runs/*/*/*.json"))}


def main(before: Path, after: Path) -> int:
    a, b = runs(before), runs(after)
    differ = sorted(set(a) ^ set(b))
    for rel in differ:
        print(f"{rel}: only in {'before' if rel in a else 'after'}")
    for rel in sorted(set(a) & set(b)):
        la, lb = dict(leaves(json.loads(a[rel].read_text()))), dict(leaves(json.loads(b[rel].read_text())))
        keys = sorted(set(la) | set(lb))
        changed = [k for k in keys if la.get(k, "<missing>") != lb.get(k, "<missing>")]
        real = [k for k in changed if not any(word in k for word in IDENTITY)]
        print(f"{rel}: {len(keys)} leaves, {len(keys) - len(changed)} equal, {len(changed) - len(real)} naming or "
              f"timing the run differ, {len(real)} other differences")
        for key in real:
            print(f"  {key}: {la.get(key, '<missing>')} -> {lb.get(key, '<missing>')}")
        differ += real
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
