"""How a process computes on the CPU: the intra-op thread count a run fixes and the kernel set's label
(why, and which: ``harness.results.comparability``), how the process allocates memory (glibc's
allocator, through the C library handle) and how many rows a CPU forward takes at a time. Which of these
settings a run applies, and how a library call gives the process its own back: ``compute.ComputeEnv``."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from ..results.comparability import execution, kernel_label
from .machine import numerics_label

LIBC: ctypes.CDLL | None
try:
    LIBC = ctypes.CDLL(None)  # the process's C library (glibc on Linux): malloc_trim, mallopt
except OSError:  # no C library to load symbols from: nothing to trim
    LIBC = None


# Rows per forward on the CPU. Elementwise ops (norms, activations, residual adds, padding) are bound by
# memory bandwidth, so a chunk's activations should stay in cache, while too few rows leave the GEMMs thin
# and pay the per-call overhead once per handful of images. The chunk is chosen from the widest activation
# one row makes (``widest_row_bytes``): the largest power of two whose chunk keeps it within
# ``CPU_ACTIVATION_BUDGET`` (half of a 32 MiB server L3; the block's other tensors and weights fit beside
# it), between ``CPU_FORWARD_CHUNK`` and ``CPU_FORWARD_CHUNK_MAX`` rows. ConvNeXt at 224 px (2.4 MB per image
# at its widest) gets 16, as measured by ``ci/cpu_chunk_speed.py`` (1.75x faster than 128 for the trunk);
# tiny_cil's body over cached 2x2 trunk features (43 KB per row) gets 256, 4-5x faster than 16.
# No layer mixes samples in eval mode, so the outputs equal a whole-batch forward's up to float rounding
# (oneDNN picks kernels by batch size): eval predictions agree unless two logits tie within ~1e-7.
CPU_ACTIVATION_BUDGET = 16 << 20
CPU_FORWARD_CHUNK = 16
CPU_FORWARD_CHUNK_MAX = 256
# The trunk pass that fills a feature table (or streams features) keeps 16 rows whatever the model: its
# features feed training and are stored on disk, so its chunk is part of every cached run's numbers.
TRUNK_PASS_CHUNK = CPU_FORWARD_CHUNK


class _WidestRow(TorchFunctionMode):
    """Records the largest per-row output (bytes) of any torch function called inside."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows, self.bytes = rows, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, Tensor) and out.ndim >= 2 and out.shape[0] == self.rows:  # not weights
            self.bytes = max(self.bytes, out.numel() * out.element_size() // self.rows)
        return out


def widest_row_bytes(forward: Callable[[Tensor], Tensor], x: Tensor) -> int:
    """Bytes of the widest activation one row of ``x`` makes through ``forward`` (one forward of two rows,
    gradient-free; run it where no FLOP meter counts, or pause the meter)."""
    probe = x[:2]
    mode = _WidestRow(len(probe))
    with torch.no_grad(), mode:
        forward(probe)
    return mode.bytes


def cpu_forward_chunk(row_bytes: int) -> int:
    """Rows per CPU forward for a model whose widest activation is ``row_bytes`` per row (see above)."""
    rows = CPU_ACTIVATION_BUDGET // max(1, row_bytes)
    chunk = 1 << max(0, rows.bit_length() - 1)  # the largest power of two <= rows
    return min(CPU_FORWARD_CHUNK_MAX, max(CPU_FORWARD_CHUNK, chunk))


def in_cpu_chunks(forward: Callable[[Tensor], Tensor], x: Tensor, chunk: int | None = None) -> Tensor:
    """``forward(x)``, ``chunk`` rows at a time on the CPU (by default chosen from the widest activation,
    ``cpu_forward_chunk``; the same values up to float rounding, deterministically); other devices get
    the whole batch. For gradient-free forwards whose rows are independent (eval, the frozen trunk)."""
    if x.device.type != "cpu":
        return forward(x)
    if chunk is None:
        chunk = cpu_forward_chunk(widest_row_bytes(forward, x))
    if len(x) <= chunk:
        return forward(x)
    return torch.cat([forward(part) for part in x.split(chunk)])


def cache_tag(device: torch.device, kernels: str = "fast") -> str:
    """What a cache made on ``device`` adds to its key: the machine arithmetic and, on the CPU, the thread
    count and the kernel set it was computed with (trunk features and trained models alike differ in the
    last bits otherwise)."""
    return execution(device.type, numerics_label(device), kernels).cache_tag


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


def release_freed_memory() -> bool:
    """Undo ``keep_freed_memory``: glibc's initial thresholds again (glibc has no call that reads the ones
    it had); returns whether it took them (False elsewhere than glibc)."""
    mallopt = getattr(LIBC, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _GLIBC_DEFAULT)) and bool(mallopt(_M_TRIM_THRESHOLD, _GLIBC_DEFAULT))
