"""The machine a run computes on, as torch sees it once loaded: the label of its arithmetic (part of every
run's identity, ``harness.numerics``) and the record of the CPU, the math libraries' builds and the GPU that
each result carries, so a number can always be traced to where it was made."""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from typing import Any

import torch

from ..numerics import GpuInfo, cpu_label, cpu_model, cpu_vendor, gpu_label, native_isa, pin_set, pins_in_force


def cpu_capability() -> str:
    """The vector instruction set ATen's kernels use in this process (AVX2, AVX512, DEFAULT, ...)."""
    return str(torch.backends.cpu.get_cpu_capability())


@lru_cache(maxsize=1)
def math_builds() -> dict[str, str]:
    """The MKL and oneDNN builds torch carries (from its build report): they pick the CPU code paths."""
    shown = torch.__config__.show()
    out = {}
    if (mkl := re.search(r"Math Kernel Library Version ([0-9.]+)", shown)) is not None:
        out["mkl"] = mkl.group(1)
    if (dnnl := re.search(r"(?:MKL-DNN|oneDNN) v([^\s]+)", shown)) is not None:
        out["onednn"] = dnnl.group(1)
    return out


@lru_cache(maxsize=8)
def gpu_info(index: int) -> GpuInfo:
    """The CUDA device's model, compute capability and the CUDA, cuDNN and driver versions in use."""
    try:
        props = torch.cuda.get_device_properties(index)
    except (RuntimeError, AssertionError):  # no driver to ask (a planning host); the label then says so
        return GpuInfo(name="unknown", capability="", cuda=str(torch.version.cuda), cudnn="", driver=None)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return GpuInfo(name=props.name, capability=f"{props.major}{props.minor}", cuda=str(torch.version.cuda),
                   cudnn=str(cudnn), driver=_driver_version())


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.split("\n")[0].strip() or None if out.returncode == 0 else None


def numerics_label(device: torch.device) -> str:
    """What, of the machine, a run on ``device`` computes with: the label that keeps runs apart
    (``harness.numerics``). On the CPU the capability torch reports must agree with the pins for the
    run to count as pinned (torch imported before bench keeps whatever it found)."""
    if device.type == "cuda":
        return gpu_label(gpu_info(device.index or 0))
    if device.type == "cpu":
        return cpu_label(cpu_capability())
    return f"{device.type}-{cpu_label(cpu_capability())}"


def machine_record(device: torch.device) -> dict[str, Any]:
    """What a result records of its machine: the CPU, the capability ATen uses, the math libraries' builds,
    the pins in force and, on CUDA, the GPU and its software."""
    pins = pins_in_force()
    record: dict[str, Any] = {
        "cpu_model": cpu_model(), "cpu_vendor": cpu_vendor(), "cpu_isa": native_isa(),
        "cpu_capability": cpu_capability(), **math_builds(),
        "pins": pins, "pin_set": pin_set(pins)}
    if device.type == "cuda":
        gpu = gpu_info(device.index or 0)
        record.update(gpu=gpu.name, gpu_capability=gpu.capability, cuda=gpu.cuda, cudnn=gpu.cudnn,
                      driver=gpu.driver)
    return record
