"""The CPU's intra-op thread count, fixed by the harness so that numbers do not depend on the machine.

torch splits a CPU reduction (a convolution, a matmul, a sum) among its intra-op threads, and the
order in which the partial sums are added depends on how many there are: the same seed on the same
machine gives other weights under 1 thread than under 2, and every later stage inherits the
difference (the deployed model, the trunk features, the joint references, every score against them).
The default count is the machine's core count (or ``OMP_NUM_THREADS``), so left alone two people
running the same command would get two leaderboards.

So a run on the CPU trains and evaluates with ``CPU_THREADS`` intra-op threads whatever the machine
offers, the count is recorded on every result (``options.torch_threads``), stored runs made with another
count on the CPU are set apart (never a reference, never ranked), and the caches a run reuses carry the
count in their keys. One thread because, on the small models the CPU protocols use, a second thread
bought little and cost much on a shared machine: a reduced tiny_cil pre-training took 11-15 s on one
thread and 108 s on two with the machine's two cores shared with other jobs. Parallelism on the CPU
comes from running several runs at once (``bench sweep``), each on its own core.

On CUDA the numbers come from the GPU, so the CPU's thread count is left as it is (recorded all the same).
"""

from __future__ import annotations

from typing import Any

import torch

CPU_THREADS = 1


def pin_threads(device: torch.device) -> int:
    """Set the intra-op thread count a run on ``device`` computes with; return the count in use."""
    if device.type == "cpu" and torch.get_num_threads() != CPU_THREADS:
        torch.set_num_threads(CPU_THREADS)
    return torch.get_num_threads()


def cache_tag(device: torch.device) -> str:
    """What a cache made on ``device`` adds to its key: the thread count it was computed with, on the CPU."""
    return f"cpu-threads{CPU_THREADS}" if device.type == "cpu" else ""


def thread_problem(options: dict[str, Any]) -> str | None:
    """Why a stored run's numbers are not comparable with a run made now, as far as the thread count
    goes: it ran on the CPU with another intra-op thread count (older runs that did not record it count)."""
    device, threads = str(options.get("device", "")), options.get("torch_threads")
    if device.startswith("cpu") and threads is not None and threads != CPU_THREADS:
        return (f"made on the CPU with {threads} intra-op threads (runs now compute with {CPU_THREADS}, "
                f"and the thread count changes float results)")
    return None
