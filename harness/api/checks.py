"""What an argument of the Python API takes, checked before anything computes: from Python nothing checks a
signature's types, so a number where a path belongs failed in pathlib, a str where a list belongs was read
letter by letter ("Unknown protocol 't'"), and 'no' passed as a true flag."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..errors import BenchError

# What an argument takes: its types and the words an error says. From Python nothing checks a signature's types:
# a number where a path belongs failed in pathlib, a str where a list belongs was read letter by letter
# ("Unknown protocol 't'"), and 'no' passed as a true flag.
Kind = tuple[tuple[type, ...], str]


FOLDER: Kind = ((str, Path), "a folder path (str or Path)")


FOLDER_OR_NONE: Kind = ((str, Path, type(None)), "a folder path (str or Path) or None")


PROTOCOL: Kind = ((str, Path), "a protocol's name or YAML path (str or Path)")


SWEEP: Kind = ((str, Path), "a sweep's name or YAML path (str or Path)")


METHOD: Kind = ((str,), "a method string, e.g. 'vanilla+sgm'")


TEXT: Kind = ((str,), "a str")


TEXT_OR_NONE: Kind = ((str, type(None)), "a str or None")


FLAG: Kind = ((bool,), "True or False")


TRIALS: Kind = ((int, type(None)), "a whole number of trials, e.g. 20, or None (the protocol's ruleset)")


OBJECTIVE: Kind = ((str, type(None)), "a metric's name, e.g. 'CK_delta', or None (the protocol's ruleset)")


SPACE: Kind = ((dict, type(None)), "a mapping {setting: {low, high[, log]} | {choices: [...]}}, or None")


STORAGE: Kind = ((str, type(None)), "a database URL, e.g. 'sqlite:///path/optuna.db', or None")


CHECKPOINT_EVERY = "a whole number of updates >= 0 (0: at session ends only) or None (every 2 minutes)"


def refused(name: str, value: object, takes: str) -> BenchError:
    from ..spec.specfile import short_repr

    return BenchError(f"{name} takes {takes}, not {short_repr(value)} of type {type(value).__name__}.")


def check_kinds(**given: tuple[object, Kind]) -> None:
    """Each argument (value, kind) of its kind; a bool is never taken for a number."""
    for name, (value, (types, takes)) in given.items():
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise refused(name, value, takes)


def check_flags(**flags: object) -> None:
    check_kinds(**{name: (value, FLAG) for name, value in flags.items()})


def name_list(value: object, name: str, example: str) -> tuple[str, ...]:
    """A collection of names as a tuple; one str is refused, not read as its letters."""
    items = None if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) else tuple(value)
    if items is None or not all(isinstance(item, str) for item in items):
        raise refused(name, value, f"a list of str, e.g. {example}")
    return items


def seed_list(seeds: object) -> list[int] | None:
    """The seeds a sweep runs instead of its own (None: its own), each one ``check_seed`` accepts."""
    from ..tools.preflight import check_seed

    if seeds is None:
        return None
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise refused("seeds", seeds, "a list of seeds, e.g. [0, 1, 2], or None for the sweep's own")
    chosen = list(seeds)
    if not chosen:
        raise BenchError(f"seeds {chosen} names no seed: give some, e.g. [0, 1, 2], or None for the "
                         f"sweep's own.")
    for seed in chosen:
        check_seed(seed, "seed")
    return chosen
