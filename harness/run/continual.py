"""Stage 4 of a run: the continual-learning sessions 2..N of one method on the workbench.

Exactly U ``observe`` calls per session under the budget guards (or, under a FLOP budget, as many as fit
the session's TFLOPs), batches drawn by the harness (new samples from the session, old ones from the
memory the harness owns), evaluation at update 0, on the protocol's schedule and at the session's end,
FLOPs counted by part. Returns the curves and the budget used; scoring and
storing them is the pipeline's job.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import BenchError
from ..model import flops as FL
from .checkpoint import Checkpointer, rng_state, set_rng_state
from .budget_guards import (add_to_memory, check_memory, check_no_stray_steps, count_optimizer_steps,
                            memory_spec, observe_within_budget)
from ..results.curves import SessionCurve
from .before import measure_before
from .evaluation import eval_plan, evaluate
from .isolation import random_streams
from .memory import Memory
from ..spec.protocol import MAX_UPDATES, Protocol
from ..results.schema import Budget
from ..data.stream import Cycler, Session
from .workbench import Workbench
from .options import RunOptions, say, timed
from .loop import Progress, Stretch, closing_budget, seen_state, setseen_state, train_stretch
from ..model.device import autocast, seed_everything
from ...methods.base import Method


def _curve_point(curve: dict, update: int, acc) -> None:
    curve["updates"].append(update)
    curve["old"].append(acc.old)
    curve["new"].append(acc.new)
    curve["all"].append(acc.all)
    for k, a in enumerate(acc.tasks):
        curve["tasks"][k].append(a)


def session_updates(protocol: Protocol, session: Session) -> int | None:
    """The session's update count, or None under a FLOP budget (known only when the session ends)."""
    return protocol.training.session_updates(len(session.train_ids))


class FlopStop:
    """When a FLOP-budgeted session stops: before the update that would take the session's training
    FLOPs (begin_session's work included) past its budget.

    The next update's cost is predicted from the last update's measured cost (the meter's tally around
    it), which holds whatever the method does per update (teacher forwards, replay decoding, declared
    ``extra_macs``), and is exact for a method whose per-update work is constant within a session, as the
    costs change only at session boundaries (head growth, adapters). Before a session's first update it
    is the standard step's cost from the meter's per-sample costs x batch size (forward and backward of
    each part under the current trainability); a budget that cannot pay for that is refused."""

    def __init__(self, tflops: float, spent: Callable[[], float], first: Callable[[], float], what: str) -> None:
        self.macs = tflops * 1e12 / 2  # FLOPs are 2 x MACs
        self.spent, self.first, self.what = spent, first, what
        self.last: float | None = None  # the last update's measured MACs (checkpointed)

    def affordable(self) -> int:
        """Updates the rest of the session's budget pays for at the price of the next one (at least 1): a
        prediction, for a method whose schedule needs a length (OneCycle), made in ``begin_session`` once
        the modifiers have set what trains. Exact when every update costs what the first one does."""
        cost = self.last if self.last is not None else self.first()
        return max(1, math.floor((self.macs - self.spent()) / cost))

    def __call__(self, update: int) -> bool:
        """True: no more updates in this session (``update`` updates made)."""
        cost = self.last if self.last is not None else self.first()
        over = self.spent() + cost > self.macs
        if over and update == 0:
            raise BenchError(
                f"training.budget.tflops ({self.macs * 2 / 1e12:g}) is smaller than one update of {self.what}: "
                f"the session had spent {FL.flops(self.spent()) / 1e12:.3g} TFLOPs before its first update, "
                f"which costs {FL.flops(cost) / 1e12:.3g} TFLOPs. Give a budget of at least a few updates.")
        return over


class Diverged(Exception):
    """A non-finite loss or weight: the run stops, and what it recorded so far is kept as its result."""

    def __init__(self, message: str, curves: list[SessionCurve], budget: Budget, params: int) -> None:
        super().__init__(message)
        self.curves, self.budget, self.params = curves, budget, params


def _snapshot(bench: Workbench, model: nn.Module, method: Method, memory: Memory, ctx, meter: FL.FlopMeter,
              progress: Progress, rngs: tuple, **extra: Any) -> dict[str, Any]:
    """Everything the rest of the run depends on, as a checkpoint (tensors are copied when serialised)."""
    return {
        "model": model.state_dict(), "method": method.state_dict(), "memory": memory.state_dict(),
        "rng": rng_state(*rngs), "counters": dict(ctx.counters), "tally": copy.deepcopy(meter.tally),
        "seen": [seen_state(s) for s in (bench.train_inputs, bench.test_inputs)],
        "progress": progress.state(),
        **extra,
    }


def _restore(state: dict[str, Any], bench: Workbench, model: nn.Module, method: Method, memory: Memory, ctx,
             meter: FL.FlopMeter, rngs: tuple) -> Progress:
    """Put a snapshot back into freshly built objects of the same structure."""
    model.load_state_dict(state["model"])
    method.load_state_dict(state["method"])
    memory.load_state_dict(state["memory"])
    set_rng_state(state["rng"], *rngs)
    ctx.counters.clear()
    ctx.counters.update(state["counters"])
    meter.tally = copy.deepcopy(state["tally"])
    for store, seen in zip((bench.train_inputs, bench.test_inputs), state["seen"], strict=True):
        setseen_state(store, seen)
    return Progress.from_state(state["progress"])


def _finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters() if p.requires_grad)


def run_cl(bench: Workbench, method: Method, seed: int, options: RunOptions,
           checkpoint: Checkpointer | None = None) -> tuple[list[SessionCurve], Budget, int]:
    """Sessions 2..N: exactly U observe calls each, eval at 0 and on the schedule.

    With a ``checkpoint``, the run saves itself every K updates and at each session end, and starts from
    the stored checkpoint when there is one: a boundary checkpoint (after a session) is the state the next
    session starts from; a mid-session one also holds its session's boundary, so the session's start
    (head growth, ``begin_session``) is replayed exactly before the mid-session state is put back.
    """
    p, stream = bench.protocol, bench.stream
    seed_everything(seed)
    streams = random_streams(seed)  # the harness's batches and head growth; the method gets its own
    rng, generator = streams.harness, streams.harness_torch
    rngs = (rng, generator, streams.method, streams.method_torch)
    model = copy.deepcopy(bench.deployed)
    memory = Memory(memory_spec(p, method), stream.train.labels,
                    lambda gid: method.sample_bytes(gid) or stream.train.sample_bytes(gid), rng)
    if p.memory.include_pretrain:
        memory.add(stream.pretrain_ids, pretrain=True)
    cached = bool(model.trunk_cached)
    meter = FL.FlopMeter(model, bench.input_shape, cached)
    bench.train_inputs.reset_seen()
    bench.test_inputs.reset_seen()
    lent = bench.lend(memory, method, streams)  # views without test data, the method's own streams
    ctx = lent.ctx
    online = p.training.online
    flop_budget = p.training.budget
    b_new, b_old = p.training.batch.new, p.training.batch.old
    if not method.rehearsal:
        b_new, b_old = b_new + b_old, 0
    limit = b_new + b_old
    total = None if flop_budget else sum(session_updates(p, s) for s in stream.sessions)
    accel = autocast(bench.device, bench.precision)
    progress = Progress()

    def closing() -> Budget:
        """The budget as counted so far: at the end, or when the run diverges."""
        return closing_budget(
            progress, meter, bench.train_inputs, bench.test_inputs, options, ctx.counters,
            updates_per_session=[c.total_updates for c in progress.curves], batch_new=b_new, batch_old=b_old,
            optimizer_steps=steps[0], memory_policy=p.memory.policy, memory_capacity=p.memory.capacity,
            memory_peak_samples=memory.peak_samples, memory_peak_bytes=memory.peak_bytes, batch_limit=limit,
            max_trained_per_update=progress.most_trained,
            train_tflops_budget=flop_budget.tflops if flop_budget else None)

    def train_macs() -> float:
        return FL.adjusted_train_macs(meter, ctx.counters)

    def session_tflops() -> float:
        """Training TFLOPs of the session in progress so far, as its budget counts them."""
        return FL.flops(train_macs() - train0) / 1e12

    def snapshot(**extra: Any) -> dict[str, Any]:
        return _snapshot(bench, model, method, memory, ctx, meter, progress, rngs, **extra)

    with count_optimizer_steps() as steps, meter.attached():
        method.setup(model, ctx)
        # the last session boundary (the state the next session starts from), and a mid-session checkpoint
        # when it continues from that boundary (the session's start is replayed first, then it is put back)
        boundary = checkpoint.load() if checkpoint is not None else None
        mid = checkpoint.load(mid=True) if checkpoint is not None else None
        if mid is not None and mid["next_session"] != (boundary["next_session"] if boundary else 0):
            mid = None  # left from a session whose end is stored already
        first = 0
        if boundary is not None or mid is not None:
            where = f"update {mid['update']} of session {stream.sessions[mid['next_session']].index}" if mid else \
                f"the end of session {boundary['next_session'] + 1}"
            say(options, f"Resuming {p.name} {method.label} (seed {seed}) from its checkpoint at {where}.")
        if boundary is not None:
            first = boundary["next_session"]
            grown = stream.sessions[first - 1].seen_classes if first else model.head.num_classes
            model.head.grow(grown - model.head.num_classes, generator)
            progress = _restore(boundary, bench, model, method, memory, ctx, meter, rngs)
            steps[0] = progress.steps
        bar = tqdm(total=total, initial=progress.observed, desc=f"{p.name} {method.label}", unit="upd",
                   disable=not options.progress)
        for pos in range(first, len(stream.sessions)):
            session = stream.sessions[pos]
            train0, eval0 = train_macs(), meter.eval_macs()
            check_no_stray_steps(method, steps[0], progress.observed, "setup or end_session")
            before = measure_before(model, lent.predict, method, bench.test_inputs, eval_plan(stream, session),
                                    p.eval.batch_size, meter, accel)
            lent.begin_session(session)
            model.head.grow(len(session.new_classes), generator)
            stop = None if flop_budget is None else FlopStop(
                flop_budget.tflops, lambda: train_macs() - train0,
                lambda: (b_new + b_old) * FL.update_macs_per_sample(meter), f"{method.label} in session {session.index}")
            if stop is not None:
                ctx.planned_updates = stop.affordable
            method.begin_session(session)
            progress.params = max(progress.params, sum(p_.numel() for p_ in model.parameters() if p_.requires_grad))
            U = session_updates(p, session)
            made = [0]  # updates made in the session (the last update ``at`` was called for)
            plan = eval_plan(stream, session)
            curve = {"updates": [], "old": [], "new": [], "all": [], "tasks": [[] for _ in range(plan.tasks)],
                     "train_flops": [], "loss": []}
            arrivals = Cycler(session.train_ids, rng, shuffle=not online)

            def draw() -> tuple[np.ndarray, np.ndarray]:
                new_ids = arrivals.take(b_new)
                return new_ids, memory.sample(b_old, p.training.class_balanced) if b_old else new_ids[:0]

            u0, pending = 0, None
            if mid is not None and mid["next_session"] == pos:  # the session's start replayed: now its middle
                progress = _restore(mid, bench, model, method, memory, ctx, meter, rngs)
                steps[0] = progress.steps
                u0, curve, (train0, eval0) = mid["update"], mid["curve"], mid["flops0"]
                arrivals.order, arrivals.pos = mid["arrivals"]
                pending = mid.get("pending")  # absent from checkpoints that drew batch by batch
                if stop is not None:
                    stop.last = mid.get("last_update_macs")
                mid = None

            spent_at = [session_tflops()]  # compute schedules: the session's TFLOPs at the previous boundary

            def due(u: int) -> bool:
                if p.eval.tflops is None:
                    return p.eval.due(u)
                before, spent_at[0] = spent_at[0], session_tflops()
                return u == 0 or p.eval.tflops.due(before, spent_at[0])

            def at(u: int) -> None:
                made[0] = u
                ends = u == U if stop is None else stop(u)
                if (due(u) or ends) and not (u == u0 and u0 > 0):  # a resumed point was evaluated before the checkpoint
                    model.eval()
                    # predict comes from a throwaway copy of the method
                    with (timed(progress.seconds, "eval", bench.device), meter.evaluating(), accel,
                          lent.predict(method) as predict):
                        acc = evaluate(predict, bench.test_inputs, plan, p.eval.batch_size,
                                       f"eval S{session.index} u{u}" if options.progress else None, meter)
                    _curve_point(curve, u, acc)
                    if options.on_eval is not None:
                        options.on_eval(session.index, u, acc)
                    curve["train_flops"].append(FL.flops(train_macs()))
                    bar.set_postfix(session=session.index, old=f"{acc.old:.3f}", new=f"{acc.new:.3f}")

            def save(u: int, planned: list | None) -> None:
                progress.steps = steps[0]
                checkpoint.save(snapshot(kind="mid", next_session=pos, update=u, curve=curve, flops0=(train0, eval0),
                                         arrivals=(arrivals.order, arrivals.pos), pending=planned,
                                         last_update_macs=stop.last if stop else None), mid=True)

            def step(u: int, batch: tuple[np.ndarray, np.ndarray]) -> None:
                new_ids, old_ids = batch
                ids = np.concatenate([new_ids, old_ids])
                check_no_stray_steps(method, steps[0], progress.observed, "begin_session or predict")
                before = train_macs()
                with timed(progress.seconds, "train", bench.device), accel:
                    stats, trained = observe_within_budget(method, bench.batch(ids, len(new_ids)), steps, meter, limit)
                if stop is not None:
                    stop.last = train_macs() - before
                curve["loss"].append(float(stats.loss))  # the paper's Fig. 2a
                if not math.isfinite(curve["loss"][-1]) or not _finite(model):
                    what = f"loss {curve['loss'][-1]}" if not math.isfinite(curve["loss"][-1]) else "a non-finite weight"
                    partial = {**curve, "loss": []}  # the session's points so far (its losses are not all there)
                    progress.curves.append(SessionCurve(session=session.index, total_updates=U or u + 1, before=before,
                                                        **partial))
                    raise Diverged(f"{method.name} diverged at update {u + 1} of session {session.index}: {what}",
                                   progress.curves, closing(), progress.params)
                progress.most_trained, progress.observed = max(progress.most_trained, trained), progress.observed + 1
                check_memory(method, memory)
                progress.samples += len(ids)
                if online:
                    add_to_memory(method, memory, new_ids)

            # under a FLOP budget the count is known only at the end: batches are drawn when due, not ahead
            train_stretch(Stretch(f"session {session.index}", "continual", U or MAX_UPDATES, draw, step, start=u0,
                                  pending=pending, draw_ahead=not online and stop is None, ids_of=np.concatenate,
                                  before=at, save=save, bar=bar, stop=stop),
                          checkpoint, bench.train_inputs, options)
            method.end_session(session)
            check_memory(method, memory)
            lent.check_storage(method)
            check_no_stray_steps(method, steps[0], progress.observed, "predict or end_session")
            if not online:
                add_to_memory(method, memory, session.train_ids)
            progress.train_per_session.append(FL.flops(train_macs() - train0))
            progress.eval_per_session.append(FL.flops(meter.eval_macs() - eval0))
            progress.curves.append(SessionCurve(session=session.index, total_updates=made[0], before=before, **curve))
            progress.steps = steps[0]
            if checkpoint is not None:
                checkpoint.save(snapshot(kind="boundary", next_session=pos + 1))
        budget = closing()
    bar.close()
    return progress.curves, budget, progress.params
