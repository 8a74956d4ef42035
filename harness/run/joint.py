"""Stage 3 of a run: the joint reference, A_joint, which the harness owns.

Per session j, the deployed model retrained on S1..Sj (or once on everything, ``joint.mode: final``)
with the protocol's joint budget and optimizer settings, and nothing else: a user cannot perturb it
(``-m joint`` with modifiers or ``--set`` is refused), so a stored joint run is keyed by the protocol
hash, the seed and these settings. ``harness.results.comparability.select_runs`` finds it; the pipeline trains it
when there is none.

The per-session models are independent (model j draws from its own seeds and trains on S1..Sj), so
the reference is made of *parts*, one per trained model, each with its own checkpoint: trained one
after the other here, or as separate tasks of a cluster (the Ray executor), then combined into the
same reference either way. A part starts from zeroed counters, and combining adds them up in part
order, so where a part was trained does not change a single number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...methods.configs import joint_config
from ..model import flops as FL
from ..model.backbone import SplitModel
from ..model.device import autocast, seed_everything
from ..model.module_copy import deepcopy_with_modules
from ..results.curves import ReferenceSession
from ..results.schema import Budget
from ..spec.protocol import Protocol
from .checkpoint import Checkpointer
from .evaluation import eval_plan, eval_point
from .isolation import isolated_model_predict
from .loop import Progress, closing_budget, seen_state, setseen_state
from .options import RunOptions
from .pretrain import OfflineTraining
from .report import say, timed
from .stage import LoopState
from .workbench import Workbench


@dataclass
class JointPart:
    """What one trained joint model adds to the reference: its stage's loop state once trained and
    evaluated (``progress``: its accuracies at the sessions it is the reference of, per-session FLOPs,
    samples, parameters and stage times; its FLOP ``tally``) and the ids its input stores fetched. Stored
    (in its checkpoint) once the part is done."""

    progress: Progress = field(default_factory=Progress)
    tally: FL.Tally = field(default_factory=FL.Tally.zero)
    seen: list[tuple[np.ndarray, int]] = field(default_factory=list)  # train store, test store

    @classmethod
    def from_loop(cls, loop: dict[str, Any]) -> JointPart:
        """The part a finished joint model's checkpoint holds (its loop state)."""
        state = LoopState.from_state(loop)
        return cls(state.progress, state.tally, loop["seen"])


def joint_parts(protocol: Protocol) -> int:
    """How many independent models the joint reference trains: one per session, or one (``final``)."""
    return protocol.sessions if protocol.joint.mode == "per_session" else 1


def _joint_model(bench: Workbench, upto: int, generator: torch.Generator) -> SplitModel:
    """The deployed model with a head over every class of sessions 1..``upto``."""
    model = deepcopy_with_modules(bench.deployed)
    model.head.grow(bench.stream.sessions[upto - 2].seen_classes - model.head.num_classes, generator)
    return model


def _meter_for(bench: Workbench, model: SplitModel, tally: FL.Tally) -> FL.FlopMeter:
    meter = FL.FlopMeter(model, bench.input_shape, bool(bench.deployed.trunk_cached))
    meter.tally = tally
    return meter


class JointModel(OfflineTraining):
    """Joint model ``part`` (0-based: the model of session ``part + 1``; in ``final`` mode the one model) as
    a stage: trained offline on S1..S_upto from its own seeds, then evaluated where it is the reference.
    Its FLOP tally and the ids its input stores fetch are its loop state's, so a part starts from zeroed
    counters wherever it is trained."""

    name = "joint"

    def __init__(self, bench: Workbench, seed: int, options: RunOptions, part: int,
                 checkpoint: Checkpointer | None = None) -> None:
        p, stream = bench.protocol, bench.stream
        self.sessions = [stream.sessions[part]] if p.joint.mode == "per_session" else list(stream.sessions)
        self.seed, self.part = seed, part
        for store in (bench.train_inputs, bench.test_inputs):
            store.reset_seen()
        first = self.sessions[0]
        generator = seed_everything(seed + first.index)
        rng = np.random.default_rng(seed + first.index)
        upto = first.index if p.joint.mode == "per_session" else stream.sessions[-1].index
        model = _joint_model(bench, upto, generator)
        self.meter = _meter_for(bench, model, FL.Tally.zero())  # counting into the loop's tally once resumed
        super().__init__(bench, model, joint_config(p), stream.session_ids(upto), p.joint.updates,
                         p.joint.batch_size, rng, generator, f"joint S1..S{upto}", options, checkpoint)
        self.stores = (bench.train_inputs, bench.test_inputs)

    def run(self) -> JointPart:
        """Train (from its checkpoint, when one is stored) and evaluate the model: the part it adds."""
        if self.resume():
            say(self.options, f"Resuming the joint reference (seed {self.seed}) from its checkpoint: model "
                              f"{self.part + 1}, update {self.loop.update}")
        bench, progress, meter = self.bench, self.progress, self.meter
        meter.tally = self.loop.tally
        with meter.attached(), timed(progress.seconds, "train", bench.device):
            self.train()
        progress.samples += self.updates * self.batch_size
        progress.params = max(progress.params, self.model.trainable_parameters())
        progress.train_per_session.append(FL.flops(meter.train_macs()))
        for session in self.sessions:
            if session is not self.sessions[0]:  # final mode: each later session's evaluation starts from its own seed
                seed_everything(self.seed + session.index)
            _evaluate_joint(bench, self.model, session, self.loop.tally, progress, self.options)
        return JointPart(progress, self.loop.tally, [seen_state(s) for s in self.stores])


def _evaluate_joint(bench: Workbench, model: SplitModel, session: Any, tally: FL.Tally, progress: Progress,
                    options: RunOptions) -> None:
    """The joint model's accuracies at ``session``, on its seen classes, added to ``progress``."""
    model.eval()
    plan = eval_plan(bench.stream, session)
    n = session.seen_classes
    meter = _meter_for(bench, model, tally)
    eval0 = meter.eval_macs()
    with meter.attached():
        result = eval_point(isolated_model_predict(model, n), bench.test_inputs, plan, bench.protocol.eval.batch_size,
                            meter, progress.seconds, bench.device, autocast(bench.device, bench.precision),
                            f"eval joint S1..S{session.index}" if options.progress else None)
    if options.on_eval is not None:  # the point closes the joint model's training: its step is that count
        options.on_eval(session.index, bench.protocol.joint.updates, result)
    progress.eval_per_session.append(FL.flops(meter.eval_macs() - eval0))
    progress.refs.append(ReferenceSession(session=session.index, old=result.old, new=result.new, all=result.all,
                                          tasks=result.tasks).model_dump())


def stored_part(checkpoint: Checkpointer | None) -> JointPart | None:
    """The finished part a checkpoint holds (None: not trained yet, or only partly)."""
    state = checkpoint.load() if checkpoint is not None else None
    if state is None or state.get("stage") != JointModel.name or state.get("kind") != "finished":
        return None
    return JointPart.from_loop(state["loop"])


def ensure_joint_part(bench: Workbench, seed: int, options: RunOptions, part: int,
                      checkpoint: Checkpointer | None) -> JointPart:
    """The finished part from its checkpoint (said, as the reference's first message counts every model), or
    trained now and stored there as finished."""
    done = stored_part(checkpoint)
    if done is not None:
        say(options, f"Joint reference (seed {seed}): model {part + 1} was finished by an earlier, stopped run; "
                     f"reused from its checkpoint")
    if done is None:
        training = JointModel(bench, seed, options, part, checkpoint)
        done = training.run()
        training.save_finished()
    return done


def _add_tally(total: FL.Tally, part: FL.Tally) -> None:
    for phase, parts in part.fwd_samples.items():
        for name, n in parts.items():
            total.fwd_samples[phase][name] += n
    for phase, parts in part.bwd_samples.items():
        for name, n in parts.items():
            total.bwd_samples[phase][name] += n
    for phase, macs in part.macs.items():
        total.macs[phase] += macs


def train_joint(bench: Workbench, seed: int, options: RunOptions,
                checkpoints: Callable[[int], Checkpointer] | None = None) -> tuple[list[ReferenceSession], Budget, int]:
    """The joint reference from its parts: each found finished in its checkpoint (``checkpoints(part)``:
    trained elsewhere, or before this process was stopped) or trained now, then combined.

    Every part's FLOPs are counted on its own tally, added into one and closed into the budget by the
    same code as a continual run's."""
    p, stream = bench.protocol, bench.stream
    parts = [ensure_joint_part(bench, seed, options, i, checkpoints(i) if checkpoints is not None else None)
             for i in range(joint_parts(p))]
    progress, tally = Progress(), FL.Tally.zero()
    seen = [np.zeros_like(s) for s, _ in parts[0].seen]
    fetched = [0, 0]
    for part in parts:
        _add_tally(tally, part.tally)
        progress.add(part.progress)
        for k, (ids, n) in enumerate(part.seen):
            seen[k] |= ids
            fetched[k] += n
    for store, ids, n in zip((bench.train_inputs, bench.test_inputs), seen, fetched, strict=True):
        setseen_state(store, (ids, n))
    # the final model's structure gives the per-sample costs
    meter = _meter_for(bench, _joint_model(bench, stream.sessions[-1].index, torch.Generator()), tally)
    budget = closing_budget(
        progress, meter, bench.train_inputs, bench.test_inputs, options,
        updates_per_session=[p.joint.updates] * len(parts), batch_new=p.joint.batch_size, batch_old=0,
        optimizer_steps=p.joint.updates * len(parts), memory_policy="all data", memory_capacity=None,
        memory_peak_samples=len(stream.session_ids(stream.sessions[-1].index)), memory_peak_bytes=0,
        batch_limit=p.joint.batch_size, max_trained_per_update=p.joint.batch_size)
    return [ReferenceSession(**r) for r in progress.refs], budget, progress.params
