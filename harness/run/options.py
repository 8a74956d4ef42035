"""How a run is executed, as opposed to what it computes: devices, caches, logging, checkpoint cadence,
callbacks for executors (how a stage times and reports itself: ``run.report``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..model.device import check_precision, resolve_device
from ..model.machine import numerics_label
from ..results.comparability import kernel_label
from ..spec.protocol import Protocol
from .checkpoint import run_key


@dataclass
class RunOptions:
    results_dir: Path
    device: str = "cpu"
    trunk_cache: bool = True
    progress: bool = True
    allow_download: bool = False
    overrides: dict = field(default_factory=dict)
    log: bool = True  # print what the harness is doing (references, caches)
    # fp32 | tf32 | bf16 (``model.device.autocast``); None: the protocol's default (``run_precision``)
    precision: str | None = None
    # the CPU kernel set: fast (harness.model.fastconv and fastoptim) or stock (PyTorch's); its label is part
    # of a CPU run's identity (harness.results.comparability)
    cpu_kernels: str = "fast"
    gpu_decode: bool = True  # on CUDA: JPEG files decoded on the GPU (nvJPEG); no effect elsewhere
    checkpoint_every: int | None = None  # updates between checkpoints; None: every checkpoint_seconds
    checkpoint_seconds: float = 120.0
    # seconds one call into the method may take before it is stopped (``hook_clock``); None: the protocol's
    # ``hook_time_limit``, else derived from the run's own updates
    hook_time_limit: float | None = None
    restart: bool = False  # discard a stored checkpoint instead of resuming from it
    wait: bool = True  # when another process computes the same phase: wait and reuse (False: refuse at once)
    # a sweep's run, planned as missing: a result with the same settings stored since (by a concurrent sweep of
    # the same grid, which may have finished it before this one took its claim) is reused, not trained again
    reuse_stored: bool = False
    on_eval: Callable[[int, int, Any], None] | None = None  # (session, update, accuracies): live tracking
    # called after every training update with (phase, update, updates in phase), e.g. ("session 3", 120, 600):
    # an executor running the run elsewhere (a Ray task) reports from it where the run is
    on_progress: Callable[[str, int, int], None] | None = None
    # filled by the stage that runs with these options: wall seconds by stage ("train", "eval"), resumes included
    stage_seconds: dict[str, float] | None = None

    @property
    def device_key(self) -> str:
        """The options that change numbers (device, precision, layout), for checkpoint keys."""
        off = {**({} if self.gpu_decode else {"gpu_decode": False}),  # named only when off: earlier keys stay valid
               # a checkpoint resumes only under the kernel set (code, torch, timm) it was computed with
               **({"cpu_kernels": kernel_label(self.cpu_kernels)} if self.device.startswith("cpu") else {})}
        # cpu_channels_last stays in the key (always off since the switch was removed) so that CUDA
        # checkpoints made before stay resumable
        return run_key(device=self.device, precision=self.precision or "default",
                       cpu_channels_last=False, trunk_cache=self.trunk_cache, numerics=self.numerics, **off)[:8]

    @property
    def numerics(self) -> str:
        """The label of the machine arithmetic these options compute with (``harness.numerics``): a checkpoint
        resumes, a cache is reused and a stored run counts only under the same label."""
        return numerics_label(resolve_device(self.device))


def run_precision(protocol: Protocol, options: RunOptions) -> str:
    """The precision a run trains and evaluates in: ``options.precision``, else the protocol's default:
    fp32 on the paper's protocols (the published code trains in float32 under torch 1.12's defaults),
    bf16 on CUDA for the embedded ones (their default before the switch existed; the CPU always ran
    them in fp32, so their CPU numbers stay as they were)."""
    device = resolve_device(options.device)
    check_precision(options.precision, device)
    if options.precision is not None:
        return options.precision
    return "bf16" if protocol.embedded and device.type == "cuda" else "fp32"
