"""The roofline a stage is measured against: a square GEMM's achieved rate on the device, in the
precision the stage computes in, and the device-synchronised timing both ``bench perf`` reports use."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads when a report runs, not when the CLI starts
    import torch

GEMM_SIZE = 1024  # large enough that the GEMM is compute bound, small enough to time in ~0.1 s per thread


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def device_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of ``fn`` with the device idle before and after (its queued work counted)."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def roofline_precision(device: torch.device, amp: bool) -> str:
    """The precision a stage's GEMMs run in, so the roofline is measured in it: bf16 under CUDA
    autocast (whose tensor cores peak far above fp32's), fp32 otherwise."""
    return "bf16" if amp and device.type == "cuda" else "fp32"


def gemm_gmacs(device: torch.device, size: int = GEMM_SIZE, calls: int = 4, precision: str = "fp32") -> float:
    """Achieved GMAC/s of ``calls`` ``size`` x ``size`` matmuls on ``device`` in ``precision`` (one timing)."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b  # first call: allocation, kernel choice
    spent = device_seconds(lambda: [a @ b for _ in range(calls)], device)
    return calls * size**3 / spent / 1e9
