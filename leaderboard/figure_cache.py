"""Drawn figures kept in the bench cache, so a site rebuilt after a new result draws only what changed.

matplotlib's layout and SVG writer are most of a leaderboard build (about 0.2 s of CPU a figure: 24 s for
a site of 100 results on a 2-core machine), and a site is rebuilt whole whenever a result is added. A
figure's SVG is a function of what it is drawn from (its data frames, labels and titles), of the code that
draws it, of matplotlib's version and of the font it lays text out with; it is stored under
``<cache>/figures/`` by the sha256 of all of them, and a later build takes it from there.

A stored figure ends with a comment holding the sha256 of the SVG before it, checked at every read: a file
that fails is named, moved aside and drawn again. A cache that cannot be written costs only the drawing.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.figure import Figure

from ..harness.atomic import StorageFault, atomic_write_text, move_aside
from ..harness.paths import cache_dir_path

FORMAT = 1
_SEAL = "\n<!-- bench figure sha256:"
_warned: set[str] = set()  # what was warned of: one warning a process for an unwritable cache, not one a figure


def _warn(message: str, once: str | None = None) -> None:
    if once is None or once not in _warned:
        _warned.add(once or message)
        print(f"Warning: {message}", file=sys.stderr)


def _feed(h: hashlib._Hash, part: object) -> None:
    """Add ``part`` to the key: a frame by its columns, types and every value's bits; anything else by its
    ``repr`` (strings, numbers, tuples and frozen dataclasses such as a plot's lines)."""
    if isinstance(part, pd.DataFrame):
        h.update(repr((list(part.columns), [str(t) for t in part.dtypes], part.shape)).encode())
        h.update(pd.util.hash_pandas_object(part, index=True).to_numpy().tobytes())
    else:
        h.update(repr(part).encode())
    h.update(b"\0")


def figure_key(code: bytes, font: str, parts: Iterable[object]) -> str:
    """The sha256 a figure is stored under: the drawing ``code``, matplotlib's version, the ``font`` file
    its text is laid out with, and ``parts``, everything the drawing reads."""
    h = hashlib.sha256(repr((FORMAT, matplotlib.__version__, font)).encode())
    h.update(hashlib.sha256(code).digest())
    for part in parts:
        _feed(h, part)
    return h.hexdigest()


def _read(path: Path) -> str | None:
    """The stored SVG, or None when there is none; ValueError when it fails its sha256."""
    try:
        text = path.read_text()
    except OSError:  # none stored, or a cache that cannot be read: drawn (and its write warns)
        return None
    svg, seal, tail = text.rpartition(_SEAL)
    if not seal or tail != f"{hashlib.sha256(svg.encode()).hexdigest()} -->\n":
        raise ValueError("it does not end with the sha256 of its SVG")
    return svg


def cached_svg(key: str, draw: Callable[[], Figure], to_svg: Callable[[Figure], str]) -> str:
    """The SVG stored under ``key``, else ``to_svg(draw())``, stored for the next build."""
    path = cache_dir_path() / "figures" / key[:2] / f"{key}.svg"
    try:
        svg = _read(path)
    except ValueError as exc:  # UnicodeDecodeError included
        aside = move_aside(path)
        _warn(f"cached figure {path} failed verification ({exc}); moved to {aside} and drawn again.")
        svg = None
    if svg is not None:
        return svg
    svg = to_svg(draw())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, f"{svg}{_SEAL}{hashlib.sha256(svg.encode()).hexdigest()} -->\n")
    except (OSError, StorageFault) as exc:  # the build goes on with the drawn figure; the next one draws it again
        folder = path.parent.parent
        _warn(f"could not store drawn figures under {folder} ({str(exc).splitlines()[0]}); the next build draws "
              f"them again.", once=str(folder))
    return svg
