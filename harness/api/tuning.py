"""Tuning a method's settings: a checked study (``requests.TuneRequest``) run locally or on Ray."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .execute import Echo, quiet
from .options import offline_unless, run_options
from .requests import TuneRequest

if TYPE_CHECKING:
    from ..results.tuned import TunedEntry
    from ..run.options import RunOptions
    from ..sweep.ray_executor import RayPlan


def run_tune(request: TuneRequest, options: RunOptions, ray_plan: RayPlan | None = None,
             echo: Echo = quiet) -> TunedEntry:
    """The study of a checked request on ``options``; returns the tuned entry it wrote."""
    from ..sweep.tuning import trial_runner
    from ..sweep.tuning import tune as run_study

    study = request.study
    return run_study(study, options, trial_runner(study.method, study.seed, options, ray_plan, echo), echo)


def tune(protocol: str, method: str, *, trials: int | None = None, objective: str | None = None, seed: int = 0,
         storage: str | None = None, space: dict[str, object] | None = None, results_dir: str | Path | None = None,
         device: str = "auto", precision: str | None = None, progress: bool = False, trunk_cache: bool = True,
         allow_download: bool = False, cpu_kernels: str = "fast") -> TunedEntry:
    """Tune ``method`` on ``protocol``'s validation split as ``bench tune`` does (locally) and return the tuned
    entry (``entry.settings``); ``run(..., tuned=True)`` and sweep rows with ``tuned: true`` run it."""
    from ..model.compute import cpu_settings_restored
    from ..tools.preflight import check_backbone

    offline_unless(allow_download)
    request = TuneRequest.checked(protocol, method, trials=trials, objective=objective, seed=seed, storage=storage,
                                  space=space, results_dir=results_dir)
    check_backbone(request.study.protocol)
    options = run_options(results_dir, device, precision=precision, cpu_kernels=cpu_kernels, trunk_cache=trunk_cache,
                          progress=progress, allow_download=allow_download)
    with cpu_settings_restored():
        return run_tune(request, options)
