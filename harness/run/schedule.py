"""When a continual session evaluates and when a FLOP-budgeted session stops: the two schedules a
session follows besides its update count."""

from __future__ import annotations

import math
from collections.abc import Callable

from ..errors import BenchError
from ..model import flops as FL
from ..spec.protocol import Evaluation


class FlopStop:
    """When a FLOP-budgeted session stops: before the update that would take the session's training
    FLOPs (begin_session's work included) past its budget.

    The next update's cost is predicted from the last update's measured cost (the meter's tally around
    it), which holds whatever the method does per update (teacher forwards, replay decoding, declared
    ``extra_macs``), and is exact for a method whose per-update work is constant within a session, as the
    costs change only at session boundaries (head growth, adapters). Before a session's first update it
    is the standard step's cost from the meter's per-sample costs x batch size (forward and backward of
    each part under the current trainability); a budget that cannot pay for that is refused."""

    def __init__(self, tflops: float, spent: Callable[[], float], first: Callable[[], float], what: str) -> None:
        self.macs = tflops * 1e12 / 2  # FLOPs are 2 x MACs
        self.spent, self.first, self.what = spent, first, what
        self.last: float | None = None  # the last update's measured MACs (checkpointed)

    def affordable(self) -> int:
        """Updates the rest of the session's budget pays for at the price of the next one (at least 1): a
        prediction, for a method whose schedule needs a length (OneCycle), made in ``begin_session`` once
        the modifiers have set what trains. Exact when every update costs what the first one does."""
        cost = self.last if self.last is not None else self.first()
        return max(1, math.floor((self.macs - self.spent()) / cost))

    def __call__(self, update: int) -> bool:
        """True: no more updates in this session (``update`` updates made)."""
        cost = self.last if self.last is not None else self.first()
        over = self.spent() + cost > self.macs
        if over and update == 0:
            raise BenchError(
                f"training.budget.tflops ({self.macs * 2 / 1e12:g}) is smaller than one update of {self.what}: "
                f"the session had spent {FL.flops(self.spent()) / 1e12:.3g} TFLOPs before its first update, "
                f"which costs {FL.flops(cost) / 1e12:.3g} TFLOPs. Give a budget of at least a few updates.")
        return over


class EvalSchedule:
    """Whether update ``u`` of a session is an eval point: the protocol's update schedule, or its compute
    schedule (every so many training TFLOPs of the session, and at update 0). The compute schedule
    remembers the session's TFLOPs at the previous look, so it is asked once per update, in order."""

    def __init__(self, spec: Evaluation, session_tflops: Callable[[], float]) -> None:
        self.spec, self.session_tflops = spec, session_tflops
        self.spent_at = session_tflops()

    def due(self, u: int) -> bool:
        if self.spec.tflops is None:
            return self.spec.due(u)
        before, self.spent_at = self.spent_at, self.session_tflops()
        return u == 0 or self.spec.tflops.due(before, self.spent_at)
