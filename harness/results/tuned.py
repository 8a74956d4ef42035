"""Tuned entries: the best settings ``bench tune`` found for a method on a protocol, with what they were
tuned under (protocol hash, trials, objective, validation split, study), stored beside the results at
``<results>/tuned/PROTOCOL/METHOD.json``; ``bench run --tuned`` and sweep rows with ``tuned: true`` read
them, and the runs they make carry a ``TunedStamp``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..atomic import atomic_write_text
from ..errors import BenchError
from ..spec.protocol import Protocol, Validation
from .schema import TunedStamp


class TunedEntry(BaseModel):
    """The best settings one study found, and everything needed to say what they were tuned under."""

    model_config = ConfigDict(extra="forbid")

    protocol: str
    protocol_hash: str = Field(description="spec hash of the protocol the settings are for (its test runs)")
    tuning_hash: str = Field(description="spec hash of its tuning view, which every trial ran")
    method: str
    settings: dict[str, Any] = Field(description="the best trial's settings, as --set overrides")
    trials: int = Field(description="trials the study ran (complete or pruned)")
    objective: str
    direction: str
    value: float = Field(description="the best trial's objective on the validation split")
    best_trial: int
    best_run: str = Field(description="run id of the best trial's result (under <results>/tuning)")
    validation: Validation
    seed: int
    study: str
    storage: str

    @property
    def ruleset(self) -> str:
        """How the leaderboard names the effort behind a tuned row."""
        return f"tuned ({self.trials} trials, {self.objective})"


def entry_path(results_dir: Path, protocol: str, method: str) -> Path:
    return results_dir / "tuned" / protocol / f"{method.replace('+', '__')}.json"


def save_entry(results_dir: Path, entry: TunedEntry) -> Path:
    path = entry_path(results_dir, entry.protocol, entry.method)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, entry.model_dump_json(indent=1))
    return path


def has_entry(results_dir: Path, protocol: Protocol, method: str) -> bool:
    try:
        load_entry(results_dir, protocol, method)
    except BenchError:
        return False
    return True


def stamp(entry: TunedEntry) -> TunedStamp:
    """What a run made with a tuned entry's settings records of it."""
    return TunedStamp(trials=entry.trials, objective=entry.objective, value=entry.value,
                      validation_per_class=entry.validation.per_class, study=entry.study, tuning_hash=entry.tuning_hash)


def load_entry(results_dir: Path, protocol: Protocol, method: str, given: str | None = None) -> TunedEntry:
    """The tuned entry of ``method`` on ``protocol``; a missing one, or one tuned on another spec, is a
    BenchError that says how to make it (``given``: the protocol as the user named it, a file's path, so
    the suggested command resolves it as the failed one did)."""
    import shlex

    path = entry_path(results_dir, protocol.name, method)
    if not path.is_file() and protocol.validation is None:  # `bench tune` would refuse: never suggest it
        raise BenchError(f"No tuned settings for {method} on {protocol.name}, and none can be made: the protocol "
                         f"declares no validation split to tune on (add `validation: {{per_class: N}}` to a copy of "
                         f"its spec and tune that), so run it with its default settings or --set.")
    if not path.is_file():
        command = shlex.join(["bench", "tune", given or protocol.name, method, "--results-dir", str(results_dir)])
        raise BenchError(f"No tuned settings for {method} on {protocol.name} in {path.parent}: run "
                         f"`{command}` first.")
    try:
        entry = TunedEntry.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise BenchError(f"Tuned entry {path} cannot be read: {str(exc).splitlines()[0]}") from None
    if entry.protocol_hash != protocol.spec_hash:
        raise BenchError(f"Tuned entry {path} was tuned on another spec of {protocol.name} (hash "
                         f"{entry.protocol_hash}, now {protocol.spec_hash}): run `bench tune` again.")
    return entry
