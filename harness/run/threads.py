"""Where a run fixes the CPU's intra-op thread count (why one count, and which: ``harness.results.threads``)
and how its process allocates memory on the CPU."""

from __future__ import annotations

import torch

from ..data.inputs import LIBC
from ..results.threads import CPU_KERNELS, CPU_THREADS


def pin_threads(device: torch.device) -> int:
    """Set the intra-op thread count a run on ``device`` computes with; return the count in use."""
    if device.type == "cpu" and torch.get_num_threads() != CPU_THREADS:
        torch.set_num_threads(CPU_THREADS)
    return torch.get_num_threads()


def cache_tag(device: torch.device) -> str:
    """What a cache made on ``device`` adds to its key: on the CPU, the thread count and the kernel set it
    was computed with (trunk features and trained models alike differ in the last bits otherwise)."""
    if device.type != "cpu":
        return ""
    return f"cpu-threads{CPU_THREADS}-{CPU_KERNELS}"


def cpu_kernels(device: torch.device) -> str | None:
    """The kernel set a run on ``device`` records (``options.cpu_kernels``): on the CPU only."""
    return CPU_KERNELS if device.type == "cpu" else None


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_MMAP_ABOVE = 32 << 20  # glibc's largest mmap threshold on 64-bit machines
_TRIM_ABOVE = 1 << 30


def keep_freed_memory(device: torch.device) -> bool:
    """For a run on the CPU, have glibc's malloc keep freed blocks of up to 32 MiB for reuse; returns
    whether it took the settings.

    By default glibc maps every large block (a batch of activations at 16x16) fresh from the kernel and
    gives it back on free, so each forward pays a page fault per 4 KiB it first touches: a third of
    tiny_cil's evaluation through the whole network. Where the memory lands changes no number; the process
    keeps its heap for reuse instead of returning it (an explicit ``malloc_trim`` still returns it). On
    other devices the activations are not in this heap, and elsewhere than glibc nothing changes.
    """
    mallopt = getattr(LIBC, "mallopt", None)
    if device.type != "cpu" or mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_ABOVE)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_ABOVE))


def prepare_cpu(device: torch.device) -> int:
    """What every process that computes a run (or times one) does first: fix the intra-op thread count and,
    on the CPU, keep freed memory for reuse. Returns the thread count in use."""
    threads = pin_threads(device)
    keep_freed_memory(device)
    return threads
