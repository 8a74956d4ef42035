"""Progress display that suits where it goes: a tqdm bar on a terminal or in a notebook, plain periodic lines
elsewhere.

A bar redraws itself with carriage returns; written to a file (a sweep's log, a batch job's stderr) that
is megabytes of one line. Off a terminal the main bars print one plain line every $BENCH_PROGRESS_EVERY_S
seconds (``PLAIN_EVERY_S`` by default; and at their end) instead, and the short inner bars (an eval pass, a
trunk pass) print nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, Protocol, TextIO, TypedDict, TypeVar, overload

from tqdm.auto import tqdm

if TYPE_CHECKING:
    from typing_extensions import Unpack

from .environment import PROGRESS_EVERY_S

PLAIN_EVERY_S = 30.0  # seconds between plain lines unless $BENCH_PROGRESS_EVERY_S sets it

_T = TypeVar("_T")


class Bar(Protocol):
    """The part of a progress bar's interface the harness uses: tqdm's, ``PlainBar``'s and ``MeasuredBar``'s."""

    def update(self, n: float = 1) -> object: ...

    # dynamic: tqdm's set_postfix also takes ordered_dict and refresh by name, so a keyword's type depends on its
    # name (the harness passes text and numbers, each shown as its str)
    def set_postfix(self, **values: Any) -> None: ...

    def close(self) -> None: ...


class BarOptions(TypedDict, total=False):
    """The tqdm keywords the harness gives a bar (``PlainBar`` reads the ones it draws and ignores the rest)."""

    desc: str | None
    total: float | None
    initial: float
    unit: str
    leave: bool
    delay: float
    file: TextIO | None


class _IteratedBarOptions(BarOptions, total=False):
    iterable: Iterable[object]


def on_terminal(stream: TextIO | None = None) -> bool:
    stream = stream if stream is not None else sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class PlainBar:
    """The part of tqdm's interface the harness uses, written as whole lines: label, count, total, rate,
    ETA and the postfix, every ``every`` seconds (None: the environment's interval, read when the bar starts
    so that a malformed one is refused as a setting, not at import) and once at ``close``."""

    def __init__(self, desc: str | None = "", total: float | None = None, initial: float = 0, unit: str = "it",
                 every: float | None = None, file: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 **_: object) -> None:  # tqdm's other keywords (leave, delay): nothing a line shows
        given = PROGRESS_EVERY_S.read() if every is None else every
        self.desc, self.total, self.n, self.unit = desc, total, initial, unit
        self.every = PLAIN_EVERY_S if given is None else given
        self.file, self.clock = file, clock
        self.start_n, self.t0 = initial, clock()
        self.last = self.t0
        self.postfix = ""

    def update(self, n: float = 1) -> None:
        self.n += n
        if self.clock() - self.last >= self.every:
            self._line()

    def set_postfix(self, **values: object) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if self.n != self.start_n:
            self._line()

    def _line(self) -> None:
        now = self.clock()
        self.last = now
        done = f"{self.n:.4g}" if isinstance(self.n, float) else f"{self.n}"
        parts = [f"{self.desc}: {done}" + (f"/{self.total:.4g}" if self.total else "") + f" {self.unit}"]
        rate = (self.n - self.start_n) / max(now - self.t0, 1e-9)
        if self.total:
            parts.append(f"{100 * self.n / self.total:.0f}%")
            if rate > 0:
                parts.append(f"ETA {duration(max(0.0, self.total - self.n) / rate)}")
        parts.append(f"elapsed {duration(now - self.t0)}")
        if self.postfix:
            parts.append(self.postfix)
        print(", ".join(parts), file=self.file if self.file is not None else sys.stderr, flush=True)


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython under ``IPKernelApp``), whose output cell draws
    tqdm.auto's widget bar in place: its stderr is no terminal, yet plain lines there would be a step back.
    IPython is only looked up where it is already imported (a kernel always has it): never imported here."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


@overload
def progress_bar(enabled: bool, *, lines: Literal[False], iterable: Iterable[_T],
                 **kwargs: Unpack[BarOptions]) -> tqdm[_T]: ...


@overload
def progress_bar(enabled: bool, *, lines: bool = True, **kwargs: Unpack[BarOptions]) -> Bar: ...


def progress_bar(enabled: bool, *, lines: bool = True, **kwargs: Unpack[_IteratedBarOptions]) -> Bar:
    """A tqdm bar on a terminal or in a notebook (tqdm.auto: the notebook's widget bar where it can draw one);
    elsewhere a ``PlainBar`` (``lines``) or nothing (a disabled tqdm)."""
    if not enabled:
        return tqdm(disable=True, **kwargs)
    if on_terminal(kwargs.get("file")) or in_notebook():
        return tqdm(**kwargs)
    if lines:
        return PlainBar(**kwargs)
    return tqdm(disable=True, **kwargs)


class MeasuredBar:
    """A bar whose position is read from ``measure`` at each ``update`` instead of counted: a run under a
    FLOP budget moves its bar in training TFLOPs, the unit its budget (and so its total) is given in."""

    def __init__(self, bar: Bar, measure: Callable[[], float]) -> None:
        self.bar, self.measure = bar, measure
        self.at = measure()

    def update(self, n: float = 1) -> None:
        now = self.measure()
        self.bar.update(now - self.at)
        self.at = now

    def set_postfix(self, **values: object) -> None:
        self.bar.set_postfix(**values)

    def close(self) -> None:
        self.bar.close()
