"""One run from its request: checked (torch-free first), answered from a stored identical run where there is
one, else executed (``execute``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BenchError
from ..results.read_once import reading_once
from ..results.schema import RunResult
from .checks import FOLDER_OR_NONE, METHOD, PROTOCOL, TEXT_OR_NONE, check_flags, check_kinds
from .execute import Echo, Summary, Tracking, execute, quiet
from .options import offline_unless, run_options


def checked_request(protocol: str, method: str, seed: int, settings: dict[str, Any], results_dir: str | Path | None,
                    tracking: Tracking = Tracking(), tuned: bool = False) -> tuple[Any, dict[str, Any], Any]:
    """What a run's request can get wrong that is checked without importing torch: the BENCH_* settings, the
    protocol, the tuned entry (``tuned``: its settings replace ``settings``, which must then be empty), the
    method and its settings, the seed and the outputs. Returns (protocol, settings, tuned stamp or None)."""
    from ..environment import check_environment
    from ..paths import results_dir as resolve_results
    from ..spec.protocol import load_protocol
    from ..tools.preflight import check_run

    check_environment()  # a malformed BENCH_* setting is refused with the request, before anything is announced
    spec = load_protocol(str(protocol))
    root = resolve_results(Path(results_dir) if results_dir is not None else None)
    stamp = None
    if tuned:
        from ..results.tuned import load_entry
        from ..results.tuned import stamp as tuned_stamp

        if settings:
            raise BenchError("--tuned runs the tuned entry's settings as they are; drop --set (or tune again).")
        entry = load_entry(root, spec, method, str(protocol))
        settings, stamp = dict(entry.settings), tuned_stamp(entry)
    check_run(spec, method, seed, settings, root, tracking.uri, tracking.mlflow)
    return spec, settings, stamp


def checked_run(protocol: str, method: str, seed: int, settings: dict[str, Any], results_dir: str | Path | None,
                tracking: Tracking = Tracking(), tuned: bool = False) -> tuple[Any, dict[str, Any], Any]:
    """Everything a run's request can get wrong, checked before any compute: ``checked_request``, then the
    backbone (timm and torch load there, seconds on a loaded machine, so a caller that can answer or announce
    first calls the two itself). Returns (protocol, settings, tuned stamp or None)."""
    from ..tools.preflight import check_backbone

    spec, settings, stamp = checked_request(protocol, method, seed, settings, results_dir, tracking, tuned)
    check_backbone(spec)
    return spec, settings, stamp


def stored_identical(protocol: Any, method: str, seed: int, options: Any, tuned: Any = None) -> Path | None:
    """The stored result an identical run would repeat (same protocol spec, method, settings, seed and
    precision: ``sweep.plan.stored_run``, the rule a sweep's plan uses), or None."""
    from ..sweep.plan import stored_run

    return stored_run(protocol, method, options.overrides, seed, options, tuned)


@dataclass(frozen=True)
class RunOutcome:
    result: RunResult
    path: Path
    reused: bool  # an identical run was stored already: nothing trained


def mirror_found(result: RunResult, path: Path, results_dir: Path, tracking_uri: str | None, protocol: Any,
                  echo: Echo) -> None:
    """A found result whose MLflow record is missing or unfinished gets it now, so running the command again
    completes what an earlier run without MLflow, or one stopped while it logged, left undone."""
    from ..sweep.mirror import mirror_stored

    if (rid := mirror_stored(result, path, results_dir, tracking_uri, protocol)) is not None:
        echo(f"  its MLflow record was missing or unfinished: logged now as run {rid}")


def run_checked(protocol: Any, method: str, seed: int, options: Any, tracking: Tracking = Tracking(), *,
                tuned: Any = None, rerun: bool = False, save_predictions: bool = False, echo: Echo = quiet,
                summary: Summary | None = None) -> RunOutcome:
    """A checked run request (``checked_run``) on ``options``: the stored result of an identical run when
    there is one (training it again would only store a second JSON with the same numbers), unless
    ``rerun`` or ``save_predictions`` asks for the training; else ``execute``."""

    with reading_once():
        found = None if rerun or save_predictions else stored_identical(protocol, method, seed, options, tuned)
        if found is not None:
            return report_stored(found, protocol, options.results_dir, tracking, echo, summary)
        result, path = execute(protocol, method, seed, options, tracking, save_predictions=save_predictions,
                               tuned=tuned, echo=echo, summary=summary)
    return RunOutcome(result, path, False)


def stored_before_set_up(protocol: Any, method: str, seed: int, settings: dict[str, Any], tuned: Any,
                         results_dir: str | Path | None, device: str, precision: str | None,
                         cpu_kernels: str) -> Path | None:
    """The stored identical run of a checked request (``checked_request``), found before torch is imported where
    that can be told (a CPU run of built-in methods: ``sweep.plan.stored_on_cpu``); None otherwise, and the
    full check after set-up decides."""
    from ..paths import results_dir as resolve_results
    from ..sweep.plan import stored_on_cpu

    root = resolve_results(Path(results_dir) if results_dir is not None else None)
    return stored_on_cpu(protocol, method, dict(settings), seed, root, device, precision, cpu_kernels, tuned)


def report_stored(found: Path, protocol: Any, results_dir: Path, tracking: Tracking = Tracking(),
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


def run(protocol: str = "tiny_cil", method: str = "vanilla", seed: int = 0, *,
        results_dir: str | Path | None = None, device: str = "auto", precision: str | None = None,
        tuned: bool = False, rerun: bool = False, mlflow: bool = True, tracking_uri: str | None = None,
        save_predictions: bool = False, progress: bool = True, trunk_cache: bool = True,
        allow_download: bool = False, cpu_kernels: str = "fast", **settings: Any) -> RunResult:
    """Run ``method`` on ``protocol`` (a built-in name or a YAML path) with ``seed``, as ``bench run`` does,
    and return the validated, stored result. ``settings`` are the method's ``--set`` overrides
    (``lr=0.0005``); a nested one is written with ``__`` for the dot (``sgm__lora__rank=8``); ``tuned``
    runs the settings ``tune`` stored instead. An identical run already stored is returned, not trained
    again (``rerun=True`` trains it). The same checks as the CLI run before anything trains; bad input
    raises ``BenchError``. The run computes with the harness's CPU settings (one thread, ``cpu_kernels``);
    the process gets its own back afterwards. Its progress shows as it goes (a bar in a notebook or on a
    terminal, a line every half minute elsewhere), as ``bench run``'s does; ``progress=False`` silences it."""
    from ...methods.registry import parse_overrides
    from ..paths import results_dir as resolve_results
    from ..results.comparability import KERNEL_SETS
    from ..tools.preflight import check_backbone

    check_kinds(protocol=(protocol, PROTOCOL), method=(method, METHOD), results_dir=(results_dir, FOLDER_OR_NONE),
           tracking_uri=(tracking_uri, TEXT_OR_NONE))
    check_flags(tuned=tuned, rerun=rerun, mlflow=mlflow, save_predictions=save_predictions)
    offline_unless(allow_download)
    overrides = parse_overrides([f"{k.replace('__', '.')}={v}" for k, v in settings.items()])
    tracking = Tracking(tracking_uri, mlflow)
    spec, overrides, stamp = checked_request(protocol, method, seed, overrides, results_dir, tracking, tuned)
    with reading_once():  # the early answer and the run read each stored file once between them
        if not (rerun or save_predictions) and cpu_kernels in KERNEL_SETS and isinstance(device, str):
            found = stored_before_set_up(spec, method, seed, overrides, stamp, results_dir, device, precision,
                                         cpu_kernels)
            if found is not None:  # answered from the file, before torch is imported
                return report_stored(found, spec, resolve_results(Path(results_dir) if results_dir else None),
                                     tracking).result
        check_backbone(spec)
        from ..model.compute import cpu_settings_restored  # torch loads here: an identical stored run returned before

        options = run_options(results_dir, device, precision=precision, cpu_kernels=cpu_kernels, overrides=overrides,
                              trunk_cache=trunk_cache, progress=progress, allow_download=allow_download)
        with cpu_settings_restored():
            return run_checked(spec, method, seed, options, tracking, tuned=stamp, rerun=rerun,
                               save_predictions=save_predictions).result
