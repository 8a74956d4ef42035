"""Tuning a method's settings: the study's checked request and its run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .checks import METHOD, OBJECTIVE, PROTOCOL, SPACE, STORAGE, TRIALS, check_kinds
from .execute import Echo, quiet
from .options import offline_unless, run_options


def tune_request(protocol: str, method: str, *, trials: int | None = None, objective: str | None = None,
                 seed: int = 0, storage: str | None = None, space: dict[str, Any] | None = None,
                 results_dir: str | Path | None = None) -> Any:
    """A study's request, every part checked before anything computes: the ruleset (``trials``,
    ``objective``: the protocol's own by default), the validation split, the method, the search space
    (``space``: instead of the method's own), the seed, the Optuna storage and the results folder."""
    from ...methods.registry import check_method
    from ..paths import results_dir as resolve_results
    from ..results.tuned import check_replaceable
    from ..spec.protocol import load_protocol
    from ..sweep.study_checks import check_storage
    from ..sweep.tuning import TuneRequest, default_storage, ruleset, search_space
    from ..tools.preflight import check_outputs, check_seed

    check_kinds(protocol=(protocol, PROTOCOL), method=(method, METHOD), trials=(trials, TRIALS),
           objective=(objective, OBJECTIVE), space=(space, SPACE), storage=(storage, STORAGE))
    spec = load_protocol(protocol)
    rules = ruleset(spec, trials, objective)  # before anything else: zero trials, an unknown objective
    spec.tuning_view()  # a protocol without a validation split cannot be tuned
    check_method(method, spec, {})
    chosen = search_space(method, spec, space)
    check_seed(seed)
    root = resolve_results(Path(results_dir) if results_dir is not None else None)
    url = storage or default_storage(root)
    check_storage(url, root, given=storage is not None)
    check_outputs(root, None, False)
    check_replaceable(root, spec.name, method)
    return TuneRequest(spec, method, rules, seed, url, chosen)


def run_tune(request: Any, options: Any, ray_plan: Any = None, echo: Echo = quiet) -> Any:
    """The study of a checked ``tune_request`` on ``options``; returns the tuned entry it wrote."""
    from ..sweep.tuning import trial_runner
    from ..sweep.tuning import tune as run_study

    return run_study(request, options, trial_runner(request.method, request.seed, options, ray_plan, echo), echo)


def tune(protocol: str, method: str, *, trials: int | None = None, objective: str | None = None, seed: int = 0,
         storage: str | None = None, space: dict[str, Any] | None = None, results_dir: str | Path | None = None,
         device: str = "auto", precision: str | None = None, progress: bool = False, trunk_cache: bool = True,
         allow_download: bool = False, cpu_kernels: str = "fast") -> Any:
    """Tune ``method`` on ``protocol``'s validation split as ``bench tune`` does (locally) and return the tuned
    entry (``entry.settings``); ``run(..., tuned=True)`` and sweep rows with ``tuned: true`` run it."""
    from ..model.compute import cpu_settings_restored
    from ..tools.preflight import check_backbone

    offline_unless(allow_download)
    request = tune_request(protocol, method, trials=trials, objective=objective, seed=seed, storage=storage,
                           space=space, results_dir=results_dir)
    check_backbone(request.protocol)
    options = run_options(results_dir, device, precision=precision, cpu_kernels=cpu_kernels, trunk_cache=trunk_cache,
                          progress=progress, allow_download=allow_download)
    with cpu_settings_restored():
        return run_tune(request, options)
