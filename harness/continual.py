"""Stage 4 of a run: the continual-learning sessions 2..N of one method on the workbench.

Exactly U ``observe`` calls per session under the budget guards, batches drawn by the harness (new
samples from the session, old ones from the memory the harness owns), evaluation at update 0 and on the
protocol's schedule, FLOPs counted by part. Returns the curves and the budget used; scoring and
storing them is the pipeline's job.
"""

from __future__ import annotations

import copy

import numpy as np
from tqdm.auto import tqdm

from . import flops as FL
from .budget_guards import (add_to_memory, check_memory, check_no_stray_steps, count_optimizer_steps,
                            memory_spec, observe_within_budget)
from .curves import SessionCurve
from .evaluation import eval_plan, evaluate
from .isolation import lend, random_streams
from .memory import Memory
from .protocol import Protocol
from .results import Budget
from .stream import Cycler, Session
from .workbench import RunOptions, Workbench, autocast, seed_everything
from ..methods.base import Method


def _curve_point(curve: dict, update: int, acc) -> None:
    curve["updates"].append(update)
    curve["old"].append(acc.old)
    curve["new"].append(acc.new)
    curve["all"].append(acc.all)
    for k, a in enumerate(acc.tasks):
        curve["tasks"][k].append(a)


def session_updates(protocol: Protocol, session: Session) -> int:
    u = protocol.training.updates
    return len(session.train_ids) if u == "per_sample" else u


def macs_per_sample(meter: FL.FlopMeter) -> dict[str, float]:
    return {part: meter.cost(part).forward for part in FL.PARTS}


def run_cl(bench: Workbench, method: Method, seed: int, options: RunOptions) -> tuple[list[SessionCurve], Budget, int]:
    """Sessions 2..N: exactly U observe calls each, eval at 0 and on the schedule."""
    p, stream = bench.protocol, bench.stream
    seed_everything(seed)
    streams = random_streams(seed)  # the harness's batches and head growth; the method gets its own
    rng, generator = streams.harness, streams.harness_torch
    model = copy.deepcopy(bench.deployed)
    memory = Memory(memory_spec(p, method), stream.train.labels,
                    lambda gid: method.sample_bytes(gid) or stream.train.sample_bytes(gid), rng)
    if p.memory.include_pretrain:
        memory.add(stream.pretrain_ids)
    cached = bool(model.trunk_cached)
    meter = FL.FlopMeter(model, bench.input_shape, cached)
    bench.train_inputs.reset_seen()
    bench.test_inputs.reset_seen()
    lent = lend(bench, memory, method, streams)
    ctx = lent.ctx
    online = p.training.updates == "per_sample"
    b_new, b_old = p.training.batch.new, p.training.batch.old
    if not method.rehearsal:
        b_new, b_old = b_new + b_old, 0
    limit = b_new + b_old
    total = sum(session_updates(p, s) for s in stream.sessions)
    bar = tqdm(total=total, desc=f"{p.name} {method.name}", unit="upd", disable=not options.progress)
    curves, samples, steps_all, params, most_trained, observed = [], 0, 0, 0, 0, 0
    train_per_session: list[float] = []
    eval_per_session: list[float] = []
    accel = autocast(bench.device, options.amp)

    def train_macs() -> float:
        return FL.adjusted_train_macs(meter, ctx.counters)

    with count_optimizer_steps() as steps, meter.attached():
        method.setup(model, ctx)
        for session in stream.sessions:
            train0, eval0 = train_macs(), meter.eval_macs()
            check_no_stray_steps(method, steps[0], observed, "setup or end_session")
            lent.begin_session(session)
            model.head.grow(len(session.new_classes), generator)
            method.begin_session(session)
            params = max(params, sum(p_.numel() for p_ in model.parameters() if p_.requires_grad))
            U = session_updates(p, session)
            points = set(p.eval.points(U))
            plan = eval_plan(stream, session)
            curve = {"updates": [], "old": [], "new": [], "all": [], "tasks": [[] for _ in range(plan.tasks)],
                     "train_flops": []}
            arrivals = Cycler(session.train_ids, rng, shuffle=not online)
            for u in range(U + 1):
                if u in points:
                    model.eval()
                    with meter.evaluating(), accel, lent.predict(method) as predict:
                        acc = evaluate(predict, bench.test_inputs, plan, p.eval.batch_size)
                    _curve_point(curve, u, acc)
                    curve["train_flops"].append(FL.flops(train_macs()))
                    bar.set_postfix(session=session.index, old=f"{acc.old:.3f}", new=f"{acc.new:.3f}")
                if u == U:
                    break
                new_ids = arrivals.take(b_new)
                old_ids = memory.sample(b_old, p.training.class_balanced) if b_old else new_ids[:0]
                ids = np.concatenate([new_ids, old_ids])
                check_no_stray_steps(method, steps[0], observed, "begin_session or predict")
                with accel:
                    _, trained = observe_within_budget(method, bench.batch(ids, len(new_ids)), steps, meter, limit)
                most_trained, observed = max(most_trained, trained), observed + 1
                check_memory(method, memory)
                samples += len(ids)
                if online:
                    add_to_memory(method, memory, new_ids)
                bar.update(1)
            method.end_session(session)
            check_memory(method, memory)
            lent.check_storage(method)
            check_no_stray_steps(method, steps[0], observed, "predict or end_session")
            if not online:
                add_to_memory(method, memory, session.train_ids)
            train_per_session.append(FL.flops(train_macs() - train0))
            eval_per_session.append(FL.flops(meter.eval_macs() - eval0))
            curves.append(SessionCurve(session=session.index, total_updates=U, **curve))
        steps_all = steps[0]
        macs = macs_per_sample(meter)
    bar.close()
    train_total, eval_total = train_macs(), meter.eval_macs()
    budget = Budget(
        updates_per_session=[c.total_updates for c in curves], batch_new=b_new, batch_old=b_old,
        samples_trained=samples, optimizer_steps=steps_all, memory_policy=p.memory.policy,
        memory_capacity=p.memory.capacity, memory_peak_samples=memory.peak_samples,
        memory_peak_bytes=memory.peak_bytes,
        train_flops=FL.flops(train_total), eval_flops=FL.flops(eval_total),
        train_flops_per_session=train_per_session, eval_flops_per_session=eval_per_session,
        train_flops_executed=FL.flops(FL.executed_macs(
            meter, "train", train_total, bench.train_inputs.distinct_seen(),
            ctx.counters.get(FL.TRUNK_FEATURE_SAMPLES, 0.0))),
        eval_flops_executed=FL.flops(FL.executed_macs(meter, "eval", eval_total, bench.test_inputs.distinct_seen())),
        macs_per_sample=macs, forward_samples=FL.forward_samples_summary(meter),
        declared={k: float(v) for k, v in ctx.counters.items()}, batch_limit=limit,
        max_trained_per_update=most_trained, trunk_cached=cached, flops_convention=FL.CONVENTION,
    )
    return curves, budget, params
