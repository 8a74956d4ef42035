"""The ``RunOptions`` of a run, a sweep or a study from the Python API's (or the CLI's) arguments, each checked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BenchError
from .checks import CHECKPOINT_EVERY, FOLDER_OR_NONE, TEXT, check_flags, check_kinds, refused

if TYPE_CHECKING:
    from ..run.options import RunOptions

MAX_HOOK_SECONDS = 10_000_000  # a hook time limit beyond this (four months) is a typo, not a limit


def run_options(results_dir: str | Path | None = None, device: str = "auto", *, precision: str | None = None,
                cpu_kernels: str = "fast", overrides: dict[str, object] | None = None, trunk_cache: bool = True,
                progress: bool = False, allow_download: bool = False, restart: bool = False,
                checkpoint_every: int | None = None, wait: bool = True, gpu_decode: bool = True,
                hook_time_limit: float | None = None) -> RunOptions:
    """The ``RunOptions`` of a run or a sweep, each value checked (argument types, device, precision on it,
    kernel set, the BENCH_* settings a run reads) before anything computes; the results folder resolved as
    the CLI does (``BENCH_RESULTS_DIR``, else ./bench-results)."""
    from ..environment import check_environment
    from ..model.device import check_precision, resolve_device
    from ..paths import results_dir as resolve_results
    from ..results.comparability import KERNEL_SETS
    from ..run.options import RunOptions

    check_kinds(results_dir=(results_dir, FOLDER_OR_NONE), device=(device, TEXT))
    check_flags(trunk_cache=trunk_cache, progress=progress, allow_download=allow_download, restart=restart, wait=wait,
           gpu_decode=gpu_decode)
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int)
                                         or checkpoint_every < 0):  # the rule of the CLI's --checkpoint-every
        raise refused("checkpoint_every", checkpoint_every, CHECKPOINT_EVERY)
    if hook_time_limit is not None and (isinstance(hook_time_limit, bool) or
                                        not isinstance(hook_time_limit, (int, float)) or
                                        not 0 < hook_time_limit <= MAX_HOOK_SECONDS):
        raise BenchError(f"hook_time_limit {hook_time_limit!r} must be a number of seconds > 0 (at most "
                         f"{MAX_HOOK_SECONDS:,}), or None for the limit derived from the run's updates.")
    check_environment()  # a malformed BENCH_* setting is refused with the request, before anything is announced
    chosen = resolve_device(device)
    check_precision(precision, chosen)
    if cpu_kernels not in KERNEL_SETS:
        raise BenchError(f"cpu_kernels {cpu_kernels!r} is not a CPU kernel set: "
                         f"choose one of {', '.join(KERNEL_SETS)}.")
    return RunOptions(results_dir=resolve_results(Path(results_dir) if results_dir is not None else None),
                      device=str(chosen), trunk_cache=trunk_cache, progress=progress, allow_download=allow_download,
                      overrides=dict(overrides or {}), restart=restart, checkpoint_every=checkpoint_every, wait=wait,
                      gpu_decode=gpu_decode, precision=precision, cpu_kernels=cpu_kernels,
                      hook_time_limit=None if hook_time_limit is None else float(hook_time_limit))


def offline_unless(allow_download: bool) -> None:
    if not allow_download:  # read by huggingface_hub when timm first imports it
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
