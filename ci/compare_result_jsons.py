"""Do two results folders hold the same numbers? Pairs the stored runs by protocol/method folder, seed,
overrides and precision (or takes two result files), compares every leaf of their JSONs, and prints, per
run, the leaves that differ. Run ids, the commit, wall times and the machine's free space differ between
any two runs; everything else (curves, metrics, budget and FLOPs, references' scores) must be equal to
the last bit for a change that claims to keep the numbers.
Usage: python ci/compare_result_jsons.py BEFORE AFTER  (folders or files; exit 1 on a difference)"""

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


def _key(folder: Path, path: Path) -> str:
    """What pairs a run across two folders: its protocol/method folder, seed, overrides and precision (the
    file name holds the run id, which differs between any two runs)."""
    data = json.loads(path.read_text())
    overrides = json.dumps(data.get("overrides") or {}, sort_keys=True)
    precision = (data.get("options") or {}).get("precision", "")
    return f"{path.parent.relative_to(folder)} seed {data.get('seed')} {overrides} {precision}".strip()


def runs(folder: Path) -> dict[str, Path]:
    """Key -> result file, every run of the folder; runs stored twice under one key are numbered by start."""
    found: dict[str, list[Path]] = {}
    for path in sorted(folder.glob("runs/*/*/*.json")):
        found.setdefault(_key(folder, path), []).append(path)
    out: dict[str, Path] = {}
    for key, paths in found.items():
        paths.sort(key=lambda p: json.loads(p.read_text()).get("started_at") or "")
        out.update({key if len(paths) == 1 else f"{key} #{i + 1}": p for i, p in enumerate(paths)})
    return out


def compare(name: str, before: Path, after: Path) -> list[str]:
    """Print how the two files' leaves differ; return the differences that are not a run's name or time."""
    la, lb = dict(leaves(json.loads(before.read_text()))), dict(leaves(json.loads(after.read_text())))
    keys = sorted(set(la) | set(lb))
    changed = [k for k in keys if la.get(k, "<missing>") != lb.get(k, "<missing>")]
    real = [k for k in changed if not any(word in k for word in IDENTITY)]
    print(f"{name}: {len(keys)} leaves, {len(keys) - len(changed)} equal, {len(changed) - len(real)} naming or "
          f"timing the run differ, {len(real)} other differences")
    for key in real:
        print(f"  {key}: {la.get(key, '<missing>')} -> {lb.get(key, '<missing>')}")
    return real


def main(before: Path, after: Path) -> int:
    if before.is_file() and after.is_file():
        return 1 if compare(f"{before} vs {after}", before, after) else 0
    a, b = runs(before), runs(after)
    differ = sorted(set(a) ^ set(b))
    for key in differ:
        print(f"{key}: only in {'before' if key in a else 'after'}")
    for key in sorted(set(a) & set(b)):
        differ += compare(key, a[key], b[key])
    print(f"{len(set(a) & set(b))} runs compared, {len(differ)} differences")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
