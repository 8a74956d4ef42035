"""The budget, enforced rather than trusted: what a method may do per update, and nowhere else.

Exactly one optimizer step per ``observe`` and none outside it (session hooks, ``predict``), at most
the protocol's batch trained on (backward through any part) per update, and the memory never above
its cap. What is counted, and each breach in words; ``referee`` holds the rules and fails the run with a
BenchError naming the method and the rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook

from ...methods.base import Method, StepStats, TrainBatch
from ..model import flops as FL
from ..spec.protocol import Memory as MemorySpec
from ..spec.protocol import Protocol
from .memory import Memory


class StepCounter:
    """The optimizer steps taken anywhere while ``count_optimizer_steps`` counts into it."""

    __slots__ = ("n",)

    def __init__(self, n: int = 0) -> None:
        self.n = n

    def add(self, *_: object) -> None:  # torch's post-step hook: (optimizer, args, kwargs)
        self.n += 1


@contextmanager
def count_optimizer_steps(counter: StepCounter | None = None) -> Iterator[StepCounter]:
    """Count every optimizer step taken anywhere into ``counter`` (a new one by default): the budget is
    enforced, not trusted."""
    counter = StepCounter() if counter is None else counter
    handle = register_optimizer_step_post_hook(counter.add)
    try:
        yield counter
    finally:
        handle.remove()


@dataclass(frozen=True, slots=True)
class Observed:
    """One ``observe`` call as the budget counts it: what the method returned, the optimizer steps it made,
    the samples it trained on (backward through ``part``) and the protocol's batch (``limit``)."""

    stats: StepStats
    made: int
    trained: int
    part: str
    limit: int


def observe_counted(method: Method, batch: TrainBatch, steps: StepCounter, meter: FL.FlopMeter | None,
                    limit: int, guard: AbstractContextManager[Any] | None = None) -> Observed:
    """One ``observe``, its optimizer steps and trained samples counted (``referee`` judges them).
    ``guard``: entered around the ``observe`` call alone (the run's ``MethodCalls``), so what the method's
    code raises is told apart from what the harness's does."""
    before = steps.n
    if meter is not None:
        meter.start_update()
    with guard or nullcontext():
        stats = method.observe(batch)
    made = steps.n - before
    trained, part = meter.end_update() if meter is not None else (0, "")
    return Observed(stats, made, trained, part, limit)


def steps_in_observe(method: Method, observed: Observed) -> str | None:
    """More or fewer optimizer steps than one in an ``observe`` call, in words."""
    if observed.made == 1:
        return None
    return f"Method {method.name!r} made {observed.made} optimizer steps in one observe() call."


def trained_beyond_batch(method: Method, observed: Observed) -> str | None:
    """Backward through more samples than the protocol's batch in one update, in words."""
    if observed.trained <= observed.limit:
        return None
    return (f"Method {method.name!r} trained on {observed.trained} samples in one update (backward through the "
            f"{observed.part}); the protocol's batch allows {observed.limit} per update.")


def stray_steps(method: Method, steps: int, expected: int, where: str) -> str | None:
    """Optimizer steps outside ``observe`` (session hooks, predict) are updates the budget never granted."""
    if steps == expected:
        return None
    return f"Method {method.name!r} made {steps - expected} optimizer step(s) outside observe() ({where})."


def memory_overfilled(method: Method, memory: Memory) -> str | None:
    """The storage cap is the harness's: a memory over it, in words."""
    cap = memory.capacity
    if cap is None or len(memory) <= cap:
        return None
    return (f"Method {method.name!r} overfilled the rehearsal memory: {len(memory)} samples stored, "
            f"the protocol's cap is {cap} (memory.policy {memory.spec.policy!r}).")


def eviction_note(protocol: Protocol, method: Method) -> str | None:
    """Why a method whose own rule is its memory's eviction (GDumb) is, on this protocol, its base rehearsal by
    construction: an unlimited memory evicts nothing (and none stores nothing). None where the rule acts."""
    if not method.memory_policy or protocol.memory.policy not in ("unlimited", "none"):
        return None
    return (f"{method.name}'s own rule is its memory's eviction ({method.memory_policy}), and {protocol.name}'s "
            f"memory is {protocol.memory.policy!r}: nothing is ever evicted, so it trains exactly as vanilla "
            f"rehearsal does and its numbers are vanilla's, not a test of {method.name}")


def memory_spec(protocol: Protocol, method: Method) -> MemorySpec:
    """The protocol's storage cap, under the method's own eviction policy when it has one (GDumb).
    ``split`` stays: the paper bounds every method's buffer by its S1/stream shares, and its stream
    part already evicts from the largest class as GDumb does."""
    spec = protocol.memory
    if (method.memory_policy and spec.policy not in ("unlimited", "none", "split") and
            method.memory_policy != spec.policy):
        spec = spec.model_copy(update={"policy": method.memory_policy})
    return spec
