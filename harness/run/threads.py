"""Where a run fixes the CPU's intra-op thread count and kernel set (why, and which:
``harness.results.comparability``) and how its process allocates memory on the CPU; and how a library call
gives the process its settings back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..data.inputs import LIBC
from ..model.kernels import current, use_kernels
from ..results.comparability import CPU_THREADS, kernel_label


def pin_threads(device: torch.device) -> int:
    """Set the intra-op thread count a run on ``device`` computes with; return the count in use."""
    if device.type == "cpu" and torch.get_num_threads() != CPU_THREADS:
        torch.set_num_threads(CPU_THREADS)
    return torch.get_num_threads()


def cache_tag(device: torch.device, kernels: str = "fast") -> str:
    """What a cache made on ``device`` adds to its key: on the CPU, the thread count and the kernel set it
    was computed with (trunk features and trained models alike differ in the last bits otherwise)."""
    if device.type != "cpu":
        return ""
    return f"cpu-threads{CPU_THREADS}-{kernel_label(kernels)}"


def cpu_kernels(device: torch.device, kernels: str = "fast") -> str | None:
    """The kernel set's label a run on ``device`` records (``options.cpu_kernels``): on the CPU only."""
    return kernel_label(kernels) if device.type == "cpu" else None


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


_GLIBC_DEFAULT = 128 << 10  # glibc's initial mmap and trim thresholds
_KEPT = [False]  # whether this process took keep_freed_memory's settings


def prepare_cpu(device: torch.device, kernels: str = "fast") -> int:
    """What every process that computes a run (or times one) does first: fix the intra-op thread count and
    the kernel set and, on the CPU, keep freed memory for reuse. Returns the thread count in use."""
    threads = pin_threads(device)
    use_kernels(kernels)
    _KEPT[0] = keep_freed_memory(device) or _KEPT[0]
    return threads


@contextmanager
def cpu_settings_restored() -> Iterator[None]:
    """Give the process back the thread count, kernel set and allocator thresholds it had before the
    block, whatever a run inside it set: a notebook that calls the Python API keeps its own threads. (The
    allocator's thresholds go back to glibc's initial values, since glibc has no call that reads them.)"""
    threads, kernels, kept = torch.get_num_threads(), current(), _KEPT[0]
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        use_kernels(kernels)
        if _KEPT[0] and not kept and (mallopt := getattr(LIBC, "mallopt", None)) is not None:
            mallopt(_M_MMAP_THRESHOLD, _GLIBC_DEFAULT)
            mallopt(_M_TRIM_THRESHOLD, _GLIBC_DEFAULT)
            _KEPT[0] = False
