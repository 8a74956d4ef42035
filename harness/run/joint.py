"""Stage 3 of a run: the joint reference, A_joint, which the harness owns.

Per session j, the deployed model retrained on S1..Sj (or once on everything, ``joint.mode: final``)
with the protocol's joint budget and optimizer settings, and nothing else: a user cannot perturb it
(``-m joint`` with modifiers or ``--set`` is refused), so a stored joint run is keyed by the protocol
hash, the seed and these settings. ``harness.results.select_runs`` finds it; the pipeline trains it
when there is none.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..model import flops as FL
from ..model.backbone import SplitModel
from .checkpoint import Checkpointer
from .continual import seen_state, setseen_state, macs_per_sample
from ..results.curves import ReferenceSession
from .evaluation import eval_plan, evaluate
from ..spec.protocol import Protocol
from ..results.schema import Budget
from .workbench import (OfflineCheckpoint, RunOptions, Workbench, autocast, say, seed_everything, timed,
                        train_offline)
from ...methods.base import MethodConfig


def joint_config(protocol: Protocol) -> MethodConfig:
    """The joint model's optimizer settings: the protocol's ``joint`` section, no layer-wise decay (it
    is an upper bound, trained like the deployed model), the whole body and head plastic."""
    return MethodConfig(lr=protocol.joint.lr, weight_decay=protocol.joint.weight_decay, layer_decay=1.0,
                        trainable="body+head")


def _joint_model(bench: Workbench, upto: int, generator: torch.Generator) -> SplitModel:
    """The deployed model with a head over every class of sessions 1..``upto``."""
    model = copy.deepcopy(bench.deployed)
    model.head.grow(bench.stream.sessions[upto - 2].seen_classes - model.head.num_classes, generator)
    return model


def joint_settings(protocol: Protocol) -> dict[str, Any]:
    """What a stored joint run's ``config`` must equal to serve as this protocol's A_joint."""
    return joint_config(protocol).model_dump(mode="json")


@dataclass
class JointProgress:
    """What the joint reference has accumulated over its sessions (checkpointed at each session end)."""

    refs: list[dict] = field(default_factory=list)
    params: int = 0
    samples: int = 0
    train_total: float = 0.0
    eval_total: float = 0.0
    train_trunk_samples: int = 0
    train_per_model: list[float] = field(default_factory=list)
    eval_per_session: list[float] = field(default_factory=list)
    samples_by_part: dict[str, int] = field(default_factory=dict)
    macs: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time by stage ("train", "eval")

    def add_samples(self, meter: FL.FlopMeter) -> None:
        for key, value in FL.forward_samples_summary(meter).items():
            self.samples_by_part[key] = self.samples_by_part.get(key, 0) + value


def train_joint(bench: Workbench, seed: int, options: RunOptions,
                checkpoint: Checkpointer | None = None) -> tuple[list[ReferenceSession], Budget, int]:
    """Per session j, the deployed model retrained on S1..Sj with the protocol's joint budget. With a
    ``checkpoint``, it saves itself inside each model's training and after each session, and resumes."""
    p, stream = bench.protocol, bench.stream
    final_model = None
    cached = bool(bench.deployed.trunk_cached)
    bench.train_inputs.reset_seen()
    bench.test_inputs.reset_seen()
    acc = JointProgress()
    state = checkpoint.load() if checkpoint is not None else None
    first = 0
    if state is not None:
        say(options, f"Resuming the joint reference (seed {seed}) from its checkpoint: model "
                     f"{state['next_session'] + 1}" + (f", update {state['update']}" if state["kind"] == "mid" else ""))
        acc = JointProgress(**copy.deepcopy(state["progress"]))
        for store, seen in zip((bench.train_inputs, bench.test_inputs), state["seen"], strict=True):
            setseen_state(store, seen)
        first = state["next_session"]
        if state.get("final_model") is not None:  # joint.mode final: the one model, trained already
            final_model = _joint_model(bench, stream.sessions[-1].index, torch.Generator())
            final_model.load_state_dict(state["final_model"])

    def outer(pos: int) -> dict[str, Any]:
        return {"progress": copy.deepcopy(acc.__dict__), "next_session": pos,
                "seen": [seen_state(s) for s in (bench.train_inputs, bench.test_inputs)],
                "final_model": final_model.state_dict() if final_model is not None and p.joint.mode == "final" else None}

    for pos in range(first, len(stream.sessions)):
        session = stream.sessions[pos]
        generator = seed_everything(seed + session.index)
        rng = np.random.default_rng(seed + session.index)
        if p.joint.mode == "per_session" or final_model is None:
            upto = session.index if p.joint.mode == "per_session" else stream.sessions[-1].index
            model = _joint_model(bench, upto, generator)
            meter = FL.FlopMeter(model, bench.input_shape, cached)
            resume = state if state is not None and state["kind"] == "mid" and state["next_session"] == pos else None
            saving = None if checkpoint is None else OfflineCheckpoint(checkpoint, "joint", lambda: outer(pos), meter,
                                                                       resume)
            with meter.attached(), timed(acc.seconds, "train"):
                train_offline(bench, model, joint_config(p), stream.session_ids(upto), p.joint.updates,
                              p.joint.batch_size, rng, generator, f"joint S1..S{upto}", options, saving)
            acc.samples += p.joint.updates * p.joint.batch_size
            acc.params = max(acc.params, model.trainable_parameters())
            final_model = model
            acc.train_per_model.append(FL.flops(meter.train_macs()))
            acc.train_total += meter.train_macs()
            acc.train_trunk_samples += meter.tally.fwd_samples["train"]["trunk"]
            acc.add_samples(meter)
        model = final_model
        model.eval()
        plan = eval_plan(stream, session)
        n = session.seen_classes
        meter = FL.FlopMeter(model, bench.input_shape, cached)
        with timed(acc.seconds, "eval"), meter.attached(), meter.evaluating(), autocast(bench.device, options.amp):
            result = evaluate(lambda x: model(x)[:, :n], bench.test_inputs, plan, p.eval.batch_size,
                              f"eval joint S1..S{session.index}" if options.progress else None)
        acc.eval_per_session.append(FL.flops(meter.eval_macs()))
        acc.eval_total += meter.eval_macs()
        acc.add_samples(meter)
        acc.macs = macs_per_sample(meter)
        acc.refs.append(ReferenceSession(session=session.index, old=result.old, new=result.new, all=result.all,
                                         tasks=result.tasks).model_dump())
        if checkpoint is not None:
            checkpoint.save({"kind": "boundary", **outer(pos + 1)})
    refs, params, samples, macs = [ReferenceSession(**r) for r in acc.refs], acc.params, acc.samples, acc.macs
    if options.stage_seconds is not None:
        options.stage_seconds.update(acc.seconds)
    train_total, eval_total, train_trunk_samples = acc.train_total, acc.eval_total, acc.train_trunk_samples
    train_per_model, eval_per_session, samples_by_part = acc.train_per_model, acc.eval_per_session, acc.samples_by_part
    n_trainings = len(stream.sessions) if p.joint.mode == "per_session" else 1
    trunk = macs.get("trunk", 0.0)
    train_executed, eval_executed = train_total, eval_total
    if cached:  # the trunk ran once per distinct image, not once per sample
        train_executed += (bench.train_inputs.distinct_seen() - train_trunk_samples) * trunk
        eval_executed += (bench.test_inputs.distinct_seen() - samples_by_part.get("eval/trunk/forward", 0)) * trunk
    budget = Budget(
        updates_per_session=[p.joint.updates] * n_trainings, batch_new=p.joint.batch_size, batch_old=0,
        samples_trained=samples, optimizer_steps=p.joint.updates * n_trainings, memory_policy="all data",
        memory_capacity=None, memory_peak_samples=len(stream.session_ids(stream.sessions[-1].index)),
        memory_peak_bytes=0,
        train_flops=FL.flops(train_total), eval_flops=FL.flops(eval_total),
        train_flops_per_session=train_per_model, eval_flops_per_session=eval_per_session,
        train_flops_executed=FL.flops(train_executed), eval_flops_executed=FL.flops(eval_executed),
        macs_per_sample=macs or None, forward_samples=samples_by_part, batch_limit=p.joint.batch_size,
        max_trained_per_update=p.joint.batch_size,
        trunk_cached=cached, flops_convention=FL.CONVENTION,
    )
    return refs, budget, params
