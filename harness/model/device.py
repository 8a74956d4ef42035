"""Where the numbers are computed: device choice, precision (autocast), memory layout and seeding."""

from __future__ import annotations

import random
from contextlib import AbstractContextManager, nullcontext

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
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise BenchError(f"--device {name} was asked for, but torch sees no CUDA device on this machine.")
    return torch.device(name)


def use_channels_last(model: SplitModel, device: torch.device, amp: bool, cpu_channels_last: bool) -> SplitModel:
    """channels_last where it is faster: the whole model on CUDA (with amp), the body on a CPU with
    oneDNN. Parameters keep their values; only their memory layout changes."""
    if device.type == "cuda" and amp:
        return model.to(memory_format=torch.channels_last)
    if device.type == "cpu" and cpu_channels_last and torch.backends.mkldnn.is_available():
        model.body.to(memory_format=torch.channels_last)
    return model


def autocast(device: torch.device, amp: bool = True) -> AbstractContextManager:
    """bf16 autocast on CUDA (when ``amp``), nothing on the CPU."""
    if amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()
