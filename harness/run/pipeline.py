"""A run, stage by stage: method -> workbench -> references -> continual run -> scored result.

1. build the method from its string and settings (before any compute: a typo costs nothing);
2. ``workbench.prepare``: stream, input stores, deployed model;
3. references: the joint model (``reference``) and the runs of the protocol's A_best reference set,
   each trained once per protocol spec and seed when missing, found through ``comparability.select_runs``;
4. ``continual.run_cl``: sessions 2..N under the budget guards;
5. the result: scored against those references, written atomically (JSON first).

No stage calls the pipeline back: references are trained by the same stages, in order, before the run
that needs them.
"""

from __future__ import annotations

import dataclasses
import sys
import uuid
from pathlib import Path
from typing import Any

import torch

from ...methods.base import Method
from ...methods.configs import joint_settings
from ...methods.registry import MethodSpec, build_method, code_hash, method_settings
from ..errors import BenchError
from ..identity import RunIdentity
from ..model.cpu import cpu_kernels
from ..model.machine import machine_record, numerics_label
from ..results import metrics as M
from ..results.comparability import Selection
from ..results.efficiency import efficiency_vs_joint
from ..results.read_once import reads_once
from ..results.schema import (
    JOINT,
    MethodStamp,
    ProtocolStamp,
    References,
    RunResult,
    TunedStamp,
    git_commit,
    library_versions,
    now_iso,
    save_result,
)
from ..spec.protocol import Protocol
from .budget_guards import eviction_note
from .checkpoint import Checkpointer, checkpointer
from .claim import claim
from .continual import Diverged, run_cl
from .joint import ensure_joint_part, joint_parts, stored_part, train_joint
from .joint_request import check_joint_request
from .options import RunOptions, run_precision
from .report import say
from .stopped import record_stored, stage, stored_result
from .stored import Stored, protocol_selection
from .workbench import Workbench, prepare


def _stamp(spec: MethodSpec) -> MethodStamp:
    return MethodStamp(
        spec=spec.text, base=spec.base.name, modifiers=[m.name for m in spec.modifiers],
        distribution=spec.base.distribution, version=spec.base.version,
        modifier_distributions={m.name: f"{m.distribution}=={m.version}" for m in spec.modifiers},
        code_hash=code_hash([spec.base, *spec.modifiers]),
    )


def _joint_stamp() -> MethodStamp:
    from importlib import metadata

    try:
        version = metadata.version("bench-stability-gap")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return MethodStamp(spec=JOINT, base=JOINT, modifiers=[], distribution="bench-stability-gap", version=version)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _common(protocol: Protocol, bench: Workbench, seed: int, options: RunOptions, started: str,
            run_id: str | None = None) -> dict[str, Any]:
    return dict(
        run_id=run_id or new_run_id(), status="complete", seed=seed,
        protocol=ProtocolStamp(name=protocol.name, version=protocol.version, hash=protocol.spec_hash,
                               scored_on=protocol.scored_on),
        versions=library_versions(), git_commit=git_commit(), started_at=started,
        # torch's CPU thread count and kernels change float reductions: two runs are bit-identical only with
        # the same count and kernel set
        options={"device": str(bench.device), "trunk_cache": options.trunk_cache, "weights": bench.weights,
                 "precision": bench.precision,
                 "torch_threads": torch.get_num_threads(),
                 "cpu_kernels": cpu_kernels(bench.device, options.cpu_kernels),
                 "data_path": bench.data_path.as_dict() if bench.data_path is not None else None,
                 # the code paths the CPU's (or GPU's) math libraries took, and the machine that took them
                 "numerics": numerics_label(bench.device), "machine": machine_record(bench.device),
                 # a protocol file of one's own: where it is, so messages can name a command that runs it
                 **({"protocol_file": protocol.source_file} if protocol.source_file else {})},
    )


def selection(protocol: Protocol, options: RunOptions, weights: str | None = None) -> Selection[Stored]:
    """Which stored runs of this protocol spec count (the one rule: ``comparability.select_runs``); with the
    backbone weights' digest, runs made with other weights content do not; runs made in another
    precision than ``options``' (``run_precision``) never do."""
    return protocol_selection(protocol, options.results_dir, options.execution, run_precision(protocol, options),
                              weights)


def _claim(options: RunOptions, name: str, what: str, key: str):
    """The claim on one phase of one run (``key``: its identity's ``claim_key``): a second identical command
    waits for the first, then finds its stored result, instead of computing it again."""
    lock = options.results_dir / "checkpoints" / f"{name}-{key}.lock"
    return claim(lock, what, options.wait, lambda message: say(options, message))


def joint_reference(protocol: Protocol, seed: int, options: RunOptions, bench: Workbench) -> tuple[RunResult, Path]:
    """The stored joint reference for this protocol spec and seed, trained and stored first when missing
    (stored under ``protocol.reference``: one for every FLOP budget of a NAME@Kx family)."""
    protocol = protocol.reference
    found = selection(protocol, options, bench.weights).joints.get(seed)
    if found is not None:
        return found[1], found[0]
    with _claim(options, "joint", f"The joint reference of {protocol.name} (seed {seed})",
                _joint_identity(protocol, seed, options).claim_key()):
        found = selection(protocol, options, bench.weights).joints.get(seed)  # stored while this one waited
        if found is not None:
            return found[1], found[0]
        return _train_joint_reference(protocol, seed, options, bench)


def _train_joint_reference(protocol: Protocol, seed: int, options: RunOptions,
                           bench: Workbench) -> tuple[RunResult, Path]:
    models = joint_parts(protocol)
    # precisions never share a reference: the message names this one (an fp32 reference may well exist)
    say(options, f"No {bench.precision} joint reference for {protocol.name} (seed {seed}) yet: training it first "
                 f"({models} model(s) x {protocol.joint.updates} updates; any an earlier, stopped run finished or "
                 f"began resume from their checkpoints); later {bench.precision} runs reuse it.")
    started, run_id = now_iso(), new_run_id()
    savers = [_joint_checkpointer(protocol, seed, options, part) for part in range(models)]
    seconds: dict[str, float] = {}
    with stage(f"training the joint reference of {protocol.name} (seed {seed})", savers,
               stored_result(options.results_dir, protocol.name, run_id)):
        refs, budget, params = train_joint(bench, seed, dataclasses.replace(options, stage_seconds=seconds),
                                           savers.__getitem__)
        result = RunResult(**_common(protocol, bench, seed, options, started, run_id), method=_joint_stamp(),
                           config=joint_settings(protocol), trainable_params=params, reference=refs, budget=budget,
                           wall_time_s=max(s.wall_seconds() for s in savers), stage_seconds=seconds)
        path = save_result(options.results_dir, result)
        record_stored(path)
        for saver in savers:
            saver.discard()
    return result, path


def _joint_identity(protocol: Protocol, seed: int, options: RunOptions) -> RunIdentity:
    """The identity of the joint reference of ``protocol`` and ``seed`` these options make."""
    return options.identity(protocol, JOINT, seed, joint_settings(protocol), {})


def _joint_checkpointer(protocol: Protocol, seed: int, options: RunOptions, part: int) -> Checkpointer:
    """The checkpoint of one joint model (a part of the reference), which also holds it once trained."""
    return _checkpointer(options, "joint", _joint_identity(protocol, seed, options).checkpoint_key(part))


@reads_once
def joint_reference_part(protocol: Protocol, seed: int, part: int, options: RunOptions, bench: Workbench) -> None:
    """Train one model of the joint reference and keep it in its checkpoint, where the step that stores
    the reference finds it (a cluster trains the parts as separate tasks); nothing to do when the
    reference or this part is stored already."""
    protocol = protocol.reference
    if selection(protocol, options, bench.weights).joints.get(seed) is not None:
        return
    with _claim(options, "joint", f"Model {part + 1} of the joint reference of {protocol.name} (seed {seed})",
                _joint_identity(protocol, seed, options).claim_key(part)):
        saver = _joint_checkpointer(protocol, seed, options, part)
        if stored_part(saver) is None:
            with stage(f"training model {part + 1} of the joint reference of {protocol.name} (seed {seed})",
                       [saver]):
                ensure_joint_part(bench, seed, options, part, saver)


def _continual_result(protocol: Protocol, bench: Workbench, spec: MethodSpec, method: Method, seed: int,
                      overrides: dict[str, Any], joint: RunResult, options: RunOptions,
                      run_id: str | None = None, tuned: TunedStamp | None = None, what: str | None = None) -> RunResult:
    """Stage 4: the CL sessions, as an unscored result (metrics filled by ``_score``). ``what``: the
    training as a stop's note names it (None: the stage around it names it)."""
    started = now_iso()
    config = method_settings(method)
    saver = _run_checkpointer(options, options.identity(protocol, spec.text, seed, config, overrides))
    status, seconds = "complete", dict[str, float]()
    try:
        with stage(what, [saver]):
            curves, budget, params = run_cl(bench, method, seed, dataclasses.replace(options, stage_seconds=seconds),
                                            saver)
    except Diverged as stop:  # a result all the same: the curves it made, marked so that nothing ranks it
        say(options, f"{stop} — stored with status 'diverged'.")
        curves, budget, params, status = stop.curves, stop.budget, stop.params, "diverged"
    common = {**_common(protocol, bench, seed, options, started, run_id), "status": status}
    if note := eviction_note(protocol, method):  # the leaderboard puts it on the row
        common["options"]["notes"] = [note]
    return RunResult(**common, method=_stamp(spec),
                     config=config, overrides=overrides, trainable_params=params, curves=curves,
                     budget=efficiency_vs_joint(budget, joint.budget), wall_time_s=saver.wall_seconds(),
                     stage_seconds=seconds, tuned=tuned)


def _checkpointer(options: RunOptions, phase: str, key: str, restart: bool | None = None) -> Checkpointer:
    """The checkpoint of one phase of one run, keyed by what decides its numbers (``key``: its identity's
    ``checkpoint_key``; ``--restart``: drop it; ``restart`` False: only find it, as what a stop leaves is looked
    up before the phase holds its claim)."""
    saver = checkpointer(options.results_dir, phase, key, options.checkpoint_every, options.checkpoint_seconds)
    if options.restart if restart is None else restart:
        saver.discard()
    return saver


def _run_checkpointer(options: RunOptions, identity: RunIdentity, restart: bool | None = None) -> Checkpointer:
    return _checkpointer(options, "run", identity.checkpoint_key(), restart)


def resume_checkpoint(options: RunOptions, identity: RunIdentity) -> Path | None:
    """The checkpoint the method run of ``identity`` would resume from (its mid-session one, else its
    session-end one; None: it starts from its first session), found without reading it, for a dry run to name."""
    saver = _run_checkpointer(options, identity, restart=False)
    return next((p for p in (saver.mid_path, saver.path) if p.is_file()), None)


def _score_and_save(result: RunResult, joint: RunResult, chosen: Selection[Stored], options: RunOptions) -> Path:
    """Stage 5: metrics against the references, then the JSON. Curves are what cost compute: a run whose
    metrics cannot be computed is saved with them, and the error says where."""
    best, best_runs = chosen.best_new(result)
    result.references = References(joint_run=joint.run_id, best_new=best, best_new_runs=best_runs,
                                   best_new_methods=list(chosen.best_new_methods))
    problem = None
    try:
        if result.status == "complete":
            result.metrics = M.compute_metrics(result.curves, joint.reference, best,
                                               eval_weighting=result.eval_weighting)
    except ValueError as exc:
        problem = str(exc)
    with stage(None, stored=stored_result(options.results_dir, result.protocol.name, result.run_id)):
        path = save_result(options.results_dir, result)
        record_stored(path)
        _run_checkpointer(options, RunIdentity.from_result(result).under(options.execution)).discard()
    if problem is not None:
        raise BenchError(f"The run finished and its curves are saved in {path}, but its metrics cannot be "
                         f"computed: {problem}. The leaderboard recomputes them from the stored curves.")
    return path


def _best_new_references(protocol: Protocol, bench: Workbench, seed: int, joint: RunResult, skip: str | None,
                         options: RunOptions) -> None:
    """Run the protocol's A_best reference methods missing for this seed (default settings), then score
    and store them together, so each is scored against the whole set as later runs will be."""
    def missing() -> list[str]:
        done = selection(protocol, options, bench.weights)
        return [m for m in protocol.best_new_reference if m != skip and (m, seed) not in done.runs]

    if not missing():
        return
    # a set of runs, not one: keyed by the set (and the execution), as no one run's identity names it
    with _claim(options, "best_new", f"The A_best reference set of {protocol.name} (seed {seed})",
                options.execution.key(protocol=protocol.spec_hash, seed=seed, methods=list(protocol.best_new_reference),
                                      skip=skip)):
        _train_best_new_references(protocol, bench, seed, joint, missing(), options)


def _train_best_new_references(protocol: Protocol, bench: Workbench, seed: int, joint: RunResult, todo: list[str],
                               options: RunOptions) -> None:
    if not todo:
        return
    done = selection(protocol, options, bench.weights)
    say(options, f"A_best for P_Δ comes from {', '.join(protocol.best_new_reference)} (seed {seed}, "
                 f"{bench.precision}); training the missing {bench.precision} "
                 f"reference run(s) first: {', '.join(todo)}.")
    fresh = []
    quiet = dataclasses.replace(options, on_eval=None)  # live tracking follows the run asked for, not these
    for text in todo:
        spec, method = build_method(text, protocol, {})
        fresh.append(_continual_result(protocol, bench, spec, method, seed, {}, joint, quiet, what=(
            f"training the A_best reference run {text} of {protocol.name} (seed {seed})")))
    done.runs.update({(r.label, seed): (Path(), r) for r in fresh})
    for result in fresh:
        _score_and_save(result, joint, done, options)


@reads_once
def ensure_references(protocol: Protocol, seed: int, options: RunOptions, bench: Workbench | None = None) -> None:
    """The joint reference and the A_best reference runs of one seed, each trained once when missing:
    what ``execute`` does before a method run, as a step of its own for an executor that schedules the
    references of a seed before (and apart from) its method runs."""
    bench = bench or prepare(protocol, seed, options)
    joint, _ = joint_reference(protocol, seed, dataclasses.replace(options, on_eval=None), bench)
    _best_new_references(protocol, bench, seed, joint, None, options)


@reads_once
def execute(protocol: Protocol, method_text: str, seed: int, options: RunOptions,
            bench: Workbench | None = None, run_id: str | None = None,
            tuned: TunedStamp | None = None) -> tuple[RunResult, Path]:
    """Run one method on one protocol and seed (or, for ``joint``, make sure its reference exists);
    write the JSON result atomically and return it. ``run_id``: the id the result gets (live tracking
    knows it before training); ``tuned``: the overrides are a tuned entry's settings (``bench tune``)."""
    check_joint_request(method_text, options.overrides)
    if method_text.strip() == JOINT:
        bench = bench or prepare(protocol, seed, options)
        return joint_reference(protocol, seed, options, bench)
    spec, method = build_method(method_text, protocol, options.overrides)
    if note := eviction_note(protocol, method):  # before any compute: the user may not want this run at all
        print(f"Warning: {note}.", file=sys.stderr)
    run_id = run_id or new_run_id()  # known now, so a stop can tell whether the result was stored
    identity = options.identity(protocol, spec.text, seed, method_settings(method), dict(options.overrides), tuned)
    saver = _run_checkpointer(options, identity, restart=False)
    with stage(f"running {spec.text} on {protocol.name} (seed {seed})", [saver],
               stored_result(options.results_dir, protocol.name, run_id)):
        return _method_run(protocol, method_text, spec, method, identity, options, bench, run_id, tuned)


def _method_run(protocol: Protocol, method_text: str, spec: MethodSpec, method: Method, identity: RunIdentity,
                options: RunOptions, bench: Workbench | None, run_id: str,
                tuned: TunedStamp | None) -> tuple[RunResult, Path]:
    """``execute`` of a method: its references first (when missing), then the run itself, under its claim."""
    seed, overrides = identity.seed, dict(options.overrides)
    bench = bench or prepare(protocol, seed, options)
    # live tracking follows the run asked for, not the reference it may train first
    joint, _ = joint_reference(protocol, seed, dataclasses.replace(options, on_eval=None), bench)
    is_reference = not options.overrides and method_text in protocol.best_new_reference
    _best_new_references(protocol, bench, seed, joint, method_text if is_reference else None, options)

    def stored() -> dict[str, tuple[RunResult, Path]]:
        """This run's stored results (``RunIdentity.same_run``), by id."""
        return {r.run_id: (r, path) for path, r in selection(protocol, options, bench.weights).runs.values()
                if identity.same_run(RunIdentity.from_result(r))}

    # a plain run repeats on purpose what is stored already; a sweep's run was planned as missing, so whatever
    # is stored by the time it holds its claim was stored meanwhile
    before = {} if options.reuse_stored else stored()
    with _claim(options, "run", f"Run {spec.text} of {protocol.name} (seed {seed})", identity.claim_key()) as waited:
        fresh = [found for rid, found in stored().items() if rid not in before] \
            if waited or options.reuse_stored else []
        if fresh:  # another process stored this very run meanwhile: reuse it
            say(options, f"Reusing run {fresh[0][0].run_id}, stored meanwhile by another process.")
            return fresh[0]
        result = _continual_result(protocol, bench, spec, method, seed, overrides, joint, options, run_id,
                                   tuned)
        path = _score_and_save(result, joint, selection(protocol, options, bench.weights), options)
    return result, path
