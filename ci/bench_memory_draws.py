"""How long a draw from a rehearsal memory holding a million ids takes, and a lent-input membership check:
a Places-LT protocol's memory holds the pre-training data, so every update pays these.
Usage: python ci/bench_memory_draws.py  (prints ms per call; compare two commits in one session)"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

from bench_stability_gap.harness.run.isolation import LentInputs
from bench_stability_gap.harness.run.memory import Memory
from bench_stability_gap.harness.spec.protocol import Memory as MemorySpec

HELD = 1_280_000


def per_call_ms(call: Callable[[int], object], repeats: int = 20) -> float:
    call(0)
    start = time.perf_counter()
    for i in range(repeats):
        call(i)
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    labels = np.random.default_rng(0).integers(0, 1000, HELD + 20_000)
    memory = Memory(MemorySpec(policy="unlimited", capacity=None), labels, lambda gid: 1, np.random.default_rng(1))
    memory.add(range(HELD), pretrain=True)
    lent = LentInputs(SimpleNamespace(get=lambda ids: ids), memory, "probe", np.arange(HELD))  # type: ignore[arg-type]
    print(f"memory of {HELD:,} ids")
    print(f"  sample(64)                 {per_call_ms(lambda i: memory.sample(64)):8.3f} ms")
    print(f"  sample_by_source(40, 24)   {per_call_ms(lambda i: memory.sample_by_source(40, 24, HELD - 80_000)):8.3f} ms")
    print(f"  ctx.inputs.get(64 ids)     {per_call_ms(lambda i: lent.get(np.arange(i * 64, i * 64 + 64))):8.3f} ms")


if __name__ == "__main__":
    main()
