"""A grid of runs (protocols x methods x seeds) from one YAML file: the paper's tables are grids, and one
command must reproduce one. Re-running a sweep resumes it: a run whose complete result is already in
the results folder (same protocol spec hash, method string, seed and resolved settings) is skipped,
so an interrupted sweep loses at most the run in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .protocol import Protocol, load_protocol
from .registry import build_method, format_setting, method_settings
from .results import RunResult, iter_results
from .specfile import load_spec


class SweepGroup(BaseModel):
    """Methods run on one protocol with the same ``--set`` overrides."""

    model_config = ConfigDict(extra="forbid")

    protocol: str
    methods: list[str] = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict, description="overrides, as `bench run --set key=value`")


class Sweep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    seeds: list[int] = Field(min_length=1)
    runs: list[SweepGroup] = Field(min_length=1)


@dataclass(frozen=True)
class PlannedRun:
    protocol: Protocol
    method: str
    seed: int
    overrides: dict[str, Any]
    done: Path | None  # the result already on disk, if any

    @property
    def label(self) -> str:
        extra = "".join(f" --set {k}={format_setting(v)}" for k, v in self.overrides.items())
        return f"{self.protocol.name} {self.method} seed {self.seed}{extra}"


def load_sweep(name_or_path: str) -> Sweep:
    """A built-in sweep (protocols/sweeps/NAME.yaml) or a YAML file; every problem names its field."""
    return load_spec(Sweep, name_or_path, "sweep", folder="sweeps")


def _finished(stored: list[tuple[Path, RunResult]], protocol: Protocol, method: str, seed: int,
              config: dict) -> Path | None:
    for path, r in stored:
        if (r.status == "complete" and not r.is_reference and r.protocol.hash == protocol.spec_hash
                and r.method.spec == method and r.seed == seed and r.config == config):
            return path
    return None


def plan(sweep: Sweep, results_dir: Path, seeds: list[int] | None = None) -> list[PlannedRun]:
    """Every run of the sweep in order (seed-major, so a partial sweep has whole seeds), each marked
    with the result that already covers it. Every protocol, method string and setting is validated up
    front, so a typo fails before hours of compute rather than in the middle."""
    protocols = {g.protocol: load_protocol(g.protocol) for g in sweep.runs}
    stored = {name: [(p, r) for p, r in iter_results(results_dir, spec.name) if isinstance(r, RunResult)]
              for name, spec in protocols.items()}
    cells = []  # (group, method, resolved settings): built once, whatever the number of seeds
    for group in sweep.runs:
        for method in group.methods:
            _, built = build_method(method, protocols[group.protocol].name, dict(group.set))
            cells.append((group, method, method_settings(built)))
    out = []
    for seed in seeds if seeds is not None else sweep.seeds:
        for group, method, config in cells:
            spec = protocols[group.protocol]
            done = _finished(stored[group.protocol], spec, method, seed, config)
            out.append(PlannedRun(spec, method, seed, dict(group.set), done))
    return out


def sweep_table(sweep: Sweep, runs: list[PlannedRun], results_dir: Path) -> str:
    """The leaderboard's mean ± std table restricted to this sweep's protocols, methods and seeds (with
    their joint references), so P_Δ's best new-class accuracy is taken over the sweep's own runs."""
    from ..leaderboard.aggregate import format_table, summarize
    from ..leaderboard.sources import load_folder

    wanted = {(r.protocol.name, r.method, r.seed) for r in runs}
    seeds = {r.seed for r in runs}
    protocols = {r.protocol.name for r in runs}
    entries = [e for e in load_folder(results_dir).entries
               if (e.result.protocol.name, e.result.method.spec, e.result.seed) in wanted
               or (e.is_reference and e.result.protocol.name in protocols and e.result.seed in seeds)]
    header = f"## Sweep {sweep.name}: seeds {', '.join(map(str, sorted(seeds)))}\n\n"
    return header + (sweep.description.strip() + "\n\n" if sweep.description else "") + format_table(summarize(entries))
