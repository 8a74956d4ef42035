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

from . import flops as FL
from .continual import macs_per_sample
from .curves import ReferenceSession
from .evaluation import eval_plan, evaluate
from .protocol import Protocol
from .results import Budget
from .workbench import RunOptions, Workbench, autocast, seed_everything, train_offline
from ..methods.base import MethodConfig


def joint_config(protocol: Protocol) -> MethodConfig:
    """The joint model's optimizer settings: the protocol's ``joint`` section, no layer-wise decay (it
    is an upper bound, trained like the deployed model), the whole body and head plastic."""
    return MethodConfig(lr=protocol.joint.lr, weight_decay=protocol.joint.weight_decay, layer_decay=1.0,
                        trainable="body+head")


def joint_settings(protocol: Protocol) -> dict[str, Any]:
    """What a stored joint run's ``config`` must equal to serve as this protocol's A_joint."""
    return joint_config(protocol).model_dump(mode="json")


def train_joint(bench: Workbench, seed: int, options: RunOptions) -> tuple[list[ReferenceSession], Budget, int]:
    """Per session j, the deployed model retrained on S1..Sj with the protocol's joint budget."""
    p, stream = bench.protocol, bench.stream
    refs, params, samples = [], 0, 0
    final_model = None
    cached = bool(bench.deployed.trunk_cached)
    bench.train_inputs.reset_seen()
    bench.test_inputs.reset_seen()
    train_total, eval_total, train_trunk_samples = 0.0, 0.0, 0
    train_per_model: list[float] = []
    eval_per_session: list[float] = []
    samples_by_part: dict[str, int] = {}
    macs: dict[str, float] = {}
    for session in stream.sessions:
        generator = seed_everything(seed + session.index)
        rng = np.random.default_rng(seed + session.index)
        if p.joint.mode == "per_session" or final_model is None:
            model = copy.deepcopy(bench.deployed)
            upto = session.index if p.joint.mode == "per_session" else stream.sessions[-1].index
            model.head.grow(stream.sessions[upto - 2].seen_classes - model.head.num_classes, generator)
            meter = FL.FlopMeter(model, bench.input_shape, cached)
            with meter.attached():
                train_offline(bench, model, joint_config(p), stream.session_ids(upto), p.joint.updates,
                              p.joint.batch_size, rng, generator, f"joint S1..S{upto}", options)
            samples += p.joint.updates * p.joint.batch_size
            params = max(params, model.trainable_parameters())
            final_model = model
            train_per_model.append(FL.flops(meter.train_macs()))
            train_total += meter.train_macs()
            train_trunk_samples += meter.tally.fwd_samples["train"]["trunk"]
            for key, value in FL.forward_samples_summary(meter).items():
                samples_by_part[key] = samples_by_part.get(key, 0) + value
        model = final_model
        model.eval()
        plan = eval_plan(stream, session)
        n = session.seen_classes
        meter = FL.FlopMeter(model, bench.input_shape, cached)
        with meter.attached(), meter.evaluating(), autocast(bench.device, options.amp):
            acc = evaluate(lambda x: model(x)[:, :n], bench.test_inputs, plan, p.eval.batch_size)
        eval_per_session.append(FL.flops(meter.eval_macs()))
        eval_total += meter.eval_macs()
        for key, value in FL.forward_samples_summary(meter).items():
            samples_by_part[key] = samples_by_part.get(key, 0) + value
        macs = macs_per_sample(meter)
        refs.append(ReferenceSession(session=session.index, old=acc.old, new=acc.new, all=acc.all, tasks=acc.tasks))
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
