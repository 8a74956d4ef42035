"""The one training loop of a run, and the one place a run's spending is added up.

Pre-training the deployed model, each joint model and each continual session are the same thing: a
stretch of consecutive updates on one model, with batches the harness draws, a checkpoint when one is
due, fault injection for the resume tests, and progress reported as it goes. ``train_stretch`` runs
that; a stage supplies only what differs (its batches, its update step, its eval points, what it
checkpoints beside the loop's own state). ``Progress`` is what a stage accumulates across stretches
and ``closing_budget`` turns it, with the FLOP meter and the input stores, into the result's
``Budget``, so the joint reference and a continual run count FLOPs by the same code.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..data.inputs import InputStore
from ..model import flops as FL
from ..progress_bar import Bar, progress_bar
from ..results.curves import SessionCurve
from ..results.schema import Budget
from .checkpoint import Checkpointer, maybe_die
from .options import RunOptions
from .report import report_progress


@dataclass
class Stretch:
    """One stretch of consecutive updates: what a stage supplies to ``train_stretch``."""

    label: str  # progress label: "pretrain S1", "joint S1..S3", "session 2"
    phase: str  # BENCH_KILL_AT's phase: pretrain | joint | continual
    updates: int
    draw: Callable[[], Any]  # the next batch (as the stage's ``step`` takes it)
    step: Callable[[int, Any], None]  # one update on a batch
    start: int = 0  # the update to start from (a resumed stretch)
    pending: list | None = None  # batches drawn before a checkpoint and not trained yet
    # Offline, the data to draw from is fixed during the stretch: every batch is drawn at the start (the
    # same draws in the same order as one by one) so the input store can decode them ahead. Online, each
    # update changes what the next batch may hold, so each is drawn when it is due.
    draw_ahead: bool = True
    ids_of: Callable[[Any], np.ndarray] = lambda batch: batch  # a batch's sample ids (for decoding ahead)
    before: Callable[[int], None] | None = None  # called at every update u before it runs, and at the end
    save: Callable[[int, list | None], None] | None = None  # a mid-stretch checkpoint (update, pending)
    bar: Bar | None = None  # a progress bar spanning several stretches; None: one of its own
    # an end decided during the stretch (a FLOP budget): called with the updates made before each update;
    # True ends the stretch there (``updates`` is then only a bound, and batches must not be drawn ahead)
    stop: Callable[[int], bool] | None = None


def train_stretch(stretch: Stretch, checkpointer: Checkpointer | None, inputs: InputStore,
                  options: RunOptions) -> None:
    """Run a stretch: at each update, the stage's ``before`` (eval points), a checkpoint when due, then
    one step on the next batch; ``before`` also runs once after the last update."""
    s = stretch
    planned = None
    if s.draw_ahead and s.stop is not None:
        raise ValueError("a stretch that decides its end as it goes cannot draw its batches ahead")
    if s.draw_ahead:
        planned = deque(s.pending if s.pending is not None else (s.draw() for _ in range(s.start, s.updates)))
        if planned:
            inputs.plan([s.ids_of(b) for b in planned])
    bar = s.bar if s.bar is not None else progress_bar(options.progress, desc=s.label, unit="upd", leave=False,
                                                       initial=s.start, total=s.updates)
    for u in range(s.start, s.updates + 1):
        if s.before is not None:
            s.before(u)
        if u == s.updates or (s.stop is not None and s.stop(u)):
            break
        if checkpointer is not None and s.save is not None and checkpointer.due(u):
            s.save(u, None if planned is None else list(planned))
        maybe_die(s.phase)
        s.step(u, planned.popleft() if planned is not None else s.draw())
        bar.update(1)
        report_progress(options, s.label, u + 1, s.updates)
    if s.bar is None:
        bar.close()
    inputs.end_plan()


@dataclass
class Progress:
    """What a stage has accumulated across its stretches, beside its model (all of it checkpointed)."""

    curves: list[SessionCurve] = field(default_factory=list)  # continual sessions
    refs: list[dict] = field(default_factory=list)  # joint reference: accuracies per session
    samples: int = 0
    params: int = 0
    most_trained: int = 0
    observed: int = 0  # updates made (observe calls)
    steps: int = 0  # optimizer steps counted (the budget guard's counter)
    train_per_session: list[float] = field(default_factory=list)  # FLOPs of each session (or joint model)
    eval_per_session: list[float] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time by stage ("train", "eval")

    def state(self) -> dict[str, Any]:
        return {**self.__dict__, "curves": [c.model_dump() for c in self.curves]}

    def add(self, other: Progress) -> None:
        """Add what another stage accumulated (the joint reference's parts, in part order): lists joined,
        counts summed, the most parameters and most trained per update kept, stage times summed."""
        self.curves += other.curves
        self.refs += other.refs
        self.train_per_session += other.train_per_session
        self.eval_per_session += other.eval_per_session
        self.samples += other.samples
        self.observed += other.observed
        self.steps += other.steps
        self.params = max(self.params, other.params)
        self.most_trained = max(self.most_trained, other.most_trained)
        for stage, seconds in other.seconds.items():
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Progress:
        fields = dict(state)
        fields["curves"] = [SessionCurve.model_validate(c) for c in fields["curves"]]
        return cls(**fields)


def macs_per_sample(meter: FL.FlopMeter) -> dict[str, float]:
    return {part: meter.cost(part).forward for part in FL.PARTS}


def seen_state(store: InputStore) -> tuple[np.ndarray, int]:
    """What an input store counted for executed-FLOP accounting: ids fetched, and fetches when streaming."""
    return store.seen.copy(), getattr(store, "fetched", 0)


def setseen_state(store: InputStore, state: tuple[np.ndarray, int]) -> None:
    store.seen[:] = state[0]
    if hasattr(store, "fetched"):
        store.fetched = state[1]


def closing_budget(progress: Progress, meter: FL.FlopMeter, train_inputs: InputStore, test_inputs: InputStore,
                   options: RunOptions, counters: dict[str, float] | None = None, **figures: Any) -> Budget:
    """The budget as counted so far (a diverged run reports what it spent), with the stage times handed
    to the caller. FLOPs come from ``meter``'s tally (shared by every model the stage trained) and the
    method's declared ``counters``; ``figures`` are the stage's own (updates, batch, memory)."""
    if options.stage_seconds is not None:
        options.stage_seconds.update(progress.seconds)
    counters = counters or {}
    train_total, eval_total = FL.adjusted_train_macs(meter, counters), meter.eval_macs()
    return Budget(
        **figures, samples_trained=progress.samples,
        train_flops=FL.flops(train_total), eval_flops=FL.flops(eval_total),
        train_flops_per_session=progress.train_per_session, eval_flops_per_session=progress.eval_per_session,
        train_flops_executed=FL.flops(FL.executed_macs(meter, "train", train_total, train_inputs.distinct_seen(),
                                                       counters.get(FL.TRUNK_FEATURE_SAMPLES, 0.0))),
        eval_flops_executed=FL.flops(FL.executed_macs(meter, "eval", eval_total, test_inputs.distinct_seen())),
        macs_per_sample=macs_per_sample(meter), forward_samples=FL.forward_samples_summary(meter),
        declared={k: float(v) for k, v in counters.items()}, trunk_cached=meter.trunk_cached,
        flops_convention=FL.CONVENTION,
    )
