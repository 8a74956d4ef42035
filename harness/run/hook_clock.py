"""A time limit on every call into a run's method, so a hook that never returns ends the run instead of
stalling it (and a sweep of a hundred runs behind it).

The limit of a call is the one the user set (``--hook-time-limit``, else the protocol's
``hook_time_limit``), or else derived from the run itself: ``max(FLOOR_S, UPDATES x`` the slowest
``observe`` call so far). Every hook does at most the work of some updates (a Fisher estimate, a
codebook, an eval batch), so a hundred of the slowest update is a generous bound that grows with the
machine, the model and the batch; the floor covers the calls made before any update was timed (``setup``,
a resume, the first session's start) and the first, slower updates of a cold process.

How a call is stopped: a watchdog thread watches the call in progress. Past the limit it sends SIGALRM to
the main thread, whose handler raises ``HookOverran`` there, inside the method's code: that stops a
Python loop, and a sleep or a read the signal interrupts; the run then ends as a method's fault does (one
paragraph, exit 2, its last checkpoint kept). A call still running ``GRACE_S`` later is stuck where no
signal reaches (C code that never returns, or a method that swallowed the exception): the watchdog then
writes the same paragraph itself and ends the process (exit 2), as nothing else can end it. Away from the
main thread (no signal handler can be installed there), only that hard stop applies.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import MethodFault

FLOOR_S = 300.0  # the least a call may take before it is stopped (5 minutes)
UPDATES = 100  # a call may take this many of the run's slowest update
GRACE_S = 10.0  # past the limit, how long the signal's stop may take before the process is ended


class HookOverran(BaseException):
    """Raised in the main thread inside a method's call that ran past its limit. A BaseException, so the
    method's own ``except Exception`` does not swallow it and go on."""


class HookTimedOut(MethodFault):
    """A method's call ran past its time limit and was stopped: the run ends as a method's fault does (exit
    2, its last checkpoint kept), and a sweep goes on with its other runs."""


@dataclass
class Armed:
    """The call in progress: when it began, when it must have returned, and what to say if it did not."""

    hook: str
    where: str
    began: float
    deadline: float
    limit: float
    signalled: bool = False


class HookClock:
    """The time limit of a run's calls into its method (``watching``), and what it has measured."""

    def __init__(self, fixed: float | None, describe: Callable[[str, str, float], str],
                 source: str = "--hook-time-limit") -> None:
        self.fixed, self.source = fixed, source  # seconds the user set, and where; None: derived from the updates
        self.slowest = 0.0  # seconds of the slowest observe call so far
        self.describe = describe  # (hook, where, limit) -> the paragraph the hard stop writes
        self.armed: Armed | None = None

    def limit(self) -> float:
        return self.fixed if self.fixed is not None else max(FLOOR_S, UPDATES * self.slowest)

    def how(self) -> str:
        """How the limit was set, for the paragraph that names it."""
        if self.fixed is not None:
            return f"the limit {self.source} set"
        return (f"the limit bench derives from the run: {UPDATES} x its slowest update so far "
                f"({self.slowest:.2f} s), at least {FLOOR_S:.0f} s; --hook-time-limit sets another")

    @contextmanager
    def watching(self, hook: str, where: str) -> Iterator[None]:
        """Run one call under the limit; ``HookOverran`` comes out of it when the limit stopped it."""
        if self.armed is not None:  # a call made from inside another (a hook calling predict): the outer one times
            yield
            return
        now = time.monotonic()
        limit = self.limit()
        self.armed = Armed(hook, where, now, now + limit, limit)
        if _watchdog.clock is not self or _watchdog.thread is None or not _watchdog.thread.is_alive():
            _watchdog.watch(self)  # once per run (a call costs microseconds: one per update and eval batch)
        try:
            yield
        finally:
            armed, self.armed = self.armed, None
            if hook == "observe" and armed is not None:
                self.slowest = max(self.slowest, time.monotonic() - armed.began)

    def overdue(self, now: float) -> Armed | None:
        armed = self.armed
        return armed if armed is not None and now >= armed.deadline else None


def _raise_overran(signum: int, frame: Any) -> None:
    clock = _watchdog.clock
    if clock is not None and clock.armed is not None and clock.armed.signalled:
        raise HookOverran()
    if callable(_watchdog.before):  # not the watchdog's: the handler it replaced gets it
        _watchdog.before(signum, frame)


class _Watchdog:
    """The one thread that watches the call in progress of whichever run is active in this process."""

    def __init__(self) -> None:
        self.clock: HookClock | None = None
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self.before: Any = None  # the SIGALRM handler installed before the watchdog's

    def watch(self, clock: HookClock) -> None:
        self.clock = clock
        if threading.current_thread() is threading.main_thread() and \
                (before := signal.getsignal(signal.SIGALRM)) is not _raise_overran:
            self.before = before
            signal.signal(signal.SIGALRM, _raise_overran)
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="bench-hook-watchdog", daemon=True)
                self.thread.start()

    def _loop(self) -> None:
        while True:
            clock = self.clock
            limit = clock.limit() if clock is not None else FLOOR_S
            time.sleep(min(1.0, max(0.05, limit / 20)))
            if clock is None or (armed := clock.overdue(time.monotonic())) is None:
                continue
            if not armed.signalled:
                armed.signalled = True
                if signal.getsignal(signal.SIGALRM) is _raise_overran:
                    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM)
                    continue
            signals = signal.getsignal(signal.SIGALRM) is _raise_overran
            late = time.monotonic() >= armed.deadline + GRACE_S or not signals
            if late and clock.armed is armed:  # still in that very call
                _end_process(clock.describe(armed.hook, armed.where, armed.limit))


def _end_process(paragraph: str) -> None:
    """The hard stop: the paragraph on stderr, then the process ends at once (exit 2, as a fault ends)."""
    try:
        sys.stdout.flush()
        sys.stderr.write(f"\nError: {paragraph}\n")
        sys.stderr.flush()
    finally:
        os._exit(2)


_watchdog = _Watchdog()
