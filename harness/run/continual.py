"""Stage 4 of a run: the continual-learning sessions 2..N of one method on the workbench.

Exactly U ``observe`` calls per session under the budget guards (or, under a FLOP budget, as many as fit
the session's TFLOPs), batches drawn by the harness (new samples from the session, old ones from the
memory the harness owns), evaluation at update 0, on the protocol's schedule and at the session's end,
FLOPs counted by part. Returns the curves and the budget used; scoring and storing them is the
pipeline's job.

The loop is one object, ``ContinualRun``: its state is its attributes, one ``state_dict`` /
``load_state_dict`` pair is its checkpoint, and each step of a run is a method (``resume``,
``begin_session``, ``update``, ``eval_point``, ``end_session``), in the manner of Lightning's loops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...methods.base import Method, StepStats
from ..data.old_mix import Shares, SourceTiles, by_source_shares
from ..data.stream import Cycler, Session
from ..model import flops as FL
from ..model.device import autocast, seed_everything
from ..model.module_copy import deepcopy_with_modules
from ..progress_bar import Bar, MeasuredBar, progress_bar
from ..results.curves import BeforePoint, SessionCurve
from ..results.schema import Budget
from ..spec.protocol import MAX_UPDATES, Protocol
from .before import measure_before
from .budget_guards import StepCounter, count_optimizer_steps, memory_spec, observe_counted
from .checkpoint import Checkpointer
from .evaluation import EvalPlan, eval_plan, eval_point
from .isolation import random_streams
from .loop import Stretch, closing_budget, train_stretch
from .memory import Memory, Overfilled
from .method_calls import MethodCalls
from .options import RunOptions
from .referee import Facts, Referee, isolated_predict
from .report import say, settle_spans, timed
from .schedule import EvalSchedule, FlopStop
from .stage import Stage
from .update_reads import UpdateReads
from .workbench import Workbench

__all__ = ["ContinualRun", "Diverged", "FlopStop", "run_cl", "session_updates"]

def session_updates(protocol: Protocol, session: Session) -> int | None:
    """The session's update count, or None under a FLOP budget (known only when the session ends)."""
    return protocol.training.session_updates(len(session.train_ids))


class Diverged(Exception):
    """A non-finite loss or weight: the run stops, and what it recorded so far is kept as its result. It is
    found where the loop reads the updates' losses (``UpdateReads``), so the updates made between the first
    non-finite one and that read are spent and counted in the budget; the curve has no point after it."""

    def __init__(self, message: str, curves: list[SessionCurve], budget: Budget, params: int) -> None:
        super().__init__(message)
        self.curves, self.budget, self.params = curves, budget, params


def _kind(value: object) -> str:
    """What a hook returned, in a few words: None, or the type of the value (never its repr: it may be huge)."""
    return "None" if value is None else f"a {type(value).__name__}"


def _step_problem(stats: object) -> str | None:  # whatever observe returned, unchecked
    """What is wrong with what ``observe`` returned (None: a StepStats whose loss is one number), checked
    on the tensor's shape only, so no update waits for the device."""
    if not isinstance(stats, StepStats):
        return f"it returned {_kind(stats)}, where StepStats(loss=...) is due"
    loss = stats.loss
    if isinstance(loss, Tensor):
        return None if loss.numel() == 1 else (f"its StepStats.loss is a tensor of shape {list(loss.shape)}, where "
                                               f"one number (the update's mean loss, e.g. loss.mean()) is due")
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return None
    return f"its StepStats.loss is {_kind(loss)}, where a 0-dim tensor or a float is due"


def _finite(model: torch.nn.Module) -> bool:
    """Every trained weight finite, read with one host sync (on CUDA, one per parameter would stall
    every update as many times as the model has tensors). Each tensor's largest magnitude comes from one
    fused call (a per-tensor check cost 4 ms a read for 150 tensors, 2 ms this way); it is infinite or NaN
    exactly where one of the tensor's values is."""
    trained = [p.detach() for p in model.parameters() if p.requires_grad and p.numel()]
    if not trained:
        return True
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(trained, float("inf")))).all())


def _new_curve(tasks: int) -> dict[str, list]:
    return {"updates": [], "old": [], "new": [], "all": [], "tasks": [[] for _ in range(tasks)],
            "train_flops": [], "loss": []}


@dataclass
class OpenSession:
    """The session in progress: what its updates, eval points and mid-session checkpoints share."""

    pos: int  # the session's position in the stream's sessions
    session: Session
    updates: int | None  # U; None under a FLOP budget
    train0: float  # training and evaluation MACs when the session began
    eval0: float
    stop: FlopStop | None = None
    plan: EvalPlan | None = None
    arrivals: Cycler | None = None
    curve: dict[str, list] = field(default_factory=dict)
    start: int = 0  # the update a resumed session continues from
    pending: list | None = None  # batches drawn before a mid-session checkpoint and not trained yet
    made: int = 0  # updates made (the last update an eval point was asked for)
    schedule: EvalSchedule | None = None
    shares: Shares | None = None  # the batch's shares by source (``training.old_mix: by_source``)
    tiles: SourceTiles | None = None  # the session's lists of draws by source (``training.source_draw: tiled``)
    before: BeforePoint | None = None  # accuracies of the model the session starts from


class ContinualRun(Stage):
    """Sessions 2..N of ``method`` on ``bench`` with ``seed``: exactly U observe calls each, evaluated at
    update 0 and on the schedule.

    With a ``checkpoint``, the run saves itself every K updates and at each session end, and starts from
    the stored checkpoint when there is one: a boundary checkpoint (after a session) is the state the next
    session starts from; a mid-session one also holds its session's boundary, so the session's start
    (head growth, ``begin_session``) is replayed exactly before the mid-session state is put back. The
    loop state's stretch is the position of the session to run (or running)."""

    name = "continual"

    def __init__(self, bench: Workbench, method: Method, seed: int, options: RunOptions,
                 checkpoint: Checkpointer | None = None) -> None:
        super().__init__(checkpoint)
        p, stream = bench.protocol, bench.stream
        self.bench, self.method, self.seed, self.options = bench, method, seed, options
        given = options.hook_time_limit is not None
        self.calls = MethodCalls(method, checkpoint, options.hook_time_limit if given else p.hook_time_limit,
                                 "--hook-time-limit" if given else "the protocol's hook_time_limit")
        seed_everything(seed)
        streams = random_streams(seed)  # the harness's batches and head growth; the method gets its own
        self.rng, self.generator = streams.harness, streams.harness_torch
        self.streams = (self.rng, self.generator, streams.method, streams.method_torch)
        self.model = deepcopy_with_modules(bench.deployed)
        self.memory = Memory(memory_spec(p, method), stream.train.labels,
                             lambda gid: method.sample_bytes(gid) or stream.train.sample_bytes(gid), self.rng)
        if p.memory.include_pretrain:
            self.memory.add(stream.pretrain_ids, pretrain=True)
        self.meter = FL.FlopMeter(self.model, bench.input_shape, bool(self.model.trunk_cached))
        self.meter.tally = self.loop.tally
        self.stores = (bench.train_inputs, bench.test_inputs)
        bench.train_inputs.reset_seen()
        bench.test_inputs.reset_seen()
        # views without test data, the method's own streams
        self.lent = bench.lend(self.memory, method, streams, self.model)
        self.ctx = self.lent.ctx
        self.b_new, self.b_old = p.training.batch.new, p.training.batch.old
        if not method.rehearsal:
            self.b_new, self.b_old = self.b_new + self.b_old, 0
        self.accel = autocast(bench.device, bench.precision)  # reusable: entered at every update and eval point
        self.referee = Referee()  # the fair-play rules, judged at the loop's fixed points (``referee.RULES``)
        self.reads = UpdateReads()  # the losses of the updates since the last read (``settle``)
        self.steps = StepCounter()  # optimizer steps counted by the budget guard (``count_optimizer_steps``)
        self.charged = FL.ChargedCounters()  # what the method charged as last read: it only grows
        self.open: OpenSession | None = None
        self.bar: Any = None  # the run's Bar once run() begins (read unchecked by eval_point, so not Optional)

    # ------------------------------------------------------------------ the state a checkpoint holds

    def state_dict(self, kind: str) -> dict[str, Any]:
        """Everything the rest of the run depends on (tensors are copied when serialised)."""
        self.progress.steps = self.steps.n
        return super().state_dict(kind)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put a ``state_dict`` back into this run's objects (built alike, the head grown to match)."""
        super().load_state_dict(state)
        self.meter.tally = self.loop.tally
        self.steps.n = self.progress.steps

    def own_state(self) -> dict[str, Any]:
        """The method, the memory, the method's declared counters and the open session (None between
        sessions: a boundary checkpoint)."""
        with self.calls("state_dict", "while a checkpoint was saved"):
            method = self.method.state_dict()
        s = self.open
        session = None
        if s is not None:
            assert s.arrivals is not None
            session = {"curve": s.curve, "flops0": (s.train0, s.eval0), "arrivals": (s.arrivals.order, s.arrivals.pos),
                       "tiles": s.tiles.state() if s.tiles is not None else None,
                       "last_update_macs": s.stop.last if s.stop else None}
        return {"method": method, "memory": self.memory.state_dict(), "counters": dict(self.ctx.counters),
                "session": session}

    def load_own(self, own: dict[str, Any]) -> None:
        """The method, the memory and the counters; the open session is ``begin_session``'s to put back."""
        with self.calls("load_state_dict", "while the run resumed from its checkpoint"):
            self.method.load_state_dict(own["method"])
        self.memory.load_state_dict(own["memory"])
        self.ctx.counters.clear()
        self.ctx.counters.update(own["counters"])
        self.charged = FL.ChargedCounters({name: float(self.ctx.counters.get(name, 0.0)) for name in FL.CHARGED})

    def save_at(self, update: int, pending: list | None) -> None:
        self.settle()  # the curve it holds has every loss so far
        super().save_at(update, pending)

    # ------------------------------------------------------------------ spending so far

    def train_macs(self) -> float:
        """Training MACs so far, the method's charged counters included (read here, so each read checks them)."""
        if (problem := self.charged.problem(self.ctx.counters)) is not None:
            where = f"by update {self.progress.observed} of the run"
            raise self.calls.fault("one of its hooks", where, problem)
        return FL.adjusted_train_macs(self.meter, self.ctx.counters)

    def session_tflops(self) -> float:
        """Training TFLOPs of the session in progress so far, as its budget counts them."""
        assert self.open is not None
        return FL.flops(self.train_macs() - self.open.train0) / 1e12

    def closing(self) -> Budget:
        """The budget as counted so far: at the end, or when the run diverges."""
        p, budget = self.bench.protocol, self.bench.protocol.training.budget
        self.train_macs()  # the charged counters, checked once more after the last hook
        return closing_budget(
            self.progress, self.meter, self.bench.train_inputs, self.bench.test_inputs, self.options,
            self.ctx.counters, updates_per_session=[c.total_updates for c in self.progress.curves],
            batch_new=self.b_new, batch_old=self.b_old, optimizer_steps=self.steps.n,
            memory_policy=p.memory.policy, memory_capacity=p.memory.capacity,
            memory_peak_samples=self.memory.peak_samples, memory_peak_bytes=self.memory.peak_bytes,
            batch_limit=self.b_new + self.b_old, max_trained_per_update=self.progress.most_trained,
            train_tflops_budget=budget.tflops if budget else None)

    # ------------------------------------------------------------------ the steps of a run

    def resume(self) -> tuple[int, dict[str, Any] | None]:
        """Load the stored checkpoint, if any: the position of the first session to run, and the
        mid-session state to put back once that session's start is replayed (None: start it afresh)."""
        if self.checkpoint is None:
            return 0, None
        stream = self.bench.stream
        boundary, mid = self.stored(), self.stored(mid=True)
        if mid is not None and mid["loop"]["stretch"] != (boundary["loop"]["stretch"] if boundary else 0):
            mid = None  # left from a session whose end is stored already
        resumed = mid or boundary
        if resumed is not None:
            where = (f"update {mid['loop']['update']} of session {stream.sessions[mid['loop']['stretch']].index}"
                     if mid else f"the end of session {resumed['loop']['stretch'] + 1}")
            say(self.options, f"Resuming {self.bench.protocol.name} {self.method.label} (seed {self.seed}) "
                              f"from its checkpoint at {where}.")
        if boundary is None:
            return 0, mid
        first = boundary["loop"]["stretch"]
        grown = stream.sessions[first - 1].seen_classes if first else self.model.head.num_classes
        self._size_head(grown)
        self.load_state_dict(boundary)
        return first, mid

    def begin_session(self, pos: int, mid: dict[str, Any] | None = None) -> OpenSession:
        """Open the session at ``pos``: the head grown, the method's ``begin_session``, the session's eval
        plan and arrivals; with ``mid``, the session's middle put back after its start is replayed."""
        p, session = self.bench.protocol, self.bench.stream.sessions[pos]
        s = self.open = OpenSession(pos, session, session_updates(p, session), self.train_macs(),
                                    self.meter.eval_macs())
        self.referee.at("session_start", self._facts(since="setup or end_session"))
        # the CL metrics' "before session j": the model as the previous session left it, before begin_session
        s.plan = eval_plan(self.bench.stream, session)  # the session's test classes: fixed for the session
        s.before = measure_before(self.model, lambda _: self._predicting(f"before session {session.index}"),
                                  self.method, self.bench.test_inputs, s.plan, p.eval.batch_size, self.meter,
                                  self.accel)
        self.lent.begin_session(session)
        self._size_head(session.seen_classes)
        if p.training.budget is not None:
            s.stop = FlopStop(p.training.budget.tflops, lambda: self.train_macs() - s.train0,
                              lambda: (self.b_new + self.b_old) * FL.update_macs_per_sample(self.meter),
                              f"{self.method.label} in session {session.index}")
            self.ctx.planned_updates = s.stop.affordable
        with self.calls("begin_session", f"at the start of session {session.index}"):
            self.method.begin_session(session)
        self.progress.params = max(self.progress.params,
                                   sum(p_.numel() for p_ in self.model.parameters() if p_.requires_grad))
        s.curve = _new_curve(s.plan.tasks)
        s.arrivals = Cycler(session.train_ids, self.rng, shuffle=not p.training.online)  # after begin_session
        s.shares = by_source_shares(p, pos, self.b_new, self.b_old)  # None: the old half pooled over the memory
        if s.shares is not None and p.training.source_draw == "tiled" and s.updates is not None:
            s.tiles = SourceTiles(self.memory.id_array(), int(self.bench.stream.train.offsets[1]), s.shares,
                                  s.updates, self.rng)
        if mid is not None:  # the session's start replayed: now its middle
            self.load_state_dict(mid)
            own = mid["own"]["session"]
            s.start, s.pending = self.loop.update, self.loop.pending  # no pending batches: drawn one by one
            s.curve, (s.train0, s.eval0) = own["curve"], own["flops0"]
            s.arrivals.order, s.arrivals.pos = own["arrivals"]
            if s.tiles is not None and own["tiles"] is not None:
                s.tiles.load(own["tiles"])
            if s.stop is not None:
                s.stop.last = own["last_update_macs"]
        s.schedule = EvalSchedule(p.eval, self.session_tflops)  # the session's TFLOPs at the previous boundary
        return s

    def _size_head(self, seen: int) -> None:
        """The head over the ``seen`` classes (grown), or over every class of the stream from the first
        session (``backbone.head_units: full``, the published models' head)."""
        p = self.bench.protocol
        self.model.head.size_for(seen, self.bench.stream.sessions[-1].seen_classes, p.backbone.head_units == "full",
                                 self.generator)

    @contextmanager
    def _predicting(self, where: str) -> Iterator[Callable[[Tensor], Tensor]]:
        """The method's ``predict`` on a throwaway copy (``Lending.predict``), each call under ``calls`` and
        its output held to what the accuracy reads: logits, one row per input and one column per output
        unit of the head (every class the harness evaluates over)."""
        outputs = self.model.head.num_classes
        scope: AbstractContextManager[Callable[[Tensor], Tensor]] = isolated_predict(
            self.method, self.lent.shared, self.lent.unused, self.referee)
        with scope as predict:
            def checked(x: Tensor) -> Tensor:
                with self.calls("predict", where):
                    logits = predict(x)
                if not isinstance(logits, Tensor) or tuple(logits.shape) != (len(x), outputs):
                    got = f"logits of shape {tuple(logits.shape)}" if isinstance(logits, Tensor) else _kind(logits)
                    raise self.calls.fault("predict", where, f"it returned {got}, where logits of shape "
                                           f"({len(x)}, {outputs}) are due: one row per input, one column per "
                                           f"output class of the head")
                return logits

            yield checked

    def draw(self) -> tuple[np.ndarray, np.ndarray]:
        """The next batch: new samples from the session's arrivals, old ones from the harness's memory
        (pooled over it, or in fixed shares by source: ``training.old_mix``)."""
        s, p = self.open, self.bench.protocol
        assert s is not None and s.arrivals is not None
        if s.shares is not None:  # fixed whole counts here (Shares also holds a pooled batch's expectations)
            new, pretrain, earlier = int(s.shares.new), int(s.shares.pretrain), int(s.shares.earlier)
            if s.tiles is not None:  # the published loaders' lists, read in order
                return s.arrivals.take(new), s.tiles.take(pretrain, earlier)
            return s.arrivals.take(new), self.memory.sample_by_source(
                pretrain, earlier, int(self.bench.stream.train.offsets[1]), p.training.class_balanced)
        new_ids = s.arrivals.take(self.b_new)
        old = self.memory.sample(self.b_old, p.training.class_balanced) if self.b_old else new_ids[:0]
        return new_ids, old

    def update(self, u: int, batch: tuple[np.ndarray, np.ndarray]) -> None:
        """One observe call on ``batch`` under the budget guards. Nothing here reads a device value: the loss
        is kept, to be read with the others by ``settle``."""
        s, bench = self.open, self.bench
        assert s is not None
        new_ids, old_ids = batch
        ids = np.concatenate([new_ids, old_ids])
        self.referee.at("before_update", self._facts(since="begin_session or predict"))
        before = self.train_macs()
        where = f"in update {u + 1} of session {s.session.index}"
        with timed(self.progress.seconds, "train", bench.device, self.reads.spans), self.accel:
            observed = observe_counted(self.method, bench.batch(ids, len(new_ids)), self.steps, self.meter,
                                       self.b_new + self.b_old, self.calls("observe", where))
        self.referee.at("after_update", self._facts(observed=observed))
        stats, trained = observed.stats, observed.trained
        if (problem := _step_problem(stats)) is not None:  # its loss is read later, far from here: refused now
            raise self.calls.fault("observe", where, problem)
        if s.stop is not None:
            s.stop.last = self.train_macs() - before
        self.reads.add(u, stats.loss)
        self.progress.most_trained = max(self.progress.most_trained, trained)
        self.progress.observed += 1
        self.progress.samples += len(ids)
        if bench.protocol.training.online:
            self._remember(new_ids)

    def _facts(self, **point: Any) -> Facts:
        """What the referee reads at a point of the run (``point``: that point's own facts)."""
        return Facts(self.method, self.memory, self.steps.n, self.progress.observed, shape=self.lent.shape,
                     lent=self.lent.shared, **point)

    def _remember(self, ids: np.ndarray) -> None:
        """Offer ``ids`` to the memory; a memory over its cap fails the run naming the method and the rule."""
        try:
            self.memory.add(ids)
        except Overfilled:
            self.referee.at("memory_added", self._facts())  # the error that names the method and the cap
            raise
        self.referee.at("memory_added", self._facts())

    def settle(self) -> None:
        """Read what the updates since the last read left on the device, with one host sync: their losses
        join the session's curve (the paper's Fig. 2a); a non-finite loss ends the run at the first update
        that had one, a non-finite weight at the last update read."""
        s = self.open
        assert s is not None
        if not self.reads.losses:
            return
        with timed(self.progress.seconds, "train"):  # waiting for the queued updates is training time
            read = self.reads.read()
            settle_spans(self.progress.seconds, "train", self.reads.spans)
            finite = _finite(self.model)
        for u, loss in read:
            s.curve["loss"].append(loss)
            if not math.isfinite(loss):
                self._diverged(f"at update {u + 1}", f"loss {loss}")
        if not finite:
            self._diverged(f"by update {read[-1][0] + 1}", "a non-finite weight")

    def _diverged(self, when: str, what: str) -> None:
        s = self.open
        assert s is not None
        partial = {**s.curve, "loss": []}  # the session's points so far (its losses are not all there)
        if partial["updates"]:  # none when its first eval point's logits were not finite
            self.progress.curves.append(SessionCurve(session=s.session.index, total_updates=s.updates or s.made,
                                                     before=s.before, **partial))
        raise Diverged(f"{self.method.name} diverged {when} of session {s.session.index}: {what}",
                       self.progress.curves, self.closing(), self.progress.params)

    def eval_point(self, u: int) -> None:
        """Before update ``u`` (and after the last): evaluate when the schedule says so or the session ends,
        on a throwaway copy of the method, and add the point to the session's curve."""
        s, bench, options = self.open, self.bench, self.options
        assert s is not None and s.schedule is not None and s.plan is not None
        s.made = u
        ends = u == s.updates if s.stop is None else s.stop(u)
        if not (s.schedule.due(u) or ends) or (u == s.start and s.start > 0):
            if self.reads.due(u):
                self.settle()
            return  # (a resumed point was evaluated before the checkpoint)
        self.settle()  # before the point: a diverged run's curve ends before its first non-finite update
        self.model.eval()
        predict = self._predicting(f"at the eval point at update {u} of session {s.session.index}")
        acc = eval_point(predict, bench.test_inputs, s.plan, bench.protocol.eval.batch_size,
                         self.meter, self.progress.seconds, bench.device, self.accel,
                         f"eval S{s.session.index} u{u}" if options.progress else None)
        if not acc.finite:  # as a non-finite loss: the curve ends before this point, and nothing ranks the run
            self._diverged(f"at its eval point at update {u}", "predict() gave non-finite logits (a NaN or +inf, "
                                                                "or a row without a finite logit)")
        for key, value in (("updates", u), ("old", acc.old), ("new", acc.new), ("all", acc.all)):
            s.curve[key].append(value)
        for k, a in enumerate(acc.tasks):
            s.curve["tasks"][k].append(a)
        if options.on_eval is not None:
            options.on_eval(s.session.index, u, acc)
        s.curve["train_flops"].append(FL.flops(self.train_macs()))
        self.bar.set_postfix(session=s.session.index, updates=self.progress.observed, old=f"{acc.old:.3f}",
                             new=f"{acc.new:.3f}")

    def end_session(self) -> None:
        """Close the session: the method's ``end_session``, the storage checks, the memory's update, the
        session's curve and FLOPs, and a boundary checkpoint."""
        s, bench = self.open, self.bench
        assert s is not None
        self.settle()
        with self.calls("end_session", f"at the end of session {s.session.index}"):
            self.method.end_session(s.session)
        self.referee.at("session_end", self._facts(since="predict or end_session"))
        if not bench.protocol.training.online:
            self._remember(s.session.train_ids)
        self.progress.train_per_session.append(FL.flops(self.train_macs() - s.train0))
        self.progress.eval_per_session.append(FL.flops(self.meter.eval_macs() - s.eval0))
        self.progress.curves.append(SessionCurve(session=s.session.index, total_updates=s.made, before=s.before,
                                                 **s.curve))
        self.open = None  # the boundary checkpoint holds no open session
        self.loop.stretch, self.loop.update, self.loop.pending = s.pos + 1, 0, None
        self.save("boundary")

    def _stretch(self, s: OpenSession) -> Stretch:
        """The session's updates as the shared training loop runs them. Under a FLOP budget the count is
        known only at the end: batches are drawn when due, not ahead."""
        online, checkpoint = self.bench.protocol.training.online, self.checkpoint
        return Stretch(f"session {s.session.index}", "continual", s.updates or MAX_UPDATES, self.draw, self.update,
                       start=s.start, pending=s.pending, draw_ahead=not online and s.stop is None,
                       ids_of=np.concatenate, before=self.eval_point,
                       save=None if checkpoint is None else self.save_at,
                       bar=self.bar, stop=s.stop)

    def _run_bar(self, total: int | None) -> Bar:
        """The run's progress bar: in updates, or under a FLOP budget in TFLOPs (the update count is known
        only at the end; the budget gives the bar a total and an ETA all the same)."""
        p = self.bench.protocol
        label = f"{p.name} {self.method.label}"
        if p.training.budget is None:
            return progress_bar(self.options.progress, total=total, initial=self.progress.observed, desc=label,
                                unit="upd")
        spent = lambda: FL.flops(self.train_macs()) / 1e12  # noqa: E731 - read at every refresh
        tflops = p.training.budget.tflops * len(self.bench.stream.sessions)
        return MeasuredBar(progress_bar(self.options.progress, total=round(tflops, 6), initial=spent(), desc=label,
                                        unit="TFLOP"), spent)

    def run(self) -> tuple[list[SessionCurve], Budget, int]:
        """Every session from where the checkpoint left off: the curves, the budget used and the most
        trainable parameters the method had."""
        p, stream = self.bench.protocol, self.bench.stream
        # an update count per session: none is None without a FLOP budget
        total = None if p.training.budget else sum(session_updates(p, s) or 0 for s in stream.sessions)
        with count_optimizer_steps(self.steps), self.meter.attached():
            with self.calls("setup", "before the first session"):
                self.method.setup(self.model, self.ctx)
            first, mid = self.resume()
            self.bar = self._run_bar(total)
            for pos in range(first, len(stream.sessions)):
                s = self.begin_session(pos, mid if mid is not None and mid["loop"]["stretch"] == pos else None)
                mid = None
                train_stretch(self._stretch(s), self.checkpoint, self.bench.train_inputs, self.options)
                self.end_session()
            budget = self.closing()
        self.bar.close()
        return self.progress.curves, budget, self.progress.params


def run_cl(bench: Workbench, method: Method, seed: int, options: RunOptions,
           checkpoint: Checkpointer | None = None) -> tuple[list[SessionCurve], Budget, int]:
    """Sessions 2..N of ``method`` (``ContinualRun``): the curves, the budget used, the most trainable
    parameters."""
    return ContinualRun(bench, method, seed, options, checkpoint).run()
