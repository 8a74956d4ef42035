"""Stage 3 of a run: the joint reference, A_joint, which the harness owns.

Per session j, the deployed model retrained on S1..Sj (or once on everything, ``joint.mode: final``)
with the protocol's joint budget and optimizer settings, and nothing else: a user cannot perturb it
(``-m joint`` with modifiers or ``--set`` is refused), so a stored joint run is keyed by the protocol
hash, the seed and these settings. ``harness.results.select_runs`` finds it; the pipeline trains it
when there is none.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from ..model import flops as FL
from ..model.backbone import SplitModel
from .checkpoint import Checkpointer
from .loop import Progress, closing_budget, seen_state, setseen_state
from ..results.curves import ReferenceSession
from .evaluation import eval_plan, eval_point
from .isolation import isolated_model_predict
from ..results.schema import Budget
from .workbench import OfflineCheckpoint, Workbench, train_offline
from .options import RunOptions, say, timed
from ..model.device import autocast, seed_everything
from ...methods.configs import joint_config


def _joint_model(bench: Workbench, upto: int, generator: torch.Generator) -> SplitModel:
    """The deployed model with a head over every class of sessions 1..``upto``."""
    model = copy.deepcopy(bench.deployed)
    model.head.grow(bench.stream.sessions[upto - 2].seen_classes - model.head.num_classes, generator)
    return model


def train_joint(bench: Workbench, seed: int, options: RunOptions,
                checkpoint: Checkpointer | None = None) -> tuple[list[ReferenceSession], Budget, int]:
    """Per session j, the deployed model retrained on S1..Sj with the protocol's joint budget. With a
    ``checkpoint``, it saves itself inside each model's training and after each session, and resumes.

    Every model it trains and evaluates is counted on one FLOP tally, closed into the budget by the
    same code as a continual run's."""
    p, stream = bench.protocol, bench.stream
    final_model = None
    cached = bool(bench.deployed.trunk_cached)
    bench.train_inputs.reset_seen()
    bench.test_inputs.reset_seen()
    progress, tally = Progress(), FL.Tally.zero()
    model_start = 0.0  # the tally's training MACs when the model in training started
    state = checkpoint.load() if checkpoint is not None else None
    first = 0
    if state is not None:
        say(options, f"Resuming the joint reference (seed {seed}) from its checkpoint: model "
                     f"{state['next_session'] + 1}" + (f", update {state['update']}" if state["kind"] == "mid" else ""))
        progress = Progress.from_state(copy.deepcopy(state["progress"]))
        tally, model_start = copy.deepcopy(state["tally"]), state["model_start"]
        for store, seen in zip((bench.train_inputs, bench.test_inputs), state["seen"], strict=True):
            setseen_state(store, seen)
        first = state["next_session"]
        if state.get("final_model") is not None:  # joint.mode final: the one model, trained already
            final_model = _joint_model(bench, stream.sessions[-1].index, torch.Generator())
            final_model.load_state_dict(state["final_model"])

    def outer(pos: int) -> dict[str, Any]:
        return {"progress": copy.deepcopy(progress.state()), "tally": copy.deepcopy(tally), "model_start": model_start,
                "next_session": pos,
                "seen": [seen_state(s) for s in (bench.train_inputs, bench.test_inputs)],
                "final_model": final_model.state_dict() if final_model is not None and p.joint.mode == "final" else None}

    def meter_for(model: SplitModel) -> FL.FlopMeter:
        meter = FL.FlopMeter(model, bench.input_shape, cached)
        meter.tally = tally
        return meter

    meter = None
    for pos in range(first, len(stream.sessions)):
        session = stream.sessions[pos]
        generator = seed_everything(seed + session.index)
        rng = np.random.default_rng(seed + session.index)
        if p.joint.mode == "per_session" or final_model is None:
            upto = session.index if p.joint.mode == "per_session" else stream.sessions[-1].index
            model = _joint_model(bench, upto, generator)
            meter = meter_for(model)
            resume = state if state is not None and state["kind"] == "mid" and state["next_session"] == pos else None
            if resume is None:
                model_start = meter.train_macs()
            saving = None if checkpoint is None else OfflineCheckpoint(checkpoint, "joint", lambda: outer(pos), resume)
            with meter.attached(), timed(progress.seconds, "train", bench.device):
                train_offline(bench, model, joint_config(p), stream.session_ids(upto), p.joint.updates,
                              p.joint.batch_size, rng, generator, f"joint S1..S{upto}", options, saving)
            progress.samples += p.joint.updates * p.joint.batch_size
            progress.params = max(progress.params, model.trainable_parameters())
            final_model = model
            progress.train_per_session.append(FL.flops(meter.train_macs() - model_start))
        model = final_model
        model.eval()
        plan = eval_plan(stream, session)
        n = session.seen_classes
        meter = meter_for(model)
        eval0 = meter.eval_macs()
        with meter.attached():
            result = eval_point(isolated_model_predict(model, n), bench.test_inputs, plan, p.eval.batch_size, meter,
                                progress.seconds, bench.device, autocast(bench.device, bench.precision),
                                f"eval joint S1..S{session.index}" if options.progress else None)
        if options.on_eval is not None:  # the point closes the joint model's training: its step is that count
            options.on_eval(session.index, p.joint.updates, result)
        progress.eval_per_session.append(FL.flops(meter.eval_macs() - eval0))
        progress.refs.append(ReferenceSession(session=session.index, old=result.old, new=result.new, all=result.all,
                                              tasks=result.tasks).model_dump())
        if checkpoint is not None:
            checkpoint.save({"kind": "boundary", **outer(pos + 1)})
    if meter is None:  # resumed after the last session: the final model's structure gives the per-sample costs
        meter = meter_for(_joint_model(bench, stream.sessions[-1].index, torch.Generator()))
    n_trainings = len(stream.sessions) if p.joint.mode == "per_session" else 1
    budget = closing_budget(
        progress, meter, bench.train_inputs, bench.test_inputs, options,
        updates_per_session=[p.joint.updates] * n_trainings, batch_new=p.joint.batch_size, batch_old=0,
        optimizer_steps=p.joint.updates * n_trainings, memory_policy="all data", memory_capacity=None,
        memory_peak_samples=len(stream.session_ids(stream.sessions[-1].index)), memory_peak_bytes=0,
        batch_limit=p.joint.batch_size, max_trained_per_update=p.joint.batch_size)
    return [ReferenceSession(**r) for r in progress.refs], budget, progress.params
