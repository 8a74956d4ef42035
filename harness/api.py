"""bench from Python: ``run`` one method, ``sweep`` a grid, ``tune`` a method's settings, ``load_results`` of a
folder as a pandas frame and the leaderboard's ``table``.

The command line is a thin layer on this module: ``bench run`` parses its options and calls ``run_checked``,
``bench sweep`` calls ``run_sweep`` and ``bench tune`` calls ``run_tune`` (the CLI parses and prints; the
checks, the run, its MLflow mirror, the predictions file and the reference runs' mirrors happen here), so a
notebook gets exactly the result the command line stores::

    from bench_stability_gap.harness.api import load_results, run

    result = run("tiny_cil", "vanilla+sgm", seed=0, results_dir="bench-results", lr=0.0005)
    frame = load_results("bench-results")   # one row per run, every metric

See docs/python-api.md for a worked example.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from .errors import BenchError, note_stop
from .results.read_once import reading_once
from .results.schema import RunResult

if TYPE_CHECKING:
    import pandas as pd  # loaded where a frame is made: a run's request answers before pandas would load

    from .results.tracking import NotMirrored

Echo = Callable[[str], None]
Summary = Callable[[RunResult, Path], None]


def _quiet(_: str) -> None:
    return None


# ---------------------------------------------------------------------------------- argument checks

# What an argument takes: its types and the words an error says. From Python nothing checks a signature's types:
# a number where a path belongs failed in pathlib, a str where a list belongs was read letter by letter
# ("Unknown protocol 't'"), and 'no' passed as a true flag.
Kind = tuple[tuple[type, ...], str]
FOLDER: Kind = ((str, Path), "a folder path (str or Path)")
FOLDER_OR_NONE: Kind = ((str, Path, type(None)), "a folder path (str or Path) or None")
PROTOCOL: Kind = ((str, Path), "a protocol's name or YAML path (str or Path)")
SWEEP: Kind = ((str, Path), "a sweep's name or YAML path (str or Path)")
METHOD: Kind = ((str,), "a method string, e.g. 'vanilla+sgm'")
TEXT: Kind = ((str,), "a str")
TEXT_OR_NONE: Kind = ((str, type(None)), "a str or None")
FLAG: Kind = ((bool,), "True or False")
TRIALS: Kind = ((int, type(None)), "a whole number of trials, e.g. 20, or None (the protocol's ruleset)")
OBJECTIVE: Kind = ((str, type(None)), "a metric's name, e.g. 'CK_delta', or None (the protocol's ruleset)")
SPACE: Kind = ((dict, type(None)), "a mapping {setting: {low, high[, log]} | {choices: [...]}}, or None")
STORAGE: Kind = ((str, type(None)), "a database URL, e.g. 'sqlite:///path/optuna.db', or None")
CHECKPOINT_EVERY = "a whole number of updates >= 0 (0: at session ends only) or None (every 2 minutes)"


def _refused(name: str, value: Any, takes: str) -> BenchError:
    from .spec.specfile import short_repr

    return BenchError(f"{name} takes {takes}, not {short_repr(value)} of type {type(value).__name__}.")


def _check(**given: tuple[Any, Kind]) -> None:
    """Each argument (value, kind) of its kind; a bool is never taken for a number."""
    for name, (value, (types, takes)) in given.items():
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise _refused(name, value, takes)


def _flags(**flags: Any) -> None:
    _check(**{name: (value, FLAG) for name, value in flags.items()})


def _names(value: Any, name: str, example: str) -> tuple[str, ...]:
    """A collection of names as a tuple; one str is refused, not read as its letters."""
    items = None if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) else tuple(value)
    if items is None or not all(isinstance(item, str) for item in items):
        raise _refused(name, value, f"a list of str, e.g. {example}")
    return items


def _seeds(seeds: Any) -> list[int] | None:
    """The seeds a sweep runs instead of its own (None: its own), each one ``check_seed`` accepts."""
    from .tools.preflight import check_seed

    if seeds is None:
        return None
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise _refused("seeds", seeds, "a list of seeds, e.g. [0, 1, 2], or None for the sweep's own")
    chosen = list(seeds)
    if not chosen:
        raise BenchError(f"seeds {chosen} names no seed: give some, e.g. [0, 1, 2], or None for the "
                         f"sweep's own.")
    for seed in chosen:
        check_seed(seed, "seed")
    return chosen


# ---------------------------------------------------------------------------------- run options


MAX_HOOK_SECONDS = 10_000_000  # a hook time limit beyond this (four months) is a typo, not a limit


def run_options(results_dir: str | Path | None = None, device: str = "auto", *, precision: str | None = None,
                cpu_kernels: str = "fast", overrides: dict[str, Any] | None = None, trunk_cache: bool = True,
                progress: bool = False, allow_download: bool = False, restart: bool = False,
                checkpoint_every: int | None = None, wait: bool = True, gpu_decode: bool = True,
                hook_time_limit: float | None = None) -> Any:
    """The ``RunOptions`` of a run or a sweep, each value checked (argument types, device, precision on it,
    kernel set, the BENCH_* settings a run reads) before anything computes; the results folder resolved as
    the CLI does (``BENCH_RESULTS_DIR``, else ./bench-results)."""
    from .environment import check_environment
    from .model.device import check_precision, resolve_device
    from .paths import results_dir as resolve_results
    from .results.comparability import KERNEL_SETS
    from .run.options import RunOptions

    _check(results_dir=(results_dir, FOLDER_OR_NONE), device=(device, TEXT))
    _flags(trunk_cache=trunk_cache, progress=progress, allow_download=allow_download, restart=restart, wait=wait,
           gpu_decode=gpu_decode)
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int)
                                         or checkpoint_every < 0):  # the rule of the CLI's --checkpoint-every
        raise _refused("checkpoint_every", checkpoint_every, CHECKPOINT_EVERY)
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


def _offline(allow_download: bool) -> None:
    if not allow_download:  # read by huggingface_hub when timm first imports it
        os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ------------------------------------------------------------------------------------- one run


def _stored_paths(root: Path, protocol: str) -> set[Path]:
    folder = root / "runs" / protocol
    return set(folder.rglob("*.json")) if folder.is_dir() else set()


def _mirror_references(result: RunResult, path: Path, before: set[Path], root: Path, tracking_uri: str | None,
                       echo: Echo, protocol: Any = None) -> list[NotMirrored]:
    """Mirror to MLflow the reference runs this run trained on the way (the joint model, the protocol's
    A_best set for its seed); returns what could not be mirrored."""
    from .results.schema import load_result
    from .results.tracking import NotMirrored, reference_role
    from .sweep.mirror import mirror

    problems: list[NotMirrored] = []
    for new in sorted(_stored_paths(root, result.protocol.name) - before - {path}):
        try:
            r = load_result(new)
        except BenchError:
            continue
        role = reference_role(r)
        if role is None or r.seed != result.seed:  # another process's run: not this one's to mirror
            continue
        try:
            rid, _ = mirror(r, new, root, tracking_uri, protocol)
            echo(f"  MLflow run {rid}: reference {r.label} ({role}), trained for this run")
        except NotMirrored as err:
            problems.append(err)
    return problems


def _save_predictions(recorder: Any, result: RunResult, path: Path, echo: Echo) -> None:
    """The recorder's npz beside the result JSON (``save_predictions``)."""
    if recorder is None or not result.curves:
        return
    expected = [(c.session, u) for c in result.curves for u in c.updates]
    saved = recorder.save(path, expected)
    echo(f"  predictions of {len(recorder.points)} eval point(s): {saved}")
    if len(recorder.points) < len(expected):
        echo(f"  warning: {len(expected) - len(recorder.points)} eval point(s) were evaluated before a resume "
             f"and are not in {saved.name} (listed in its 'missing')")


@dataclass(frozen=True)
class Tracking:
    """Where a run's MLflow mirror goes (``mlflow`` False: the JSON only)."""

    uri: str | None = None
    mlflow: bool = True


def execute(protocol: Any, method: str, seed: int, options: Any, tracking: Tracking = Tracking(), *,
            save_predictions: bool = False, tuned: Any = None, bench: Any = None, echo: Echo = _quiet,
            summary: Summary | None = None) -> tuple[RunResult, Path]:
    """One run on a loaded protocol with ``RunOptions``: the JSON is written atomically first, then (with
    ``tracking.mlflow``) the live MLflow run is finished with the full record and the reference runs it
    trained are mirrored. A tracking failure never costs the result: the JSON stays, and the error says how
    to sync. ``bench``: a workbench already prepared for this protocol and seed (a sweep's)."""
    from .run.pipeline import execute as execute_run
    from .run.predictions import PredictionRecorder, chain

    recorder = PredictionRecorder() if save_predictions else None
    if not tracking.mlflow:
        on_eval = chain([None if recorder is None else recorder.eval_point])
        path = None
        try:
            result, path = execute_run(protocol, method, seed, dataclasses.replace(options, on_eval=on_eval), bench,
                                       tuned=tuned)
            if summary:
                summary(result, path)
            _save_predictions(recorder, result, path, echo)
        except KeyboardInterrupt as stop:  # once the result is stored, the note says so, and what is missing
            from .run.stopped import after_stored, stored_before

            if (path := path or stored_before(stop)) is not None:
                note_stop(stop, after_stored(path, f"{_predictions_note(recorder, path)}nothing needs to train "
                                                   f"again."))
            raise
        return result, path
    return _execute_tracked(protocol, method, seed, options, tracking.uri, recorder, tuned, bench, echo, summary)


def _execute_tracked(protocol: Any, method: str, seed: int, options: Any, tracking_uri: str | None, recorder: Any,
                     tuned: Any, bench: Any, echo: Echo, summary: Summary | None) -> tuple[RunResult, Path]:
    from .results.schema import load_result
    from .results.tracking import LiveRun, not_mirrored, run_name, sync_command
    from .run.options import run_precision
    from .run.pipeline import execute as execute_run
    from .run.pipeline import new_run_id
    from .run.predictions import chain
    from .run.stopped import stored_before
    from .sweep.mirror import finish_live

    before = _stored_paths(options.results_dir, protocol.name)
    run_id = new_run_id()  # known before training, so the live MLflow run carries it from the start
    live = LiveRun(options.results_dir, tracking_uri, protocol)
    live.start(protocol.name, method, seed, run_id, params={
        "protocol": protocol.name, "protocol_hash": protocol.spec_hash, "method": method, "seed": seed,
        "set": options.overrides},
        name=run_name(method, seed, options.overrides, tuned, run_precision(protocol, options)))
    joint_run = method.strip() == "joint"
    sync = sync_command(options.results_dir, tracking_uri)
    try:
        # a joint run's points are logged when it finishes, on the method runs' step axis (its own eval points
        # close joint models whose update counts are not a session's)
        on_eval = chain([None if joint_run else live.eval_point, None if recorder is None else recorder.eval_point])
        result, path = execute_run(protocol, method, seed, dataclasses.replace(options, on_eval=on_eval), bench,
                                   run_id=None if joint_run else run_id, tuned=tuned)
    except KeyboardInterrupt as stop:
        if (stored := stored_before(stop)) is None:
            live.finish("killed")
        else:  # stopped after the result was written (its claim released, say): its record is completed now
            _closed_after_stop(stop, live, load_result(stored), stored, recorder, sync, closed=False)
        raise
    except BaseException:
        live.finish("failed")
        raise
    closed = False
    try:
        if summary:
            summary(result, path)
        if result.run_id != run_id and not joint_run:  # reused: the process that stored it mirrors it
            live.discard()
            echo("  (computed by the process this one waited for; its MLflow run is that run's mirror)")
            return result, path
        try:
            _save_predictions(recorder, result, path, echo)
        finally:  # the result is stored: its MLflow run is closed with the full record even when the npz is not
            finish_live(live, result, path)
            closed = live.error is None
    except KeyboardInterrupt as stop:  # the result is stored: the note says what else is on disk
        _closed_after_stop(stop, live, result, path, recorder, sync, closed)
        raise
    problems = _mirror_references(result, path, before, options.results_dir, tracking_uri, echo, protocol)
    if live.error or problems:
        raise not_mirrored(live.error, path, problems, sync_command(options.results_dir, tracking_uri))
    echo(f"  MLflow run {live.run_id} in {live.store.uri}")
    return result, path


def _predictions_note(recorder: Any, path: Path) -> str:
    """What a stop after the result was stored says of ``--save-predictions``' file (empty without it)."""
    if recorder is None:
        return ""
    npz = path.with_name(path.stem + ".predictions.npz")
    if npz.is_file():
        return f"its predictions are in {npz}; "
    return ("its predictions were not saved (they are recorded while the run trains, so only a run with "
            "--save-predictions that trains again records them); ")


def _closed_after_stop(stop: KeyboardInterrupt, live: Any, result: RunResult, path: Path, recorder: Any, sync: str,
                       closed: bool) -> None:
    """A stop after the result was stored: its MLflow record is completed from it before the process ends
    (unless it was already), and the stop gets the note of what is on disk. A second stop while the record
    is written leaves it KILLED, for ``bench sync`` to complete."""
    from .run.stopped import after_stored
    from .sweep.mirror import finish_live

    if not closed:
        try:
            finish_live(live, result, path)
            closed = live.error is None
        except KeyboardInterrupt:
            live.finish("killed")
    record = "its MLflow record is complete" if closed else \
        f"its MLflow record is unfinished (marked KILLED): `{sync}`, or the same command again, completes it"
    note_stop(stop, after_stored(path, f"{_predictions_note(recorder, path)}{record}; nothing needs to train again."))


def checked_request(protocol: str, method: str, seed: int, settings: dict[str, Any], results_dir: str | Path | None,
                    tracking: Tracking = Tracking(), tuned: bool = False) -> tuple[Any, dict[str, Any], Any]:
    """What a run's request can get wrong that is checked without importing torch: the BENCH_* settings, the
    protocol, the tuned entry (``tuned``: its settings replace ``settings``, which must then be empty), the
    method and its settings, the seed and the outputs. Returns (protocol, settings, tuned stamp or None)."""
    from .environment import check_environment
    from .paths import results_dir as resolve_results
    from .spec.protocol import load_protocol
    from .tools.preflight import check_run

    check_environment()  # a malformed BENCH_* setting is refused with the request, before anything is announced
    spec = load_protocol(str(protocol))
    root = resolve_results(Path(results_dir) if results_dir is not None else None)
    stamp = None
    if tuned:
        from .results.tuned import load_entry
        from .results.tuned import stamp as tuned_stamp

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
    from .tools.preflight import check_backbone

    spec, settings, stamp = checked_request(protocol, method, seed, settings, results_dir, tracking, tuned)
    check_backbone(spec)
    return spec, settings, stamp


def stored_identical(protocol: Any, method: str, seed: int, options: Any, tuned: Any = None) -> Path | None:
    """The stored result an identical run would repeat (same protocol spec, method, settings, seed and
    precision: ``sweep.plan.stored_run``, the rule a sweep's plan uses), or None."""
    from .sweep.plan import stored_run

    return stored_run(protocol, method, options.overrides, seed, options, tuned)


@dataclass(frozen=True)
class RunOutcome:
    result: RunResult
    path: Path
    reused: bool  # an identical run was stored already: nothing trained


def _mirror_found(result: RunResult, path: Path, results_dir: Path, tracking_uri: str | None, protocol: Any,
                  echo: Echo) -> None:
    """A found result whose MLflow record is missing or unfinished gets it now, so running the command again
    completes what an earlier run without MLflow, or one stopped while it logged, left undone."""
    from .sweep.mirror import mirror_stored

    if (rid := mirror_stored(result, path, results_dir, tracking_uri, protocol)) is not None:
        echo(f"  its MLflow record was missing or unfinished: logged now as run {rid}")


def run_checked(protocol: Any, method: str, seed: int, options: Any, tracking: Tracking = Tracking(), *,
                tuned: Any = None, rerun: bool = False, save_predictions: bool = False, echo: Echo = _quiet,
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
    from .paths import results_dir as resolve_results
    from .sweep.plan import stored_on_cpu

    root = resolve_results(Path(results_dir) if results_dir is not None else None)
    return stored_on_cpu(protocol, method, dict(settings), seed, root, device, precision, cpu_kernels, tuned)


def report_stored(found: Path, protocol: Any, results_dir: Path, tracking: Tracking = Tracking(),
                  echo: Echo = _quiet, summary: Summary | None = None) -> RunOutcome:
    """What a request whose identical run is stored gets: said first, then the stored run's numbers (its own
    wall time labelled as such), and its MLflow record completed where the store lacks it."""
    from .results.schema import load_result

    result = load_result(found)
    echo(f"Stored, nothing trained: an identical run (same protocol spec, method, settings, seed, "
         f"precision, machine arithmetic and method code) is stored in {found}; its numbers follow, with the wall "
         f"time it took when it was made ({result.wall_time_s:.1f} s). Add --rerun to train it again.")
    if summary:
        summary(result, found)
    if tracking.mlflow:
        _mirror_found(result, found, results_dir, tracking.uri, protocol, echo)
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
    from ..methods.registry import parse_overrides
    from .paths import results_dir as resolve_results
    from .results.comparability import KERNEL_SETS
    from .tools.preflight import check_backbone

    _check(protocol=(protocol, PROTOCOL), method=(method, METHOD), results_dir=(results_dir, FOLDER_OR_NONE),
           tracking_uri=(tracking_uri, TEXT_OR_NONE))
    _flags(tuned=tuned, rerun=rerun, mlflow=mlflow, save_predictions=save_predictions)
    _offline(allow_download)
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
        from .model.compute import cpu_settings_restored  # torch loads here: an identical stored run returned before

        options = run_options(results_dir, device, precision=precision, cpu_kernels=cpu_kernels, overrides=overrides,
                              trunk_cache=trunk_cache, progress=progress, allow_download=allow_download)
        with cpu_settings_restored():
            return run_checked(spec, method, seed, options, tracking, tuned=stamp, rerun=rerun,
                               save_predictions=save_predictions).result


# ------------------------------------------------------------------------------------- tuning


def tune_request(protocol: str, method: str, *, trials: int | None = None, objective: str | None = None,
                 seed: int = 0, storage: str | None = None, space: dict[str, Any] | None = None,
                 results_dir: str | Path | None = None) -> Any:
    """A study's request, every part checked before anything computes: the ruleset (``trials``,
    ``objective``: the protocol's own by default), the validation split, the method, the search space
    (``space``: instead of the method's own), the seed, the Optuna storage and the results folder."""
    from ..methods.registry import check_method
    from .paths import results_dir as resolve_results
    from .results.tuned import check_replaceable
    from .spec.protocol import load_protocol
    from .sweep.study_checks import check_storage
    from .sweep.tuning import TuneRequest, default_storage, ruleset, search_space
    from .tools.preflight import check_outputs, check_seed

    _check(protocol=(protocol, PROTOCOL), method=(method, METHOD), trials=(trials, TRIALS),
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


def run_tune(request: Any, options: Any, ray_plan: Any = None, echo: Echo = _quiet) -> Any:
    """The study of a checked ``tune_request`` on ``options``; returns the tuned entry it wrote."""
    from .sweep.tuning import trial_runner
    from .sweep.tuning import tune as run_study

    return run_study(request, options, trial_runner(request.method, request.seed, options, ray_plan, echo), echo)


def tune(protocol: str, method: str, *, trials: int | None = None, objective: str | None = None, seed: int = 0,
         storage: str | None = None, space: dict[str, Any] | None = None, results_dir: str | Path | None = None,
         device: str = "auto", precision: str | None = None, progress: bool = False, trunk_cache: bool = True,
         allow_download: bool = False, cpu_kernels: str = "fast") -> Any:
    """Tune ``method`` on ``protocol``'s validation split as ``bench tune`` does (locally) and return the tuned
    entry (``entry.settings``); ``run(..., tuned=True)`` and sweep rows with ``tuned: true`` run it."""
    from .model.compute import cpu_settings_restored
    from .tools.preflight import check_backbone

    _offline(allow_download)
    request = tune_request(protocol, method, trials=trials, objective=objective, seed=seed, storage=storage,
                           space=space, results_dir=results_dir)
    check_backbone(request.protocol)
    options = run_options(results_dir, device, precision=precision, cpu_kernels=cpu_kernels, trunk_cache=trunk_cache,
                          progress=progress, allow_download=allow_download)
    with cpu_settings_restored():
        return run_tune(request, options)


# ------------------------------------------------------------------------------------- a sweep


def tune_first(spec: Any, options: Any, ray_plan: Any = None, *, dry_run: bool = False,
               echo: Echo = _quiet) -> bool:
    """Tune each method of the sweep's ``tuned: true`` rows under its protocol's ruleset where no tuned
    entry exists yet (every ruleset, validation split and search space checked first). A dry run lists
    them instead and returns False when any is missing (its rows cannot be planned yet)."""
    from .results.tuned import has_entry
    from .spec.protocol import load_protocol
    from .sweep.plan import tuned_cells
    from .sweep.tuning import ensure_tuned, ruleset, search_space

    cells = [(load_protocol(p), m) for p, m in tuned_cells(spec)]
    for protocol, method in cells:
        ruleset(protocol, None, None), protocol.tuning_view(), search_space(method, protocol)
    missing = [(p, m) for p, m in cells if not has_entry(options.results_dir, p, m)]
    for protocol, method in missing:
        trials = ruleset(protocol, None, None).trials
        if dry_run:
            echo(f"  to tune first: {method} on {protocol.name} ({trials} trials)")
            continue
        echo(f"\nTuning {method} on {protocol.name} ({trials} trials on its validation split) before its tuned rows")
        ensure_tuned(protocol, method, dataclasses.replace(options, progress=False), ray_plan, echo)
    return not (dry_run and missing)


def plan_sweep(spec: Any, seeds: list[int] | None, options: Any, ray_plan: Any = None, *, dry_run: bool = False,
               echo: Echo = _quiet) -> list[Any] | None:
    """The sweep's runs, tuned first where its rows ask, each marked done when a stored result covers it
    in the precision, device and kernel set ``options`` give (a bf16 run on CUDA is not covered by an fp32
    one); None for a dry run whose tuned rows are not tuned yet."""
    from .sweep.plan import plan, todo_note
    from .tools.preflight import check_backbone

    if not tune_first(spec, options, ray_plan, dry_run=dry_run, echo=echo):
        return None
    runs = plan(spec, options.results_dir, seeds, options)  # builds every method: names and settings checked
    todo = [r for r in runs if r.done is None]
    if not dry_run:
        for protocol in {r.protocol.spec_hash: r.protocol for r in todo}.values():
            check_backbone(protocol)
    echo(f"Sweep {spec.name}: {len(runs)} run(s), {len(runs) - len(todo)} already done, {len(todo)} to run; "
         f"results in {options.results_dir}")
    for i, r in enumerate(runs, 1):
        if r.done is not None or dry_run:
            echo(f"  [{i}/{len(runs)}] {r.label}: " + (f"done ({r.done})" if r.done else todo_note(r, options)))
    return runs


@dataclass
class SweepOutcome:
    runs: list[Any]  # the planned runs (``sweep.plan.PlannedRun``), done ones included
    states: dict[str, Any] = field(default_factory=dict)  # Ray: each task's final state
    hung: list[str] = field(default_factory=list)  # local: the runs stopped past their hook time limit (labels)

    def hung_error(self) -> BenchError | None:
        """The one paragraph a sweep ends with when some of its runs hung (None: none did)."""
        if not self.hung:
            return None
        return BenchError(f"{len(self.hung)} run(s) of the sweep did not finish: a call into the method ran past its "
                          f"time limit ({'; '.join(self.hung)}; each one's paragraph is above). The sweep's other "
                          f"runs finished; running the same command again retries the stopped ones, each from its "
                          f"last checkpoint.")

    @property
    def failed(self) -> list[Any]:
        return [t for t in self.states.values() if t.status in ("failed", "skipped")]


def run_sweep(spec: Any, seeds: list[int] | None, options: Any, tracking: Tracking = Tracking(), *,
              ray_plan: Any = None, dry_run: bool = False, echo: Echo = _quiet,
              summary: Summary | None = None) -> SweepOutcome:
    """The one orchestration of a sweep (``bench sweep`` and ``sweep``): tune first where asked, plan
    against the runs ``options`` make, then the stages still to go, locally or on Ray (``ray_plan``). A
    dry run only plans (no run at all when its tuned rows are not tuned yet)."""
    from .sweep.stages import stage_graph

    with reading_once():
        runs = plan_sweep(spec, seeds, options, ray_plan, dry_run=dry_run, echo=echo)
        if runs is None or dry_run:
            return SweepOutcome(runs or [])
        if tracking.mlflow:
            _mirror_done(runs, options.results_dir, tracking.uri, echo)
        graph = stage_graph(runs, options.results_dir, options)
        options = dataclasses.replace(options, reuse_stored=True)  # planned as missing: a concurrent sweep's is reused
        shared = sum(stage.kind != "run" for stage in graph)
        echo(f"{len(graph)} stage(s) to go, counted [i/{len(graph)}] below: {len(graph) - shared} method run(s) "
             f"and {shared} shared stage(s) (deployed models, joint references, the A_best reference runs, which "
             f"include the sweep's runs of those methods).")
        if ray_plan is None:
            hung = run_local_sweep(graph, options, tracking, echo=echo, summary=summary)
            return SweepOutcome(runs, hung=hung)
    from .sweep.ray_executor import run_ray

    return SweepOutcome(runs, run_ray(graph, options, ray_plan, tracking.uri, tracking.mlflow, echo))


def _mirror_done(runs: list[Any], results_dir: Path, tracking_uri: str | None, echo: Echo) -> None:
    """The MLflow records of the sweep's rows that are done, made where the store lacks a complete one, as
    ``bench run`` makes a found run's: a sweep run again after one made without MLflow completes them."""
    from .results.schema import load_result

    for r in runs:
        if r.done is not None:
            _mirror_found(load_result(r.done), r.done, results_dir, tracking_uri, r.protocol, echo)


def run_local_sweep(graph: list[Any], options: Any, tracking: Tracking = Tracking(), *, echo: Echo = _quiet,
                    summary: Summary | None = None) -> list[str]:
    """Every stage of a sweep's graph in this process, one workbench per protocol spec and seed: shared
    stages (joint, A_best references) once, then each method run as ``execute`` does it (live MLflow run
    included); every result a shared stage stores is mirrored as ``sweep.mirror.mirror`` mirrors all.
    Returns the labels of the method runs stopped past their hook time limit (the sweep went on)."""
    from .sweep.mirror import mirror
    from .sweep.progress import ProgressBoard
    from .sweep.stages import run_local

    board = ProgressBoard({stage.key: stage.label for stage in graph}, work={stage.key: stage.work for stage in graph})
    before: list[Any] = []  # the stage running, marked done when the next one starts
    hung: dict[str, str] = {}  # stage key -> label of its run, stopped past its hook time limit

    def start(stage: Any) -> None:
        if before:
            done = before.pop()
            board.finished(done.key, "failed" if done.key in hung else "done")
        board.started(stage.key, "local")
        before.append(stage)
        echo(f"\n[{graph.index(stage) + 1}/{len(graph)}] {stage.label}  ({sweep_status(board)})")

    def method_run(stage: Any, bench: Any) -> None:
        execute(stage.protocol, stage.method, stage.seed, dataclasses.replace(options, overrides=dict(stage.overrides)),
                tracking, tuned=stage.tuned, bench=bench, echo=echo, summary=summary)

    def stored(stage: Any, made: list[tuple[RunResult, Path]]) -> None:  # a shared stage's results
        for result, path in made:
            if summary:
                summary(result, path)
            if tracking.mlflow:
                rid, uri = mirror(result, path, options.results_dir, tracking.uri, stage.protocol)
                echo(f"  MLflow run {rid} in {uri}")

    def stopped(stage: Any, fault: Exception) -> None:  # the sweep goes on with its other runs
        hung[stage.key] = stage.label
        echo(f"Error: {fault} The sweep goes on with its other runs.")

    run_local(graph, options, start, method_run, stored, stopped)
    if before:
        done = before.pop()
        board.finished(done.key, "failed" if done.key in hung else "done")
    echo(f"\nSweep finished: {sweep_status(board)}")
    return list(hung.values())


def sweep_status(board: Any) -> str:
    """Where a local sweep stands, in stages (the unit its [i/N] counts): done, elapsed, ETA."""
    from .progress_bar import duration
    from .sweep.progress import count, eta_seconds

    states = board.snapshot()
    eta = eta_seconds(states, board.work)
    return (f"{count(states, 'done')}/{len(states)} stages done, elapsed {duration(board.clock() - board.begun)}, "
            f"ETA {'-' if eta is None else duration(eta)}")


def sweep(sweep: str, seeds: list[int] | None = None, *, results_dir: str | Path | None = None,
          device: str = "auto", precision: str | None = None, mlflow: bool = True, tracking_uri: str | None = None,
          progress: bool = False, trunk_cache: bool = True, allow_download: bool = False,
          cpu_kernels: str = "fast") -> pd.DataFrame:
    """Run a sweep (a built-in name or a YAML grid of protocols x methods x seeds) in this process, as
    ``bench sweep`` does with the local executor: rows with ``tuned: true`` are tuned first where needed,
    and runs already stored in the precision these runs compute in are skipped. Returns ``load_results``
    of the results folder, restricted to the sweep's runs (one row per run). The process gets its CPU
    settings back afterwards, as after ``run``."""
    from .model.compute import cpu_settings_restored
    from .sweep.plan import load_sweep
    from .tools.preflight import check_outputs, check_seed

    _check(sweep=(sweep, SWEEP), tracking_uri=(tracking_uri, TEXT_OR_NONE))
    _flags(mlflow=mlflow)
    chosen = _seeds(seeds)
    _offline(allow_download)
    spec = load_sweep(str(sweep))
    for seed in spec.seeds if chosen is None else chosen:
        check_seed(seed, "seed")
    options = run_options(results_dir, device, precision=precision, cpu_kernels=cpu_kernels, trunk_cache=trunk_cache,
                          progress=progress, allow_download=allow_download)
    check_outputs(options.results_dir, tracking_uri, mlflow)
    with cpu_settings_restored():
        outcome = run_sweep(spec, chosen, options, Tracking(tracking_uri, mlflow))
    if (hung := outcome.hung_error()) is not None:
        raise hung
    frame = load_results(options.results_dir)
    wanted = {(r.protocol.name, r.row, r.seed) for r in outcome.runs}
    keep = [(p, m, s) in wanted for p, m, s in zip(frame["protocol"], frame["method"], frame["seed"])]
    return frame[keep].reset_index(drop=True)


def sweep_table(spec: Any, runs: Iterable[Any], results_dir: Path, fmt: str = "markdown",
                columns: Sequence[str] = ()) -> str:
    """The leaderboard's mean ± std table restricted to this sweep's protocols, rows and seeds (with their
    joint references), in ``fmt`` (``brief``: the gaps and the paired difference in 120 columns; else a
    format of ``bench leaderboard table``, with ``columns`` as its --columns keys)."""
    from ..leaderboard.aggregate import format_table, summarize, table_columns
    from ..leaderboard.sources import load_folder

    runs = list(runs)
    wanted = {(r.protocol.name, r.row, r.seed) for r in runs}
    seeds, names = {r.seed for r in runs}, {r.protocol.name for r in runs}
    # the references its rows were scored with come along: the A_best reference set, and the joint runs
    # (a NAME@Kx budget's are NAME's, shared by the family)
    references = {(r.protocol.name, m) for r in runs for m in r.protocol.best_new_reference}
    joints = {(p.name, "joint") for r in runs for p in (r.protocol, r.protocol.reference)}
    entries = [e for e in load_folder(results_dir).entries
               if (e.result.protocol.name, e.result.label, e.result.seed) in wanted
               or (e.result.seed in seeds and (e.result.protocol.name, "joint" if e.is_reference else e.result.label)
                   in references | joints)]
    header = f"Sweep {spec.name}: seeds {', '.join(map(str, sorted(seeds)))}\n\n"
    if fmt == "markdown":
        header = "## " + header
    boards = [b for b in summarize(entries) if b.name in names]  # not NAME's own board
    table = format_table(boards, cast(Any, fmt), table_columns(columns))
    if fmt in ("latex", "json"):  # machine-read: the table alone
        return table
    return header + (spec.description.strip() + "\n\n" if spec.description and fmt != "brief" else "") + table


# ---------------------------------------------------------------------------------- the results


# load_results' columns besides the metrics: where the run's JSON is, and why it is not ranked (empty: ranked,
# or a joint reference in use)
LOAD_COLUMNS: tuple[str, ...] = ("path", "reason")


def results_columns() -> list[str]:
    """The columns ``load_results`` returns, also for an empty folder: the tidy per-run frame's
    (``harness.results.tidy.runs_frame``: run constants, status, every metric) plus ``LOAD_COLUMNS``."""
    from .results.tidy import runs_frame

    return [*runs_frame([]).columns, *LOAD_COLUMNS]


def load_results(results_dir: str | Path) -> pd.DataFrame:
    """Every stored run under ``results_dir`` (``bench run``'s layout, or a folder of JSON files), one row
    each, with every metric recomputed against the current references as the leaderboard does (accuracies
    in %). A run that cannot be scored keeps its row with NaN metrics and the ``reason``; a corrupt file
    is skipped with a warning naming it. An empty folder gives an empty frame with the same columns."""
    from ..leaderboard.aggregate import entry_frame, scored_entries, summarize
    from ..leaderboard.sources import load_folder, set_trials_apart

    _check(results_dir=(results_dir, FOLDER))
    warn = lambda message: warnings.warn(message, stacklevel=3)  # noqa: E731 - one line, used twice
    loaded = load_folder(Path(results_dir), warn=warn)
    set_trials_apart(loaded, Path(results_dir), warn)  # tuning trials are never scored as a board
    scored = scored_entries(summarize(loaded.entries))
    if not scored:
        import pandas as pd

        return pd.DataFrame(columns=results_columns())
    frame = entry_frame(scored)
    frame["path"] = [e.source for e in scored]
    frame["reason"] = [e.reason or "" for e in scored]
    return frame[results_columns()]


TableFormat = Literal["markdown", "text", "latex", "json", "csv"]
TABLE_FORMATS: tuple[str, ...] = get_args(TableFormat)


def table(results_dir: str | Path, protocols: Iterable[str] = (), fmt: TableFormat = "markdown",
          columns: Iterable[str] = ()) -> str:
    """The leaderboard's table of the stored runs under ``results_dir`` (``bench leaderboard table``): mean ±
    std [95 % CI] over seeds per row and board, ``protocols`` only when given; ``fmt`` markdown, text,
    latex, json or csv (the per-run numbers behind it); ``columns``: optional columns to add (``bwt``, ...)
    or, with a leading ``-``, to remove."""
    from ..leaderboard.aggregate import boards_frame, format_table, summarize, table_columns
    from ..leaderboard.cli import chosen_boards
    from ..leaderboard.sources import load_folder, set_trials_apart

    _check(results_dir=(results_dir, FOLDER))
    protocols, columns = _names(protocols, "protocols", "['tiny_cil']"), _names(columns, "columns", "['bwt', '-wall']")
    if fmt not in TABLE_FORMATS:  # the Literal binds the type checker only, not a notebook's caller
        raise BenchError(f"table fmt {fmt!r} is not a table format: choose one of {', '.join(TABLE_FORMATS)}.")
    chosen = table_columns(columns)  # checked for every format, csv too (its frame holds every column)
    warn = lambda message: warnings.warn(message, stacklevel=3)  # noqa: E731 - one line, used twice
    loaded = load_folder(Path(results_dir), warn=warn)
    set_trials_apart(loaded, Path(results_dir), warn)
    boards = chosen_boards(summarize(loaded.entries), protocols, loaded.origin)
    if fmt == "csv":
        return boards_frame(boards).to_csv(index=False) if boards else ""
    return format_table(boards, fmt, chosen) if boards else f"No results in {loaded.origin}.\n"


def reproduce(result: str | Path, scratch: str | Path | None = None, *, reuse_caches: bool = False,
              progress: bool = True) -> Any:
    """Make the stored run ``result`` (its JSON) again from what it records, as ``bench reproduce`` does, and
    return the report (``harness.tools.reproduce.Report``: ``identical``, ``identity``, ``point``, ``metrics``,
    ``lines()``). The scratch folder is a new temporary one unless given; caches are made afresh there unless
    ``reuse_caches``. Bad input (no such file, a spec or method code not installed here) raises ``BenchError``."""
    from .model.compute import cpu_settings_restored
    from .tools.reproduce import reproduce as make_again

    _check(result=(result, FOLDER_OR_NONE), scratch=(scratch, FOLDER_OR_NONE))
    _flags(reuse_caches=reuse_caches, progress=progress)
    with cpu_settings_restored():
        return make_again(Path(result), None if scratch is None else Path(scratch), reuse_caches=reuse_caches,
                          progress=progress, echo=print if progress else _quiet)
