"""One run from its checked request (``requests.RunRequest``): answered from a stored identical run where there
is one (before torch is imported where that can be told), else executed (``execute``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..results.read_once import reading_once
from ..results.schema import RunResult
from .execute import Echo, Summary, Tracking, execute, quiet
from .options import offline_unless, run_options
from .requests import RunRequest

if TYPE_CHECKING:
    from ..results.tuned import TunedStamp
    from ..run.options import RunOptions
    from ..spec.protocol import Protocol


def stored_identical(protocol: Protocol, method: str, seed: int, options: RunOptions,
                     tuned: TunedStamp | None = None) -> Path | None:
    """The stored result an identical run would repeat (same protocol spec, method, settings, seed and
    precision: ``sweep.plan.stored_run``, the rule a sweep's plan uses), or None."""
    from ..sweep.plan import stored_run

    return stored_run(protocol, method, options.overrides, seed, options, tuned)


@dataclass(frozen=True)
class RunOutcome:
    result: RunResult
    path: Path
    reused: bool  # an identical run was stored already: nothing trained


def mirror_found(result: RunResult, path: Path, results_dir: Path, tracking_uri: str | None, protocol: Protocol,
                 echo: Echo) -> None:
    """A found result whose MLflow record is missing or unfinished gets it now, so running the command again
    completes what an earlier run without MLflow, or one stopped while it logged, left undone."""
    from ..sweep.mirror import mirror_stored

    if (rid := mirror_stored(result, path, results_dir, tracking_uri, protocol)) is not None:
        echo(f"  its MLflow record was missing or unfinished: logged now as run {rid}")


def run_checked(request: RunRequest, options: RunOptions, *, echo: Echo = quiet,
                summary: Summary | None = None) -> RunOutcome:
    """A checked run request on ``options`` (its settings among them): the stored result of an identical run
    when there is one (training it again would only store a second JSON with the same numbers), unless the
    request asks for the training (``rerun``, ``save_predictions``); else ``execute``."""
    r = request
    with reading_once():
        found = None if r.rerun or r.save_predictions else stored_identical(r.protocol, r.method, r.seed, options,
                                                                           r.stamp)
        if found is not None:
            return report_stored(found, r.protocol, options.results_dir, r.tracking, echo, summary)
        result, path = execute(r.protocol, r.method, r.seed, options, r.tracking, save_predictions=r.save_predictions,
                               tuned=r.stamp, echo=echo, summary=summary)
    return RunOutcome(result, path, False)


def stored_before_set_up(request: RunRequest, device: str, precision: str | None, cpu_kernels: str) -> Path | None:
    """The stored identical run of a checked request, found before torch is imported where that can be told (a
    CPU run of built-in methods: ``sweep.plan.stored_on_cpu``); None otherwise, and the full check after
    set-up decides."""
    from ..sweep.plan import stored_on_cpu

    r = request
    return stored_on_cpu(r.protocol, r.method, dict(r.settings), r.seed, r.results_dir, device, precision,
                         cpu_kernels, r.stamp)


def report_stored(found: Path, protocol: Protocol, results_dir: Path, tracking: Tracking = Tracking(),
                  echo: Echo = quiet, summary: Summary | None = None) -> RunOutcome:
    """What a request whose identical run is stored gets: said first, then the stored run's numbers (its own
    wall time labelled as such), and its MLflow record completed where the store lacks it."""
    from ..results.schema import load_result

    result = load_result(found)
    echo(f"Stored, nothing trained: an identical run (same protocol spec, method, settings, seed, "
         f"precision, machine arithmetic and method code) is stored in {found}; its numbers follow, with the wall "
         f"time it took when it was made ({result.wall_time_s:.1f} s). Add --rerun to train it again.")
    if summary:
        summary(result, found)
    if tracking.mlflow:
        mirror_found(result, found, results_dir, tracking.uri, protocol, echo)
    return RunOutcome(result, found, True)


def answer(request: RunRequest, options: Callable[[], RunOptions], device: str, precision: str | None,
           cpu_kernels: str, *, echo: Echo = quiet, summary: Summary | None = None,
           restore_cpu: bool = False) -> RunOutcome:
    """The one way a run request is answered (``bench run`` and ``run``): a stored identical run from its file
    before torch is imported where that can be told, else the backbone checked, ``options()`` made (torch
    loads there) and ``run_checked``; ``restore_cpu``: the process gets its CPU settings back afterwards."""
    from ..results.comparability import KERNEL_SETS
    from ..tools.preflight import check_backbone

    with reading_once():  # the early answer and the run read each stored file once between them
        if not (request.rerun or request.save_predictions) and cpu_kernels in KERNEL_SETS and isinstance(device, str):
            found = stored_before_set_up(request, device, precision, cpu_kernels)
            if found is not None:  # answered from the file, before torch is imported
                return report_stored(found, request.protocol, request.results_dir, request.tracking, echo, summary)
        check_backbone(request.protocol)
        chosen = options()  # torch loads here: an identical stored run was answered before
        if not restore_cpu:
            return run_checked(request, chosen, echo=echo, summary=summary)
        from ..model.compute import cpu_settings_restored

        with cpu_settings_restored():
            return run_checked(request, chosen, echo=echo, summary=summary)


def run(protocol: str = "tiny_cil", method: str = "vanilla", seed: int = 0, *,
        results_dir: str | Path | None = None, device: str = "auto", precision: str | None = None,
        tuned: bool = False, rerun: bool = False, mlflow: bool = True, tracking_uri: str | None = None,
        save_predictions: bool = False, progress: bool = True, trunk_cache: bool = True,
        allow_download: bool = False, cpu_kernels: str = "fast", **settings: object) -> RunResult:
    """Run ``method`` on ``protocol`` (a built-in name or a YAML path) with ``seed``, as ``bench run`` does,
    and return the validated, stored result. ``settings`` are the method's ``--set`` overrides
    (``lr=0.0005``); a nested one is written with ``__`` for the dot (``sgm__lora__rank=8``); ``tuned``
    runs the settings ``tune`` stored instead. An identical run already stored is returned, not trained
    again (``rerun=True`` trains it). The same checks as the CLI run before anything trains; bad input
    raises ``BenchError``. The run computes with the harness's CPU settings (one thread, ``cpu_kernels``);
    the process gets its own back afterwards. Its progress shows as it goes (a bar in a notebook or on a
    terminal, a line every half minute elsewhere), as ``bench run``'s does; ``progress=False`` silences it."""
    offline_unless(allow_download)
    request = RunRequest.checked(protocol, method, seed, [f"{k.replace('__', '.')}={v}" for k, v in settings.items()],
                                 results_dir, Tracking(tracking_uri, mlflow), tuned=tuned, rerun=rerun,
                                 save_predictions=save_predictions)

    def options() -> RunOptions:
        return run_options(results_dir, device, precision=precision, cpu_kernels=cpu_kernels,
                           overrides=request.settings, trunk_cache=trunk_cache, progress=progress,
                           allow_download=allow_download)

    return answer(request, options, device, precision, cpu_kernels, restore_cpu=True).result
