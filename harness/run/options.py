"""How a run is executed, as opposed to what it computes: devices, caches, logging, checkpoint cadence,
callbacks for executors (how a stage times and reports itself: ``run.report``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..identity import Execution, RunIdentity, resolve_precision
from ..model.device import check_precision, resolve_device
from ..model.machine import numerics_label
from ..results.comparability import execution
from ..spec.protocol import Protocol
from .stored import request_identity

if TYPE_CHECKING:
    from ..results.schema import TunedStamp


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
    def execution(self) -> Execution:
        """How a run with these options computes (``harness.identity.Execution``): the device they resolve to,
        its machine arithmetic and CPU threads and kernels, and how the run was asked for."""
        device = resolve_device(self.device)
        return execution(device.type, numerics_label(device), self.cpu_kernels, asked_device=self.device,
                         asked_precision=self.precision, trunk_cache=self.trunk_cache, gpu_decode=self.gpu_decode)

    @property
    def device_key(self) -> str:
        """The options' part of a checkpoint key (``Execution.device_key``)."""
        return self.execution.device_key

    @property
    def numerics(self) -> str:
        """The label of the machine arithmetic these options compute with (``harness.numerics``): a checkpoint
        resumes, a cache is reused and a stored run counts only under the same label."""
        return numerics_label(resolve_device(self.device))

    def identity(self, protocol: Protocol, method: str, seed: int, config: dict[str, Any],
                 overrides: dict[str, Any] | None = None, tuned: TunedStamp | None = None) -> RunIdentity:
        """The identity of the run of ``method`` (resolved to ``config``) on ``protocol`` with ``seed`` these
        options make (``overrides``: the ``--set`` ones, by default these options'); a precision the device
        does not have is refused here."""
        run = self.execution
        check_precision(self.precision, resolve_device(self.device))
        return request_identity(protocol, method, seed, config, self.overrides if overrides is None else overrides,
                                run, tuned)


def run_precision(protocol: Protocol, options: RunOptions) -> str:
    """The precision a run trains and evaluates in (``harness.identity.resolve_precision``): the one the options
    ask for, else the protocol's default on the device they resolve to; refused where the device lacks it."""
    device = resolve_device(options.device)
    check_precision(options.precision, device)
    return resolve_precision(options.precision, protocol.embedded, device.type)
