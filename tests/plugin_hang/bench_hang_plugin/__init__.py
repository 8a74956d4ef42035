"""Methods that never return from a hook: an endless Python loop (in observe, in predict), a sleep, and a
loop that catches every exception, so that only ending the process stops it."""

from __future__ import annotations

import os
import time

from bench_stability_gap.methods.baselines import Vanilla


def spin() -> None:
    while True:  # the endless loop: the line a stopped call names
        pass


def fixed() -> bool:
    """BENCH_HANG=0: the bug is fixed (a rerun resumes and finishes)."""
    return os.environ.get("BENCH_HANG") == "0"


class HangInObserve(Vanilla):
    """Trains normally, then loops forever in its second update (of this process)."""

    name = "hang_observe"
    calls = 0

    def observe(self, batch):
        self.calls += 1
        if self.calls == 2 and not fixed():
            spin()
        return super().observe(batch)


class HangInPredict(Vanilla):
    """Loops forever the first time it is asked to predict."""

    name = "hang_predict"

    def predict(self, x):
        spin()


class SleepInEndSession(Vanilla):
    """Waits forever at the end of its first session (a blocking call, not a Python loop)."""

    name = "hang_sleep"

    def end_session(self, session) -> None:
        time.sleep(10**6)


class SwallowsTheStop(Vanilla):
    """Waits forever in its second update and catches every exception, the time limit's stop included. It
    waits rather than spins: only the grace period's end stops it, and spinning would burn a core for it."""

    name = "hang_swallow"
    calls = 0

    def observe(self, batch):
        self.calls += 1
        while self.calls == 2:
            try:
                time.sleep(3600)
            except BaseException:  # noqa: BLE001 - the point: nothing raised into it can end it
                pass
        return super().observe(batch)
