"""Parse each stored result file once while a run (or a sweep) is under way.

A method run asks which stored runs of its protocol count several times (its joint reference, its A_best
reference runs, its own earlier runs, then scoring), and each asking used to parse every JSON of the
protocol again. Inside ``reading_once()`` a parsed file is kept, keyed by its path and its stat (inode,
size, modification and change times): a result is written once, under a new name, through a rename, so a
file another process stores meanwhile is a new key and is read; ``forget`` drops what this process can no
longer trust (after waiting on another process's claim, or a file it wrote itself). Outside the block
nothing is kept: a long-lived process (a notebook, the leaderboard) always reads what is on disk now.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")
StatKey = tuple[int, int, int, int]

_kept: dict[Path, tuple[StatKey, object]] | None = None  # None: no block is open


@contextmanager
def reading_once() -> Iterator[None]:
    """Keep parsed result files for the block (nested blocks share the outer one's)."""
    global _kept
    if _kept is not None:
        yield
        return
    _kept = {}
    try:
        yield
    finally:
        _kept = None


def reads_once(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` run inside ``reading_once()``."""
    @functools.wraps(fn)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> T:
        with reading_once():
            return fn(*args, **kwargs)

    return wrapped


def _stat_key(stat: os.stat_result) -> StatKey:
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def parsed(path: Path, parse: Callable[[Path], T]) -> T:
    """``parse(path)``, or what it gave for this very file earlier in the block. OSError propagates."""
    if _kept is None:
        return parse(path)
    key = _stat_key(path.stat())
    hit = _kept.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]  # type: ignore[return-value]
    value = parse(path)
    _kept[path] = (key, value)
    return value


def forget(path: Path | None = None) -> None:
    """Drop what is kept of ``path`` (a file this process wrote), or of every file (``None``: another
    process held a claim and may have stored results while this one waited)."""
    if _kept is None:
        return
    if path is None:
        _kept.clear()
    else:
        _kept.pop(path, None)
