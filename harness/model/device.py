"""Where the numbers are computed: device choice, precision (autocast), memory layout and seeding."""

from __future__ import annotations

import random
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch

from ..errors import BenchError
from .backbone import SplitModel


def seed_everything(seed: int) -> torch.Generator:
    """Seed every RNG before any model is built, so head and LoRA init are reproducible."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    """The device ``--device`` names: one torch reports on this machine (auto, cpu, cuda, cuda:N, mps where
    present). Anything else (tpu, xla, meta, cpu:0, '') would fail mid-run or train on a device that computes
    nothing, so every path that picks a device refuses it here, before any compute."""
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    known = ["auto", "cpu"] + (["cuda"] + [f"cuda:{i}" for i in range(cuda)] if cuda else []) + ["mps"] * mps
    if name not in known:
        have = (f"{cuda} CUDA device(s)" if cuda else "no CUDA device") + (" and Apple's MPS" if mps else "")
        raise BenchError(f"--device {name!r} is not a device bench can train on here: torch reports {have}. "
                         f"Give one of: {', '.join(known)}.")
    if name == "auto":
        return torch.device("cuda" if cuda else "cpu")
    return torch.device(name)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``. A host tensor bound for CUDA goes through pinned memory without blocking: a plain
    ``.to("cuda")`` of pageable memory waits until the GPU has run everything queued before the copy, which
    would stall the host once per batch."""
    if device.type != "cuda" or t.device.type == "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def use_channels_last(model: SplitModel, device: torch.device, precision: str) -> SplitModel:
    """channels_last where it is faster: the whole model on CUDA under bf16. Parameters keep their values;
    only their memory layout changes. (On the CPU the kernel set's matrix products beat oneDNN's
    channels_last convolutions, which also moved the numbers, so the CPU keeps the default layout.)"""
    if device.type == "cuda" and precision == "bf16":
        return model.to(memory_format=torch.channels_last)
    return model


PRECISIONS = ("fp32", "tf32", "bf16")


def check_precision(precision: str | None, device: torch.device) -> None:
    """A precision the device has: TF32 is a math mode of NVIDIA tensor cores, so on any other device a
    ``tf32`` run would be an fp32 run under another name (and another identity)."""
    if precision is not None and precision not in PRECISIONS:
        raise BenchError(f"--precision {precision!r} must be one of {', '.join(PRECISIONS)}.")
    if precision == "tf32" and device.type != "cuda":
        raise BenchError(f"--precision tf32 needs a CUDA device (TF32 is a tensor-core math mode); on {device} "
                         f"use fp32, the same arithmetic.")


def set_tf32(precision: str) -> tuple[bool, bool]:
    """Set the TF32 switches for ``precision``; returns the values they had. fp32 and bf16: torch's
    defaults, which are torch 1.12's (the published environment): matmuls in full float32, cuDNN
    convolutions allowed TF32; tf32: matmuls allowed TF32 as well. No effect without tensor cores."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = True
    return before


class autocast(AbstractContextManager):  # noqa: N801 - used as a function, as torch.autocast
    """The run's arithmetic for a block: the TF32 switches of ``precision`` (restored after it) and, under
    bf16, autocast to bfloat16 on the device. Reusable: the runner enters one object at every update."""

    def __init__(self, device: torch.device, precision: str) -> None:
        self.device, self.precision = device, precision
        self._saved: list[tuple[tuple[bool, bool], AbstractContextManager]] = []

    def __enter__(self) -> autocast:
        cast = torch.autocast(self.device.type, dtype=torch.bfloat16) if self.precision == "bf16" else nullcontext()
        self._saved.append((set_tf32(self.precision), cast))
        cast.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        (matmul, cudnn), cast = self._saved.pop()
        cast.__exit__(*exc)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
