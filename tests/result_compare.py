"""Compare two results folders run by run: the same grid must give the same JSONs whichever executor ran it.

Fields that legitimately differ between two executions of the same run, and only those, are left out:

- ``run_id``: a fresh random id per execution;
- ``started_at``, ``wall_time_s``, ``stage_seconds``: when the run started and how long it took;
- ``git_commit``: read with ``git`` from the process's environment, which a Ray worker may not share
  (the code itself is the same package: ``versions`` and the method's ``code_hash`` are compared);
- the run ids inside ``references`` (``joint_run``, ``best_new_runs``): the ids of the reference runs,
  which differ for the same reason; they are compared after mapping each id to the run it names
  (method row and seed), so a run scored against another reference still fails.

- in ``options.data_path``, what describes the machine rather than the run: where the cache lives, the
  RAM and disk budgets read at the start, the bytes this run wrote to a cache (0 when another run had
  written them) and the sentence explaining the choice; the modes, sample counts and feature shape and
  dtype (what decides the numbers) are compared.

Everything else (curves, metrics, budget, config, overrides, reference accuracies, versions, the other
options, git commit) must be equal, float for float.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench_stability_gap.harness.results.schema import RunResult, iter_results

VOLATILE = ("run_id", "started_at", "wall_time_s", "stage_seconds", "git_commit")


def _comparable(result: RunResult, name_of: dict[str, str]) -> dict[str, Any]:
    data = result.model_dump(mode="json")
    for key in VOLATILE:
        data.pop(key)
    plan = data.get("options", {}).get("data_path")
    if plan:
        for key in ("cache_root", "ram_budget", "disk_budget", "resident_bytes"):
            plan.pop(key, None)
        for split in ("test", "train"):
            for key in ("disk_bytes", "ram_bytes", "why"):
                plan.get(split, {}).pop(key, None)
    refs = data.get("references")
    if refs is not None:
        refs["joint_run"] = name_of.get(refs["joint_run"], refs["joint_run"])
        refs["best_new_runs"] = {s: name_of.get(rid, rid) for s, rid in refs["best_new_runs"].items()}
    return data


def _by_run(root: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    results = [r for _, r in iter_results(root)]
    assert all(isinstance(r, RunResult) for r in results), f"unreadable results under {root}"
    name_of = {r.run_id: f"{r.label} seed {r.seed}" for r in results}
    out = {}
    for r in results:
        key = (r.protocol.name, r.label, r.seed)
        assert key not in out, f"{root}: two results for {key}"
        out[key] = _comparable(r, name_of)
    return out


def differences(left: Path, right: Path) -> list[str]:
    """Every run present in only one folder, and every top-level field that differs (empty: identical)."""
    a, b = _by_run(left), _by_run(right)
    out = [f"only in {left}: {k}" for k in sorted(a.keys() - b.keys())]
    out += [f"only in {right}: {k}" for k in sorted(b.keys() - a.keys())]
    for key in sorted(a.keys() & b.keys()):
        out += [f"{key}: field {f!r} differs" for f in sorted(a[key].keys() | b[key].keys())
                if a[key].get(f) != b[key].get(f)]
    return out
