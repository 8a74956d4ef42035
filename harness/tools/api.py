"""bench from Python: ``run`` one method, ``sweep`` a grid, ``load_results`` of a folder as a pandas frame.

``bench run`` is a thin layer on ``execute`` and ``bench sweep`` (local executor) on ``run_local_sweep``
(the CLI parses options and prints; the run, its MLflow mirror, the predictions file and the reference
runs' mirrors happen here), so a notebook gets exactly the result the command line stores::

    from bench_stability_gap.harness.tools.api import load_results, run

    result = run("tiny_cil", "vanilla+sgm", seed=0, results_dir="bench-results", lr=0.0005)
    frame = load_results("bench-results")   # one row per run, every metric

See docs/python-api.md for a worked example.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import BenchError
from ..results.schema import RunResult

Echo = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


# ------------------------------------------------------------------------------------- one run


def run_artifacts(result: RunResult) -> dict[str, str]:
    """The files MLflow gets beside a run's JSON and curves: its plot (the leaderboard's run figure)."""
    from ...leaderboard.aggregate import Entry
    from ...leaderboard.plots import run_plot

    svg = run_plot(Entry(result, source="")) if result.curves else None
    return {"curves.svg": svg} if svg else {}


def _stored_paths(root: Path, protocol: str) -> set[Path]:
    folder = root / "runs" / protocol
    return set(folder.rglob("*.json")) if folder.is_dir() else set()


def _mirror_references(result: RunResult, path: Path, before: set[Path], root: Path, tracking_uri: str | None,
                       echo: Echo, protocol: Any = None) -> list[str]:
    """Mirror to MLflow the reference runs this run trained on the way (the joint model, the protocol's
    A_best set for its seed), tagged ``bench.reference``; returns what could not be mirrored."""
    from ..results.schema import load_result
    from ..results.tracking import REFERENCE_TAG, log_run_or_explain

    refs = result.references
    problems: list[str] = []
    for new in sorted(_stored_paths(root, result.protocol.name) - before - {path}):
        try:
            r = load_result(new)
        except BenchError:
            continue
        role = "joint" if r.is_reference else "best_new" if (
            refs is not None and r.label in refs.best_new_methods and r.seed == result.seed) else None
        if role is None:  # another process's run: not this one's to mirror
            continue
        try:
            rid, _ = log_run_or_explain(r, new, root, tracking_uri, tags={REFERENCE_TAG: role}, artifacts=run_artifacts,
                                        protocol=protocol)
            echo(f"  MLflow run {rid}: reference {r.label} ({role}), trained for this run")
        except BenchError as err:
            problems.append(str(err))
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


def execute(protocol: Any, method: str, seed: int, options: Any, tracking_uri: str | None = None, *,
            mlflow: bool = True, save_predictions: bool = False, tuned: Any = None, echo: Echo = _quiet,
            summary: Callable[[RunResult, Path], None] | None = None) -> tuple[RunResult, Path]:
    """One run on a loaded protocol with ``RunOptions``: the JSON is written atomically first, then (with
    ``mlflow``) the live MLflow run is finished with the full record and the reference runs it trained are
    mirrored. A tracking failure never costs the result: the JSON stays, and the error says how to sync."""
    from ..run.pipeline import execute as execute_run
    from ..run.pipeline import new_run_id
    from ..run.predictions import PredictionRecorder, chain

    recorder = PredictionRecorder() if save_predictions else None
    if not mlflow:
        on_eval = chain([None if recorder is None else recorder.eval_point])
        result, path = execute_run(protocol, method, seed, dataclasses.replace(options, on_eval=on_eval), tuned=tuned)
        if summary:
            summary(result, path)
        _save_predictions(recorder, result, path, echo)
        return result, path
    from ..results.tracking import LiveRun, run_name
    from ..run.options import run_precision

    before = _stored_paths(options.results_dir, protocol.name)
    run_id = new_run_id()  # known before training, so the live MLflow run carries it from the start
    live = LiveRun(options.results_dir, tracking_uri, protocol)
    live.start(protocol.name, method, seed, run_id, params={
        "protocol": protocol.name, "protocol_hash": protocol.spec_hash, "method": method, "seed": seed,
        "set": options.overrides},
        name=run_name(method, seed, options.overrides, tuned, run_precision(protocol, options)))
    try:
        # a joint run's points are logged when it finishes, on the method runs' step axis (its own eval points
        # close joint models whose update counts are not a session's)
        joint_run = method.strip() == "joint"
        on_eval = chain([None if joint_run else live.eval_point, None if recorder is None else recorder.eval_point])
        result, path = execute_run(protocol, method, seed, dataclasses.replace(options, on_eval=on_eval),
                                   run_id=None if joint_run else run_id, tuned=tuned)
    except KeyboardInterrupt:
        live.finish("killed")
        raise
    except BaseException:
        live.finish("failed")
        raise
    if summary:
        summary(result, path)
    if result.run_id != run_id and method.strip() != "joint":  # reused: the process that stored it mirrors it
        live.discard()
        echo("  (computed by the process this one waited for; its MLflow run is that run's mirror)")
        return result, path
    try:
        _save_predictions(recorder, result, path, echo)
    finally:  # the result is stored: its MLflow run is closed with the full record even when the npz is not
        live.finish(result.status, result, path, artifacts=run_artifacts)
    problems = _mirror_references(result, path, before, options.results_dir, tracking_uri, echo, protocol)
    if live.error or problems:
        raise BenchError(" ".join(filter(None, [live.error, *problems]))
                         + f" The result is kept in {path}; mirror it to MLflow later with: bench sync "
                         f"--results-dir {options.results_dir}" + (f" --tracking-uri {tracking_uri}" if tracking_uri else ""))
    echo(f"  MLflow run {live.run_id} in {live.store.uri}")
    return result, path


def run(protocol: str = "tiny_cil", method: str = "vanilla", seed: int = 0, *,
        results_dir: str | Path | None = None, device: str = "auto", mlflow: bool = True,
        tracking_uri: str | None = None, save_predictions: bool = False, progress: bool = False,
        trunk_cache: bool = True, allow_download: bool = False, cpu_kernels: str = "fast",
        **settings: Any) -> RunResult:
    """Run ``method`` on ``protocol`` (a built-in name or a YAML path) with ``seed``, as ``bench run`` does,
    and return the validated, stored result. ``settings`` are the method's ``--set`` overrides
    (``lr=0.0005``); a nested one is written with ``__`` for the dot (``sgm__lora__rank=8``). The same
    checks as the CLI run before anything trains; bad input raises ``BenchError``. The run computes with
    the harness's CPU settings (one thread, ``cpu_kernels``); the process gets its own back afterwards."""
    from ...methods.registry import parse_overrides
    from ..paths import results_dir as resolve_results
    from ..spec.protocol import load_protocol
    from .preflight import check_backbone, check_run

    if not allow_download:  # read by huggingface_hub when timm first imports it
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = load_protocol(str(protocol))
    overrides = parse_overrides([f"{k.replace('__', '.')}={v}" for k, v in settings.items()])
    root = resolve_results(Path(results_dir) if results_dir is not None else None)
    check_run(spec, method, seed, overrides, root, tracking_uri, mlflow)  # no torch yet
    check_backbone(spec)
    from ..model.device import resolve_device
    from ..run.options import RunOptions
    from ..run.threads import cpu_settings_restored

    options = RunOptions(results_dir=root, device=str(resolve_device(device)), trunk_cache=trunk_cache,
                         progress=progress, allow_download=allow_download, overrides=overrides,
                         cpu_kernels=_kernel_set(cpu_kernels))
    with cpu_settings_restored():
        result, _ = execute(spec, method, seed, options, tracking_uri, mlflow=mlflow,
                            save_predictions=save_predictions)
    return result


def _kernel_set(name: str) -> str:
    from ..results.threads import KERNEL_SETS

    if name not in KERNEL_SETS:
        raise BenchError(f"cpu_kernels {name!r} is not a CPU kernel set: choose one of {', '.join(KERNEL_SETS)}.")
    return name


def run_local_sweep(graph: list[Any], options: Any, tracking_uri: str | None, *, mlflow: bool = True,
                    echo: Echo = _quiet, summary: Callable[[RunResult, Path], None] | None = None) -> None:
    """Every stage of a sweep's graph in this process: shared stages (joint, A_best references) once, then
    each method run as ``execute`` does it (live MLflow run included)."""
    from ..results.tracking import log_run_or_explain
    from ..sweep.progress import ProgressBoard
    from ..sweep.stages import run_local

    board = ProgressBoard({stage.key: stage.label for stage in graph})
    before: list[Any] = []  # the stage running, marked done when the next one starts

    def start(stage: Any) -> None:
        if before:
            board.finished(before.pop().key, "done")
        board.started(stage.key, "local")
        before.append(stage)
        echo(f"\n[{graph.index(stage) + 1}/{len(graph)}] {stage.label}  ({sweep_status(board)})")

    def method_run(stage: Any) -> None:
        execute(stage.protocol, stage.method, stage.seed, dataclasses.replace(options, overrides=dict(stage.overrides)),
                tracking_uri, mlflow=mlflow, tuned=stage.tuned, echo=echo, summary=summary)

    def stored(stage: Any, made: list[tuple[RunResult, Path]]) -> None:  # a shared stage's results
        for result, path in made:
            if summary:
                summary(result, path)
            if mlflow:
                rid, uri = log_run_or_explain(result, path, options.results_dir, tracking_uri, artifacts=run_artifacts,
                                              protocol=stage.protocol)
                echo(f"  MLflow run {rid} in {uri}")

    run_local(graph, options, start, method_run, stored)
    if before:
        board.finished(before.pop().key, "done")
    echo(f"\nSweep finished: {sweep_status(board)}")


def sweep_status(board: Any) -> str:
    """Where a local sweep stands, in stages (the unit its [i/N] counts): done, elapsed, ETA."""
    from ..progress_bar import duration
    from ..sweep.progress import count, eta_seconds

    states = board.snapshot()
    eta = eta_seconds(states)
    return (f"{count(states, 'done')}/{len(states)} stages done, elapsed {duration(board.clock() - board.begun)}, "
            f"ETA {'-' if eta is None else duration(eta)}")


def sweep(sweep: str, seeds: list[int] | None = None, *, results_dir: str | Path | None = None,
          device: str = "auto", mlflow: bool = True, tracking_uri: str | None = None, progress: bool = False,
          trunk_cache: bool = True, allow_download: bool = False, cpu_kernels: str = "fast") -> pd.DataFrame:
    """Run a sweep (a built-in name or a YAML grid of protocols x methods x seeds) in this process, as
    ``bench sweep`` does with the local executor: runs already stored are skipped. Returns
    ``load_results`` of the results folder, restricted to the sweep's runs (one row per run). The process
    gets its CPU settings back afterwards, as after ``run``."""
    from ..paths import results_dir as resolve_results
    from ..model.device import resolve_device
    from ..run.options import RunOptions
    from ..sweep.plan import load_sweep, plan
    from ..sweep.stages import stage_graph
    from .preflight import check_backbone, check_outputs, check_seed

    if not allow_download:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = load_sweep(sweep)
    for seed in seeds or spec.seeds:
        check_seed(seed, "seed")
    root = resolve_results(Path(results_dir) if results_dir is not None else None)
    check_outputs(root, tracking_uri, mlflow)
    options = RunOptions(results_dir=root, device=str(resolve_device(device)), trunk_cache=trunk_cache,
                         progress=progress, allow_download=allow_download, cpu_kernels=_kernel_set(cpu_kernels))
    runs = plan(spec, root, list(seeds) if seeds else None)  # builds every method: names and settings checked
    todo = [r for r in runs if r.done is None]
    for protocol in {r.protocol.spec_hash: r.protocol for r in todo}.values():
        check_backbone(protocol)
    if todo:
        from ..run.threads import cpu_settings_restored

        with cpu_settings_restored():
            run_local_sweep(stage_graph(runs, root), options, tracking_uri, mlflow=mlflow)
    frame = load_results(root)
    wanted = {(r.protocol.name, r.row, r.seed) for r in runs}
    keep = [(p, m, s) in wanted for p, m, s in zip(frame["protocol"], frame["method"], frame["seed"])]
    return frame[keep].reset_index(drop=True)


# ---------------------------------------------------------------------------------- the results


# load_results' columns besides the metrics: where the run's JSON is, and why it is not ranked (empty: ranked,
# or a joint reference in use)
LOAD_COLUMNS: tuple[str, ...] = ("path", "reason")


def results_columns() -> list[str]:
    """The columns ``load_results`` returns, also for an empty folder: the tidy per-run frame's
    (``harness.results.tidy.runs_frame``: run constants, status, every metric) plus ``LOAD_COLUMNS``."""
    from ..results.tidy import runs_frame

    return [*runs_frame([]).columns, *LOAD_COLUMNS]


def load_results(results_dir: str | Path) -> pd.DataFrame:
    """Every stored run under ``results_dir`` (``bench run``'s layout, or a folder of JSON files), one row
    each, with every metric recomputed against the current references as the leaderboard does (accuracies
    in %). A run that cannot be scored keeps its row with NaN metrics and the ``reason``; a corrupt file
    is skipped with a warning naming it. An empty folder gives an empty frame with the same columns."""
    from ...leaderboard.aggregate import entry_frame, summarize
    from ...leaderboard.sources import load_folder

    root = Path(results_dir).expanduser()
    if not root.is_dir():
        raise BenchError(f"Results folder {root} does not exist (run `bench run ...` first, or give another folder).")
    loaded = load_folder(root, warn=lambda message: warnings.warn(message, stacklevel=3))
    summarize(loaded.entries)
    if not loaded.entries:
        return pd.DataFrame(columns=results_columns())
    frame = entry_frame(loaded.entries)
    frame["path"] = [e.source for e in loaded.entries]
    frame["reason"] = [e.reason or "" for e in loaded.entries]
    return frame[results_columns()]
