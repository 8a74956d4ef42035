"""Continual evaluation: accuracy on old / new / all seen classes (and per task) at an eval point."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..data.inputs import InputStore
from ..data.stream import Session, Stream
from ..model.cpu import cpu_forward_chunk, in_cpu_chunks, widest_row_bytes
from ..model.flops import FlopMeter
from ..progress_bar import progress_bar
from .report import timed


@dataclass(frozen=True)
class EvalPlan:
    """The test samples of session j and the groups each belongs to (fixed for the session)."""

    ids: np.ndarray
    labels: Tensor
    old: np.ndarray     # bool per sample: class in S_1..S_{j-1}
    new: np.ndarray     # bool per sample: class in S_j
    task: np.ndarray    # task index per sample (0 = pre-training classes)
    tasks: int          # number of tasks so far (j)


def eval_plan(stream: Stream, session: Session) -> EvalPlan:
    seen = np.arange(session.seen_classes)
    ids = stream.test_ids(seen)
    labels = stream.test.labels[ids]
    return EvalPlan(
        ids=ids,
        labels=torch.from_numpy(labels),
        old=np.isin(labels, stream.classes_before(session.index)),
        new=np.isin(labels, session.classes),
        task=stream.task_of_class[labels],
        tasks=session.index,
    )


@dataclass(frozen=True)
class Accuracies:
    old: float
    new: float
    all: float
    tasks: list[float]
    # False when a logit row held a NaN or +inf, or no finite logit: its argmax (class 0 for NaN) is no
    # prediction, so the accuracies are not the model's; a continual run stops there as diverged
    finite: bool = True
    # the per-sample outcome behind the numbers (test ids, predicted and true class), for an ``on_eval``
    # callback that keeps them (``bench run --save-predictions``); never stored in the result
    ids: np.ndarray | None = field(default=None, compare=False, repr=False)
    predicted: np.ndarray | None = field(default=None, compare=False, repr=False)
    labels: np.ndarray | None = field(default=None, compare=False, repr=False)


def _mean(mask: np.ndarray, correct: np.ndarray) -> float:
    return float(correct[mask].mean()) if mask.any() else float("nan")


def evaluate(predict: Callable[[Tensor], Tensor], inputs: InputStore, plan: EvalPlan, batch_size: int,
             desc: str | None = None, meter: FlopMeter | None = None, chunk: int | None = None) -> Accuracies:
    """Top-1 over the output units of every class seen so far (no task id). With ``desc``, a progress
    bar for evaluations that last (57,300 images at paper scale take minutes on a CPU). With ``meter``
    (attached, evaluating), its hooks count the first forward of each row shape and the rest replay
    that count (``FlopMeter.once_per_shape``), and the two-row probe that sizes the chunk is not counted;
    without it, whatever hooks are attached count every forward, the probe's included (pass ``chunk``).
    On the CPU, rows go through ``chunk`` at a time, by default sized from the model's widest activation
    (``cpu_forward_chunk``). ``finite`` is read once, after the last batch."""
    correct = np.empty(len(plan.ids), dtype=bool)
    predicted = np.empty(len(plan.ids), dtype=np.int32)
    starts = range(0, len(plan.ids), batch_size)
    forward = predict if meter is None else meter.once_per_shape(predict)
    finite: list[Tensor] = []  # per batch, on the device: every row's largest logit finite
    inputs.read_ahead([plan.ids[start : start + batch_size] for start in starts])
    with torch.no_grad():
        for start in progress_bar(desc is not None, lines=False, iterable=starts, desc=desc, unit="batch", leave=False,
                                  delay=2.0):
            part = plan.ids[start : start + batch_size]
            x = inputs.get(part)
            if chunk is None and x.device.type == "cpu":  # one probe per evaluation, counted by no meter
                with meter.paused() if meter is not None else nullcontext():
                    chunk = cpu_forward_chunk(widest_row_bytes(predict, x))
            logits = in_cpu_chunks(forward, x, chunk)
            pred = logits.argmax(dim=1).cpu()
            finite.append(torch.isfinite(logits.amax(dim=1)).all())  # amax is NaN where a NaN is
            correct[start : start + len(part)] = (pred == plan.labels[start : start + len(part)]).numpy()
            predicted[start : start + len(part)] = pred.numpy()
    inputs.end_read_ahead()
    tasks = [_mean(plan.task == k, correct) for k in range(plan.tasks)]
    return Accuracies(_mean(plan.old, correct), _mean(plan.new, correct), float(correct.mean()), tasks,
                      finite=bool(torch.stack(finite).all()) if finite else True, ids=plan.ids,
                      predicted=predicted, labels=plan.labels.numpy())


def eval_point(predict_scope: AbstractContextManager[Callable[[Tensor], Tensor]], inputs: InputStore, plan: EvalPlan,
               batch_size: int, meter: FlopMeter, seconds: dict[str, float], device: torch.device,
               precision: AbstractContextManager[Any], desc: str | None = None) -> Accuracies:
    """One eval point of any stage (a continual session, a joint model): ``evaluate`` through the predict
    function ``predict_scope`` lends (a throwaway copy, so nothing seen at the point survives), under the
    run's ``precision`` context, its wall time added to ``seconds["eval"]``, its forwards counted as
    evaluation FLOPs on ``meter`` (attached by the caller)."""
    with timed(seconds, "eval", device), meter.evaluating(), precision, predict_scope as predict:
        return evaluate(predict, inputs, plan, batch_size, desc, meter)
