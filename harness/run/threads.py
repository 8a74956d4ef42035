"""Where a run fixes the CPU's intra-op thread count (why one count, and which: ``harness.results.threads``)."""

from __future__ import annotations

import torch

from ..results.threads import CPU_KERNELS, CPU_THREADS


def pin_threads(device: torch.device) -> int:
    """Set the intra-op thread count a run on ``device`` computes with; return the count in use."""
    if device.type == "cpu" and torch.get_num_threads() != CPU_THREADS:
        torch.set_num_threads(CPU_THREADS)
    return torch.get_num_threads()


def cache_tag(device: torch.device, body: bool = False) -> str:
    """What a cache made on ``device`` adds to its key: the thread count it was computed with, on the CPU,
    and, for what the body computed (``body``: a trained model), the CPU kernel set."""
    if device.type != "cpu":
        return ""
    return f"cpu-threads{CPU_THREADS}" + (f"-{CPU_KERNELS}" if body else "")


def cpu_kernels(device: torch.device) -> str | None:
    """The kernel set a run on ``device`` records (``options.cpu_kernels``): on the CPU only."""
    return CPU_KERNELS if device.type == "cpu" else None
