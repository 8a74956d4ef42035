"""Which arithmetic a run's numbers come from, beyond protocol, method, seed and precision: the CPU code paths
the math libraries pick, and the machine they ran on.

The math libraries choose their code path from the CPU they find: ATen's vectorised kernels (elementwise
ops, reductions, the optimizer's arithmetic) by the widest instruction set it offers, oneDNN's convolutions
likewise, MKL's matrix products by vendor, instruction set and cache sizes. Each path adds in its own order,
so the same seed and settings on an AVX-512 machine and on an AVX2 one give other last bits, and training is
chaotic: a last-bit difference in the deployed model acts like another seed. Measured with tiny_cil_quick
(seed 0, one thread, the same code and versions) on an AMD EPYC with AVX-512: S_Δ 0.201 as it comes,
0.245 with ATen capped at AVX2, which is exactly what an AMD EPYC that only has AVX2 gives.

So a CPU run computes with the **pins** below, set in the environment before torch is first imported (the
package's import does it, see ``apply_pins``): every x86-64 machine with AVX2 then takes the AVX2 paths.
What a pin cannot fix stays part of a run's identity (``numerics_label``): MKL follows its named branches
only on Intel CPUs (on another vendor's it reports ``CNR:AUTO`` for them), so the CPU vendor is in the label;
the vendor-independent branch (``MKL_CBWR=COMPATIBLE``) is offered as ``BENCH_CPU_PINS=portable``, at its
cost in speed. Unpinned runs (``BENCH_CPU_PINS=off``, a machine without AVX2, or torch imported with other
settings before bench) are labelled with the CPU model and the instruction set in force, so they never
share a row, a reference or an "already stored" answer with pinned runs or with another machine's.
On CUDA the GPU model and the CUDA and cuDNN versions pick the kernels: they make the label.

This module is torch-free at import: the package imports it before torch, and the label of a CPU run can
be known without loading torch.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import BenchError

PINS_VARIABLE = "BENCH_CPU_PINS"
PIN_MODES = ("on", "portable", "off")
# The x86-64 pins: the instruction set every AVX2 machine has, for each library that picks its own.
# MKL's is its conditional numerical reproducibility branch: honoured on Intel CPUs, read as AUTO elsewhere.
AVX2_PINS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}
# ``portable``: MKL's vendor-independent branch instead, the same on every vendor's CPU.
PORTABLE_PINS = {**AVX2_PINS, "MKL_CBWR": "COMPATIBLE"}
PIN_NAMES = tuple(AVX2_PINS)

_STATE: dict[str, Any] = {}  # what ``apply_pins`` found and did, once per process


def pin_mode() -> str:
    """``$BENCH_CPU_PINS``: on (the default), portable, or off."""
    value = os.environ.get(PINS_VARIABLE, "on").strip().lower() or "on"
    if value not in PIN_MODES:
        raise BenchError(f"{PINS_VARIABLE}={value!r} must be on (the default: every x86-64 machine with AVX2 "
                         "computes on the AVX2 paths), portable (also MKL's vendor-independent branch, slower) or "
                         "off (each library's own choice for this CPU; runs are then labelled with the CPU).")
    return value


@lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags() -> frozenset[str]:
    return frozenset(_cpuinfo().get("flags", "").split())


def cpu_model() -> str:
    """The CPU's model name, as the kernel reports it."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_vendor() -> str:
    """``intel``, ``amd`` or what the kernel reports: MKL picks its branches by it."""
    vendor = _cpuinfo().get("vendor_id", "")
    return {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(vendor, vendor.lower() or platform.machine().lower())


def native_isa() -> str:
    """The widest vector instruction set ATen would pick here: avx512, avx2 or default (what its CPU
    capability check asks for: AVX-512 F, BW, VL and DQ; AVX2 with FMA)."""
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "default"


def _pinnable() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and native_isa() in ("avx2", "avx512")


def wanted_pins() -> dict[str, str]:
    """The pins this process should compute with: none when off or where the machine cannot take them."""
    mode = pin_mode()
    if mode == "off" or not _pinnable():
        return {}
    return dict(PORTABLE_PINS if mode == "portable" else AVX2_PINS)


def apply_pins() -> None:
    """Set the pins in the environment, before torch is imported (the libraries read them once, at load).
    A pin the user set otherwise is left as it is (the label then says the run is not pinned); so is
    everything once torch was imported before bench, whose choice is then whatever was in force."""
    if _STATE:
        return
    torch_loaded = "torch" in sys.modules
    try:
        wanted = wanted_pins()
    except BenchError:  # a malformed setting is refused by check_environment with its paragraph
        wanted = {}
    if not torch_loaded:
        for name, value in wanted.items():
            os.environ.setdefault(name, value)
    # what the libraries loaded with: the environment now, when bench set it before torch; when torch came
    # first, the same settings were in the environment when it loaded (bench sets none after it)
    _STATE.update(at_load={name: os.environ.get(name) for name in PIN_NAMES})


def pins_in_force() -> dict[str, str]:
    """The pin settings the libraries loaded with: those in the environment when bench was imported (set by
    bench before torch loaded, or by the user before a process that imported torch first). ATen's reports
    itself (``cpu_label``'s ``capability``); the others are taken as the environment held them."""
    apply_pins()
    return {k: v for k, v in (_STATE.get("at_load") or {}).items() if v is not None}


def pin_set(pins: dict[str, str]) -> str | None:
    """The name of the pin set ``pins`` are: ``avx2`` or ``avx2-portable``; None when they are not one."""
    normal = {k: v.strip().upper() for k, v in pins.items()}
    if normal == {k: v.upper() for k, v in PORTABLE_PINS.items()}:
        return "avx2-portable"
    if normal == {k: v.upper() for k, v in AVX2_PINS.items()}:
        return "avx2"
    return None


def torch_free_device(name: str) -> str | None:
    """The device ``--device name`` resolves to, where that is known without torch: ``cpu`` when asked for,
    or for ``auto`` on a machine with no NVIDIA (or ROCm) device node; None when only torch can tell."""
    if name == "cpu":
        return "cpu"
    if name == "auto" and not any(Path("/dev").glob("nvidia[0-9]*")) and not Path("/dev/kfd").exists():
        return "cpu"
    return None


@dataclass(frozen=True)
class GpuInfo:
    name: str
    capability: str
    cuda: str
    cudnn: str
    driver: str | None


def cpu_label(capability: str | None = None) -> str:
    """The label of a CPU run's arithmetic in this process: ``cpu-x86-avx2-amd`` (pinned; MKL's branch
    still depends on the vendor), ``cpu-x86-avx2-portable`` (every x86-64 machine with AVX2), or
    ``cpu-native-<isa>-<CPU model>`` (unpinned). ``capability``: the ATen capability torch reports, when
    torch is loaded; a pinned label holds only if it agrees with the pin."""
    pinned = pin_set(pins_in_force())
    if pinned is not None and (capability is None or capability.lower() == "avx2"):
        return "cpu-x86-avx2-portable" if pinned == "avx2-portable" else f"cpu-x86-avx2-{cpu_vendor()}"
    isa = (capability or native_isa()).lower()
    return f"cpu-native-{isa}-{_slug(cpu_model())}"


def gpu_label(gpu: GpuInfo) -> str:
    """The label of a CUDA run's arithmetic: the GPU model and the CUDA and cuDNN versions pick the kernels
    (the driver is recorded with the machine, not part of the label: it runs the kernels, it does not pick
    them)."""
    return f"cuda-{_slug(gpu.name)}-sm{gpu.capability}-cuda{gpu.cuda}-cudnn{gpu.cudnn}"


def _slug(text: str) -> str:
    out = "".join(c if c.isalnum() or c in ".-" else "-" for c in text.strip())
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")[:60] or "unknown"
