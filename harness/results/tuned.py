"""Tuned entries: the best settings ``bench tune`` found for a method on a protocol, with what they were
tuned under (protocol hash, trials, objective, validation split, study), stored beside the results at
``<results>/tuned/PROTOCOL/METHOD.json``; ``bench run --tuned`` and sweep rows with ``tuned: true`` read
them, and the runs they make carry a ``TunedStamp``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from ..atomic import atomic_write_text, move_aside
from ..errors import MISSING, BenchError, not_a_file, shorten
from ..spec.protocol import OBJECTIVES, Protocol, Validation, check_objective
from .schema import TunedStamp


class TunedEntry(BaseModel):
    """The best settings one study found, and everything needed to say what they were tuned under."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    protocol: str
    protocol_hash: str = Field(description="spec hash of the protocol the settings are for (its test runs)")
    tuning_hash: str = Field(description="spec hash of its tuning view, which every trial ran")
    method: str
    settings: dict[str, Any] = Field(description="the best trial's settings, as --set overrides")
    trials: int = Field(ge=1, description="trials the study ran (complete or pruned)")
    objective: str
    direction: Literal["minimize", "maximize"]
    value: float = Field(description="the best trial's objective on the validation split")
    best_trial: int = Field(ge=0)
    best_run: str = Field(description="run id of the best trial's result (under <results>/tuning)")
    validation: Validation
    seed: int
    study: str
    storage: str

    @field_validator("objective")
    @classmethod
    def _known_objective(cls, objective: str) -> str:
        """An objective tuning scores: a ruleset the leaderboard prints must be one bench tune can run."""
        check_objective(objective, "objective")
        return objective

    @field_validator("direction")
    @classmethod
    def _objective_direction(cls, direction: str, info: ValidationInfo) -> str:
        """The direction the objective is tuned in (a gap is minimized, an accuracy maximized)."""
        objective = info.data.get("objective")
        if objective in OBJECTIVES and direction != OBJECTIVES[objective]:
            raise ValueError(f"{objective} is tuned to {OBJECTIVES[objective]}, not {direction}")
        return direction

    @property
    def ruleset(self) -> str:
        """How the leaderboard names the effort behind a tuned row."""
        return f"tuned ({self.trials} trials, {self.objective})"


TUNED_FOLDER = "tuned"  # <results>/tuned/PROTOCOL/METHOD.json


def entry_path(results_dir: Path, protocol: str, method: str) -> Path:
    return results_dir / TUNED_FOLDER / protocol / f"{method.replace('+', '__')}.json"


def is_entry_path(path: Path) -> bool:
    """Whether ``path`` lies where tuned entries are written (``<results>/tuned/PROTOCOL/METHOD.json``)."""
    return path.parent.parent.name == TUNED_FOLDER and path.suffix == ".json"


def entry_problem(path: Path) -> str | None:
    """Why the file at ``path`` is not a valid tuned entry (None when it is one): what a reader of a whole
    results folder says of a file in ``tuned/``, which is no run result."""
    try:
        _read(path)
    except BenchError as err:
        why = str(err).removeprefix(f"Tuned entry {path} ").rstrip(".")
        return why.removeprefix("is ") if why.startswith("is not a valid") else f"a tuned entry that {why}"
    return None


def save_entry(results_dir: Path, entry: TunedEntry) -> tuple[Path, Path | None]:
    """Write the entry (left untouched when it holds this content already); one there with other content
    (maybe edited by hand, or tuned on another spec) is first moved aside to ``METHOD.json.replaced-TIME``,
    never lost. Returns the entry's path and where the old one went (None when there was none)."""
    path = entry_path(results_dir, entry.protocol, entry.method)
    path.parent.mkdir(parents=True, exist_ok=True)
    text, kept = entry.model_dump_json(indent=1), None
    if path.is_file():
        if path.read_text(errors="replace") == text:  # a finished study run again: the file stays as it is
            return path, None
        kept = move_aside(path, "replaced")
    atomic_write_text(path, text)
    return path, kept


def has_entry(results_dir: Path, protocol: Protocol, method: str) -> bool:
    """Whether ``method`` on ``protocol`` is tuned: False only when no entry is there; one that cannot be
    used (unreadable, a folder, another spec's) is load_entry's BenchError, so nothing tunes over it."""
    if not_a_file(entry_path(results_dir, protocol.name, method)) == MISSING:
        return False
    load_entry(results_dir, protocol, method)
    return True


def check_replaceable(results_dir: Path, protocol: str, method: str) -> None:
    """The entry's path is free or a file (which ``save_entry`` keeps aside): checked before a study runs, so
    its trials never end on an entry that cannot be written."""
    path = entry_path(results_dir, protocol, method)
    why = not_a_file(path)
    if why not in (None, MISSING):
        raise BenchError(f"Tuned entry {path} {why}: the tuned settings are written there; move it aside.")


def stamp(entry: TunedEntry) -> TunedStamp:
    """What a run made with a tuned entry's settings records of it."""
    return TunedStamp(trials=entry.trials, objective=entry.objective, value=entry.value,
                      validation_per_class=entry.validation.per_class, study=entry.study, tuning_hash=entry.tuning_hash)


def load_entry(results_dir: Path, protocol: Protocol, method: str, given: str | None = None) -> TunedEntry:
    """The tuned entry of ``method`` on ``protocol``; a missing one, or one tuned on another spec, is a
    BenchError that says how to make it (``given``: the protocol as the user named it, a file's path, so
    the suggested command resolves it as the failed one did). One that is not a valid entry, or holds
    another method's or protocol's settings than its place says, is refused naming the path."""
    import shlex

    path = entry_path(results_dir, protocol.name, method)
    why = not_a_file(path)
    if why == MISSING and protocol.validation is None:  # `bench tune` would refuse: never suggest it
        raise BenchError(f"No tuned settings for {method} on {protocol.name}, and none can be made: the protocol "
                         f"declares no validation split to tune on (add `validation: {{per_class: N}}` to a copy of "
                         f"its spec and tune that), so run it with its default settings or --set.")
    if why == MISSING:
        command = shlex.join(["bench", "tune", given or protocol.name, method, "--results-dir", str(results_dir)])
        raise BenchError(f"No tuned settings for {method} on {protocol.name} in {path.parent}: run "
                         f"`{command}` first.")
    if why is not None:
        raise BenchError(f"Tuned entry {path} {why}; a tuned entry is a JSON file written by bench tune.")
    entry = _read(path)
    if (entry.protocol, entry.method) != (protocol.name, method):
        raise BenchError(f"Tuned entry {path} holds the settings of {entry.method} on {entry.protocol}, not of "
                         f"{method} on {protocol.name} as its place says: move it aside and run `bench tune` again.")
    if entry.protocol_hash != protocol.spec_hash:
        raise BenchError(f"Tuned entry {path} was tuned on another spec of {protocol.name} (hash "
                         f"{entry.protocol_hash}, now {protocol.spec_hash}): run `bench tune` again.")
    return entry


def _read(path: Path) -> TunedEntry:
    """The entry stored at ``path``; what cannot be read or is not a valid entry is named by field."""
    from ..spec.specfile import validation_problems

    try:
        return TunedEntry.model_validate(json.loads(path.read_bytes()))
    except ValidationError as exc:
        raise BenchError(f"Tuned entry {path} is not a valid tuned entry: {validation_problems(exc)}.") from None
    except OSError as exc:
        raise BenchError(f"Tuned entry {path} cannot be read ({exc.strerror or exc}).") from None
    except ValueError as exc:  # not JSON, or not UTF-8 text
        raise BenchError(shorten(f"Tuned entry {path} is not JSON ({exc}).")) from None
