"""The budget, enforced rather than trusted: what a method may do per update, and nowhere else.

Exactly one optimizer step per ``observe`` and none outside it (session hooks, ``predict``), at most
the protocol's batch trained on (backward through any part) per update, and the memory never above
its cap. A breach fails the run with a BenchError naming the method and the rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import numpy as np
from torch.optim.optimizer import register_optimizer_step_post_hook

from ...methods.base import Method, StepStats, TrainBatch
from ..errors import BenchError
from ..model import flops as FL
from ..spec.protocol import Memory as MemorySpec
from ..spec.protocol import Protocol
from .memory import Memory, Overfilled


@contextmanager
def count_optimizer_steps() -> Iterator[list[int]]:
    """Count every optimizer step taken anywhere (the budget is enforced, not trusted)."""
    counter = [0]
    handle = register_optimizer_step_post_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    try:
        yield counter
    finally:
        handle.remove()


def observe_within_budget(method: Method, batch: TrainBatch, steps: list[int], meter: FL.FlopMeter | None,
                          limit: int, guard: AbstractContextManager[Any] | None = None) -> tuple[StepStats, int]:
    """One ``observe`` under the budget: exactly one optimizer step and at most ``limit`` samples
    trained on (backward through any part). Returns the method's stats and the samples trained.
    ``guard``: entered around the ``observe`` call alone (the run's ``MethodCalls``), so what the method's
    code raises is told apart from what the harness's does."""
    before = steps[0]
    if meter is not None:
        meter.start_update()
    with guard or nullcontext():
        stats = method.observe(batch)
    made = steps[0] - before
    if made != 1:
        raise BenchError(
            f"Method {method.name!r} made {made} optimizer steps in one observe() call; "
            f"the protocol's budget is exactly one update per call."
        )
    trained = 0
    if meter is not None:
        trained, part = meter.end_update()
        if trained > limit:
            raise BenchError(
                f"Method {method.name!r} trained on {trained} samples in one update (backward through the "
                f"{part}); the protocol's batch allows {limit} per update. Extra forward passes without "
                f"gradient (teacher logits, init passes) are allowed and counted as FLOPs; training samples are not."
            )
    return stats, trained


def check_no_stray_steps(method: Method, steps: int, expected: int, where: str) -> None:
    """Optimizer steps outside ``observe`` (session hooks, predict) are updates the budget never granted."""
    if steps != expected:
        raise BenchError(
            f"Method {method.name!r} made {steps - expected} optimizer step(s) outside observe() ({where}); "
            f"the protocol's budget is exactly one update per observe() call and none elsewhere."
        )


def check_memory(method: Method, memory: Memory) -> None:
    """The storage cap is the harness's: a method that overfills the memory fails the run."""
    cap = memory.capacity
    if cap is not None and len(memory) > cap:
        raise BenchError(
            f"Method {method.name!r} overfilled the rehearsal memory: {len(memory)} samples stored, "
            f"the protocol's cap is {cap} (memory.policy {memory.spec.policy!r})."
        )


def add_to_memory(method: Method, memory: Memory, ids: np.ndarray) -> None:
    """Offer ``ids`` to the memory; an overfilled memory fails the run naming the method."""
    try:
        memory.add(ids)
    except Overfilled:
        check_memory(method, memory)  # the error that names the method and the cap
        raise
    check_memory(method, memory)


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
