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

from ..spec.protocol import Protocol, load_protocol
from ...methods.registry import build_method, method_settings
from ..results.schema import Selection, format_setting, row_label
from ..spec.specfile import load_spec


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
    config: dict[str, Any]  # the settings the method resolves to
    done: Path | None  # the result already on disk, if any

    @property
    def label(self) -> str:
        extra = "".join(f" --set {k}={format_setting(v)}" for k, v in self.overrides.items())
        return f"{self.protocol.name} {self.method} seed {self.seed}{extra}"

    @property
    def row(self) -> str:
        """The leaderboard row this run lands in (``results.row_label``)."""
        return row_label(self.method, self.overrides)


def load_sweep(name_or_path: str) -> Sweep:
    """A built-in sweep (protocols/sweeps/NAME.yaml) or a YAML file; every problem names its field."""
    return load_spec(Sweep, name_or_path, "sweep", folder="sweeps")


def finished(protocol: Protocol, method: str, overrides: dict[str, Any], seed: int, config: dict[str, Any],
             counted: Selection) -> Path | None:
    """The stored result that already covers a planned run: the run ``results.select_runs`` counts for its
    row and seed, made with the settings the method resolves to now."""
    found = counted.runs.get((row_label(method, overrides), seed))
    return found[0] if found is not None and found[1].config == config else None


def plan(sweep: Sweep, results_dir: Path, seeds: list[int] | None = None) -> list[PlannedRun]:
    """Every run of the sweep in order (seed-major, so a partial sweep has whole seeds), each marked with
    the result that already covers it (``finished``). Every protocol, method string and setting is
    validated up front, so a typo fails before hours of compute rather than in the middle."""
    from ..run.pipeline import check_joint_request, selection
    from ..run.options import RunOptions

    protocols = {g.protocol: load_protocol(g.protocol) for g in sweep.runs}
    counted = {name: selection(spec, RunOptions(results_dir=results_dir)) for name, spec in protocols.items()}
    cells = []  # (group, method, resolved settings): built once, whatever the number of seeds
    for group in sweep.runs:
        for method in group.methods:
            check_joint_request(method, dict(group.set))
            _, built = build_method(method, protocols[group.protocol], dict(group.set))
            cells.append((group, method, method_settings(built)))
    out = []
    for seed in seeds if seeds is not None else sweep.seeds:
        for group, method, config in cells:
            spec, overrides = protocols[group.protocol], dict(group.set)
            done = finished(spec, method, overrides, seed, config, counted[group.protocol])
            out.append(PlannedRun(spec, method, seed, overrides, config, done))
    return out

