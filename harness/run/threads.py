"""Where a run fixes the CPU's intra-op thread count (why one count, and which: ``harness.results.threads``)."""

from __future__ import annotations

import torch

from ..results.threads import CPU_THREADS


def pin_threads(device: torch.device) -> int:
    """Set the intra-op thread count a run on ``device`` computes with; return the count in use."""
    if device.type == "cpu" and torch.get_num_threads() != CPU_THREADS:
        torch.set_num_threads(CPU_THREADS)
    return torch.get_num_threads()


def cache_tag(device: torch.device) -> str:
    """What a cache made on ``device`` adds to its key: the thread count it was computed with, on the CPU."""
    return f"cpu-threads{CPU_THREADS}" if device.type == "cpu" else ""
