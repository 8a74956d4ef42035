"""The process settings a run computes under, set and given back in one place: ``ComputeEnv``.

A run on the CPU fixes the intra-op thread count and the kernel set (``fast``: ``fastconv``'s rewrites
of the small convolutions and ``fastoptim``'s fused AdamW; ``stock``: PyTorch's own kernels), because
both change float sums (``harness.results.comparability``), and has glibc keep freed memory for reuse
(``cpu.keep_freed_memory``), which changes no number. ``ComputeEnv`` holds those settings with the
run's device and resolved precision; ``apply`` makes the process compute under them, and entering it
as a context manager gives the process back what it had on leaving, an exception included. A method is
lent the run's env as ``ctx.compute``: ``ctx.compute.optimizer(groups)`` is the AdamW of its kernel set.

The settings an env applies belong to the whole process, not to a thread or a task: torch's thread
count, glibc's allocator, and ``fastconv``'s switch to the stock convolutions, which the rewritten
modules built into the network read at every forward. So the env the process computes under is one
record per process (``_Process``), written by ``apply`` only: a context variable would let two threads
believe different settings while the process has one. Two of the three cannot be read back (glibc has
no call that reads its thresholds; the stock switch is entered, not queried), which is why the record
is kept at all; the thread count is always read from torch.

The precision is recorded, not applied here: its TF32 switches and bf16 autocast are entered per block
(``device.autocast``), since autocast caches its bf16 copies for as long as it stays entered.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch

from ..results.comparability import CPU_THREADS, KERNEL_SETS
from .cpu import cpu_kernels, keep_freed_memory, release_freed_memory
from .device import PRECISIONS
from .fastconv import stock_kernels
from .fastoptim import adamw


@dataclass(frozen=True)
class ComputeEnv:
    """Where and how a run computes: the device, its precision, the CPU kernel set, the intra-op thread
    count and whether glibc keeps freed memory (``threads`` and ``keep_freed`` None: the process's own,
    as on CUDA). A method reads it and builds its AdamW with ``optimizer``; the harness applies it."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """where the model and the batches are (cpu or cuda)"""
    precision: str = "fp32"
    """fp32, tf32 or bf16: what the run's training and evaluation passes compute in (``device.autocast``)"""
    kernels: str = "fast"
    """the CPU kernel set: ``fast`` or ``stock`` (PyTorch's own kernels)"""
    threads: int | None = None
    """the intra-op thread count it pins; None: the process's own"""
    keep_freed: bool | None = None
    """True: glibc keeps freed blocks for reuse; False: glibc's initial thresholds; None: as they are"""
    _saved: list[ComputeEnv] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kernels not in KERNEL_SETS:
            raise ValueError(f"cpu_kernels {self.kernels!r}: choose one of {', '.join(KERNEL_SETS)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")

    @classmethod
    def for_run(cls, device: torch.device, kernels: str = "fast", precision: str = "fp32") -> ComputeEnv:
        """The env of a run on ``device``: on the CPU the harness's thread count, the ``kernels`` set and
        freed memory kept; elsewhere the ``kernels`` set only (it matters to the CPU alone)."""
        on_cpu = device.type == "cpu"
        return cls(device, precision, kernels, CPU_THREADS if on_cpu else None, True if on_cpu else None)

    @classmethod
    def now(cls) -> ComputeEnv:
        """What the process computes under now, every setting explicit: entered, it gives the process back
        these settings on leaving, whatever was set inside."""
        return dataclasses.replace(_PROCESS.env, threads=torch.get_num_threads())

    def apply(self) -> ComputeEnv:
        """Make the process compute under this env from now on (the harness does, before a run's first
        float operation); returns the env it computed under before."""
        before = ComputeEnv.now()
        if self.threads is not None and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        _PROCESS.use_kernels(self.kernels)
        kept = before.keep_freed
        if self.keep_freed and not kept:
            kept = keep_freed_memory(self.device)
        elif self.keep_freed is False and kept:
            kept = not release_freed_memory()
        _PROCESS.env = dataclasses.replace(self, threads=None, keep_freed=kept)
        return before

    def __enter__(self) -> ComputeEnv:
        self._saved.append(self.apply())
        return self

    def __exit__(self, *exc: object) -> None:
        self._saved.pop().apply()

    def optimizer(self, groups: list[dict[str, Any]]) -> torch.optim.AdamW:
        """AdamW over ``groups`` under this env's kernel set: fused on the CPU (``fast``,
        ``harness.model.fastoptim``), PyTorch's per-tensor loop (``stock``)."""
        return adamw(groups) if self.kernels == "fast" else torch.optim.AdamW(groups)

    @property
    def thread_count(self) -> int:
        """The intra-op thread count it computes with: the one it pins, else the process's now."""
        return self.threads if self.threads is not None else torch.get_num_threads()

    @property
    def kernel_label(self) -> str | None:
        """The kernel set's label a run records (``options.cpu_kernels``): on the CPU only, else None."""
        return cpu_kernels(self.device, self.kernels)


class _Process:
    """The env this process computes under (the one ``apply`` wrote last; its thread count is read from
    torch, so it keeps None there) and, while the stock set is chosen, the open stock-kernel switch."""

    def __init__(self) -> None:
        self.env = ComputeEnv(keep_freed=False)  # a fresh process: fast kernels, glibc's own allocator
        self._stock: ExitStack | None = None

    def use_kernels(self, name: str) -> None:
        if name == "stock" and self._stock is None:
            self._stock = ExitStack()
            self._stock.enter_context(stock_kernels())
        elif name == "fast" and self._stock is not None:
            self._stock.close()
            self._stock = None


_PROCESS = _Process()


def cpu_settings_restored() -> ComputeEnv:
    """A block that gives the process back the thread count, kernel set and allocator thresholds it had
    before, whatever a run inside it applied: a notebook that calls the Python API keeps its own threads.
    (The allocator's thresholds go back to glibc's initial values, since glibc has no call that reads them.)"""
    return ComputeEnv.now()

