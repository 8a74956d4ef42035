"""A grid of runs (protocols x methods x seeds) from one YAML file: the paper's tables are grids, and one
command must reproduce one. Re-running a sweep resumes it: a run whose complete result is already in
the results folder (same protocol spec hash, method string, seed and resolved settings) is skipped,
so an interrupted sweep loses at most the run in flight.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from ...methods.registry import build_method, method_settings
from ..errors import BenchError, not_a_file
from ..identity import RunIdentity
from ..numerics import cpu_label, torch_free_device
from ..results.comparability import Selection, execution
from ..results.schema import JOINT, TunedStamp, format_setting, row_label
from ..run.stored import protocol_selection, request_identity, resolved_settings
from ..spec.protocol import Protocol, load_protocol
from ..spec.specfile import is_path, load_spec

if TYPE_CHECKING:
    from ..run.options import RunOptions


class SweepGroup(BaseModel):
    """Methods run on one protocol with the same ``--set`` overrides."""

    model_config = ConfigDict(extra="forbid")

    protocol: str = Field(description="a built-in protocol name, or a YAML path relative to the sweep file")
    methods: list[str] = Field(min_length=1, description="method strings, base(+modifier)*")
    set: dict[str, Any] = Field(default_factory=dict, description="overrides, as `bench run --set key=value`")
    tuned: bool = Field(False, description="run each method's settings from `bench tune` under the protocol's "
                                           "tuning ruleset (tuned first where missing)")

    @model_validator(mode="after")
    def _tuned_alone(self) -> SweepGroup:
        if self.tuned and self.set:
            raise ValueError("a group with tuned: true takes its settings from the tuned entries; drop `set`")
        return self


T = TypeVar("T")

MAX_GRID_RUNS = 10_000  # combinations one grid may hold: a sweep plans (and prints) every run before any trains


def _distinct(values: list[T]) -> list[T]:
    """``values`` without repeats, in order (1 and 1.0 are one value, as a setting sees them; true and 1,
    or "1" and 1, are not)."""
    def kind(v: object) -> str:
        return "bool" if isinstance(v, bool) else "str" if isinstance(v, str) else "other"

    seen: list[T] = []
    for v in values:
        if not any(kind(v) == kind(s) and v == s for s in seen):
            seen.append(v)
    return seen


class SweepGrid(BaseModel):
    """Methods × every combination of ``--set`` values, on one protocol (× the sweep's seeds)."""

    model_config = ConfigDict(extra="forbid")

    protocol: str = Field(description="a built-in protocol name, or a YAML path relative to the sweep file")
    methods: list[str] = Field(min_length=1, description="method strings, base(+modifier)*")
    set: dict[str, list[Any]] = Field(
        default_factory=dict, description="per setting, the values to try (`lr: [0.001, 0.0003]`); every "
                                          "combination of them runs, with every method")

    @field_validator("set")
    @classmethod
    def _values_given(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        empty = [k for k, v in value.items() if not v]
        if empty:
            raise ValueError(f"{', '.join(empty)} lists no value: the grid would hold no run")
        return {k: _distinct(v) for k, v in value.items()}  # a repeated value would plan the same run twice

    @field_validator("methods")
    @classmethod
    def _methods_once(cls, value: list[str]) -> list[str]:
        return _distinct(value)

    @model_validator(mode="after")
    def _bounded(self) -> SweepGrid:
        size = len(self.methods) * math.prod(len(v) for v in self.set.values())  # counted, never built
        if size > MAX_GRID_RUNS:
            raise ValueError(f"the grid holds {size:,} combinations of methods and settings (before seeds), more "
                             f"than the {MAX_GRID_RUNS:,} a sweep may plan; "
                             f"split it into smaller grids or fewer values")
        return self

    def groups(self) -> list[SweepGroup]:
        keys = list(self.set)
        return [SweepGroup(protocol=self.protocol, methods=self.methods, set=dict(zip(keys, values)))
                for values in itertools.product(*(self.set[k] for k in keys))]


class Sweep(BaseModel):
    """A sweep file: runs (groups written out) and grids (expanded), each over every seed."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    seeds: list[StrictInt] = Field(min_length=1)  # strict: YAML's `true` would otherwise be seed 1
    runs: list[SweepGroup] = Field(default_factory=list, description="groups of methods, each with its overrides")
    grid: list[SweepGrid] = Field(default_factory=list, description="methods × --set values, expanded")

    @field_validator("name")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank (the sweep's output and its table are headed with its name)")
        return value

    @model_validator(mode="after")
    def _some_run(self) -> Sweep:
        if not self.runs and not self.grid:
            raise ValueError("the sweep holds no run: give `runs:` or a `grid:` with at least one method")
        return self

    def groups(self) -> list[SweepGroup]:
        """Every group of runs: those written out, then each grid's combinations."""
        return [*self.runs, *(g for grid in self.grid for g in grid.groups())]


@dataclass(frozen=True)
class PlannedRun:
    protocol: Protocol
    method: str
    seed: int
    overrides: dict[str, Any]
    config: dict[str, Any]  # the settings the method resolves to
    done: Path | None  # the result already on disk, if any
    tuned: TunedStamp | None = None  # the settings came from bench tune

    @property
    def label(self) -> str:
        extra = " --tuned" if self.tuned else "".join(
            f" --set {k}={format_setting(v)}" for k, v in self.overrides.items())
        return f"{self.protocol.name} {self.method} seed {self.seed}{extra}"

    @property
    def row(self) -> str:
        """The leaderboard row this run lands in (``schema.row_label``)."""
        return row_label(self.method, self.overrides, self.tuned)


def todo_note(run: PlannedRun, options: RunOptions) -> str:
    """How a dry run lists a run still to make: "to run", and the checkpoint it would resume from when a
    stopped run left one (``--restart`` would discard it), so a resumed run is not mistaken for a fresh one."""
    from ..run.pipeline import resume_checkpoint

    found = resume_checkpoint(options, options.identity(run.protocol, run.method, run.seed, run.config, run.overrides,
                                                        run.tuned))
    if found is None:
        return "to run"
    return f"to run ({'starts over: --restart discards' if options.restart else 'resumes from'} its checkpoint {found})"


def load_sweep(name_or_path: str) -> Sweep:
    """A built-in sweep (protocols/sweeps/NAME.yaml) or a YAML file; every problem names its field. A
    protocol given as a path in a sweep file is read relative to that file, so the sweep runs the same
    from any working directory."""
    sweep = load_spec(Sweep, name_or_path, "sweep", folder="sweeps")
    if not is_path(name_or_path):
        return sweep
    folder = Path(name_or_path).parent

    def resolved(protocol: str) -> str:
        if not is_path(protocol):
            return protocol
        path = folder / Path(protocol).expanduser()
        if (problem := not_a_file(path)) is not None:
            raise BenchError(f"Sweep file {name_or_path}: protocol {protocol!r} is read relative to the sweep "
                             f"file's folder, and {path} {problem}.")
        return str(path)

    return sweep.model_copy(update={
        "runs": [g.model_copy(update={"protocol": resolved(g.protocol)}) for g in sweep.runs],
        "grid": [g.model_copy(update={"protocol": resolved(g.protocol)}) for g in sweep.grid]})


def finished(identity: RunIdentity, counted: Selection) -> Path | None:
    """The stored result that already covers a planned run: the run ``comparability.select_runs`` counts for its
    row and seed (``counted``: the selection for the run's precision and arithmetic) that is the same run
    (``RunIdentity.same_run``: among the rest, the settings the method resolves to now and the same code; the
    leaderboard never averages runs of two codes, so a run the code has changed under is made again, and, as
    the newer run of its row and seed, replaces the older one on the board)."""
    found = counted.runs.get(identity.row_key)
    return found[0] if found is not None and identity.same_run(RunIdentity.from_result(found[1])) else None


def stored_run(protocol: Protocol, method: str, overrides: dict[str, Any], seed: int, options: RunOptions,
               tuned: TunedStamp | None = None) -> Path | None:
    """The stored result an identical run would repeat (``finished``: same spec, row, settings, seed and
    precision), for ``bench run`` to report instead of training it again; None for ``joint``, whose
    reference the run reuses by itself."""
    from ..run.pipeline import check_joint_request, selection

    check_joint_request(method, overrides)
    if method.strip() == JOINT:
        return None
    _, built = build_method(method, protocol, overrides)
    return finished(options.identity(protocol, method, seed, method_settings(built), overrides, tuned),
                    selection(protocol, options))


def stored_on_cpu(protocol: Protocol, method: str, overrides: dict[str, Any], seed: int, results_dir: Path,
                  device: str, precision: str | None, kernels: str, tuned: TunedStamp | None = None) -> Path | None:
    """The stored result an identical run on the CPU would repeat, found before torch is imported; None when
    there is none, or when this cannot be told without torch (a GPU may be in use, another precision, a
    plugin's settings): the full check (``sweep.plan.stored_run``) then decides."""
    if method.strip() == JOINT or torch_free_device(device) != "cpu" or precision not in (None, "fp32"):
        return None
    settings = resolved_settings(method, protocol, overrides)
    if settings is None:
        return None
    run = execution("cpu", cpu_label(), kernels, asked_device=device, asked_precision=precision)
    identity = request_identity(protocol, method, seed, settings, overrides, run, tuned)
    return finished(identity, protocol_selection(protocol, results_dir, run, identity.precision))


def plan(sweep: Sweep, results_dir: Path, seeds: list[int] | None = None,
         options: RunOptions | None = None) -> list[PlannedRun]:
    """Every run of the sweep in order (seed-major, so a partial sweep has whole seeds), each marked with
    the result that already covers it (``finished``). Every protocol, method string and setting is
    validated up front, so a typo fails before hours of compute rather than in the middle. ``options``:
    the device and precision the sweep runs with (a run made in another precision does not cover it)."""
    from ..results.tuned import load_entry, stamp
    from ..run.options import RunOptions
    from ..run.pipeline import check_joint_request, selection

    groups = sweep.groups()
    protocols = {g.protocol: load_protocol(g.protocol) for g in groups}
    options = options or RunOptions(results_dir=results_dir)
    counted = {name: selection(spec, options) for name, spec in protocols.items()}
    run = options.execution
    cells = []  # (group, method, overrides, tuned, resolved settings): built once, whatever the number of seeds
    listed: set[tuple] = set()  # a method listed twice with the same settings (in a group or two) is one run
    for group in groups:
        for method in group.methods:
            settings = tuple(sorted((k, format_setting(v)) for k, v in group.set.items()))
            key = (group.protocol, method, group.tuned, settings)
            if key in listed:
                continue
            listed.add(key)
            check_joint_request(method, dict(group.set))
            overrides, tuned = dict(group.set), None
            if group.tuned:
                entry = load_entry(results_dir, protocols[group.protocol], method)
                overrides, tuned = dict(entry.settings), stamp(entry)
            _, built = build_method(method, protocols[group.protocol], overrides)
            config = method_settings(built)  # the cell's identity at seed 0, its code hash read once
            cells.append((group, method, overrides, tuned, config,
                          request_identity(protocols[group.protocol], method, 0, config, overrides, run, tuned)))
    out = []
    for seed in _distinct(seeds if seeds is not None else sweep.seeds):  # a seed listed twice is one run
        for group, method, overrides, tuned, config, identity in cells:
            spec = protocols[group.protocol]
            done = finished(dataclasses.replace(identity, seed=seed), counted[group.protocol])
            out.append(PlannedRun(spec, method, seed, dict(overrides), config, done, tuned))
    return out


def tuned_cells(sweep: Sweep) -> list[tuple[str, str]]:
    """(protocol, method) of every row that runs tuned settings: what ``bench sweep`` tunes first."""
    return [(g.protocol, m) for g in sweep.runs if g.tuned for m in g.methods]

