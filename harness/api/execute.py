"""Running one checked request: the run itself, its live MLflow mirror, the reference runs it trained on the
way, the predictions file, and what a stop after the result was stored leaves on disk."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BenchError, note_stop
from ..results.schema import RunResult

if TYPE_CHECKING:
    from ..results.tracking import LiveRun, NotMirrored
    from ..results.tuned import TunedStamp
    from ..run.options import RunOptions
    from ..run.predictions import PredictionRecorder
    from ..run.workbench import Workbench
    from ..spec.protocol import Protocol

Echo = Callable[[str], None]


Summary = Callable[[RunResult, Path], None]


def quiet(_: str) -> None:
    return None


def _stored_paths(root: Path, protocol: str) -> set[Path]:
    folder = root / "runs" / protocol
    return set(folder.rglob("*.json")) if folder.is_dir() else set()


def _mirror_references(result: RunResult, path: Path, before: set[Path], root: Path, tracking_uri: str | None,
                       echo: Echo, protocol: Protocol | None = None) -> list[NotMirrored]:
    """Mirror to MLflow the reference runs this run trained on the way (the joint model, the protocol's
    A_best set for its seed); returns what could not be mirrored."""
    from ..results.schema import load_result
    from ..results.tracking import NotMirrored, reference_role
    from ..sweep.mirror import mirror

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


def _save_predictions(recorder: PredictionRecorder | None, result: RunResult, path: Path, echo: Echo) -> None:
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


def execute(protocol: Protocol, method: str, seed: int, options: RunOptions, tracking: Tracking = Tracking(), *,
            save_predictions: bool = False, tuned: TunedStamp | None = None, bench: Workbench | None = None,
            echo: Echo = quiet, summary: Summary | None = None) -> tuple[RunResult, Path]:
    """One run on a loaded protocol with ``RunOptions``: the JSON is written atomically first, then (with
    ``tracking.mlflow``) the live MLflow run is finished with the full record and the reference runs it
    trained are mirrored. A tracking failure never costs the result: the JSON stays, and the error says how
    to sync. ``bench``: a workbench already prepared for this protocol and seed (a sweep's)."""
    from ..run.pipeline import execute as execute_run
    from ..run.predictions import PredictionRecorder, chain

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
            from ..run.stopped import after_stored, stored_before

            if (path := path or stored_before(stop)) is not None:
                note_stop(stop, after_stored(path, f"{_predictions_note(recorder, path)}nothing needs to train "
                                                   f"again."))
            raise
        return result, path
    return _execute_tracked(protocol, method, seed, options, tracking.uri, recorder, tuned, bench, echo, summary)


def _execute_tracked(protocol: Protocol, method: str, seed: int, options: RunOptions, tracking_uri: str | None,
                     recorder: PredictionRecorder | None, tuned: TunedStamp | None, bench: Workbench | None, echo: Echo,
                     summary: Summary | None) -> tuple[RunResult, Path]:
    from ..results.schema import load_result
    from ..results.tracking import LiveRun, not_mirrored, run_name, sync_command
    from ..run.options import run_precision
    from ..run.pipeline import execute as execute_run
    from ..run.pipeline import new_run_id
    from ..run.predictions import chain
    from ..run.stopped import stored_before
    from ..sweep.mirror import finish_live

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


def _predictions_note(recorder: PredictionRecorder | None, path: Path) -> str:
    """What a stop after the result was stored says of ``--save-predictions``' file (empty without it)."""
    if recorder is None:
        return ""
    npz = path.with_name(path.stem + ".predictions.npz")
    if npz.is_file():
        return f"its predictions are in {npz}; "
    return ("its predictions were not saved (they are recorded while the run trains, so only a run with "
            "--save-predictions that trains again records them); ")


def _closed_after_stop(stop: KeyboardInterrupt, live: LiveRun, result: RunResult, path: Path,
                       recorder: PredictionRecorder | None, sync: str,
                       closed: bool) -> None:
    """A stop after the result was stored: its MLflow record is completed from it before the process ends
    (unless it was already), and the stop gets the note of what is on disk. A second stop while the record
    is written leaves it KILLED, for ``bench sync`` to complete."""
    from ..run.stopped import after_stored
    from ..sweep.mirror import finish_live

    if not closed:
        try:
            finish_live(live, result, path)
            closed = live.error is None
        except KeyboardInterrupt:
            live.finish("killed")
    record = "its MLflow record is complete" if closed else \
        f"its MLflow record is unfinished (marked KILLED): `{sync}`, or the same command again, completes it"
    note_stop(stop, after_stored(path, f"{_predictions_note(recorder, path)}{record}; nothing needs to train again."))
