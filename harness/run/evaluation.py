"""Continual evaluation: accuracy on old / new / all seen classes (and per task) at an eval point."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..data.inputs import InputStore, in_cpu_chunks
from ..data.stream import Session, Stream


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


def _mean(mask: np.ndarray, correct: np.ndarray) -> float:
    return float(correct[mask].mean()) if mask.any() else float("nan")


def evaluate(predict: Callable[[Tensor], Tensor], inputs: InputStore, plan: EvalPlan, batch_size: int,
             desc: str | None = None) -> Accuracies:
    """Top-1 over the output units of every class seen so far (no task id). With ``desc``, a progress
    bar for evaluations that last (57,300 images at paper scale take minutes on a CPU)."""
    correct = np.empty(len(plan.ids), dtype=bool)
    starts = range(0, len(plan.ids), batch_size)
    with torch.no_grad():
        for start in tqdm(starts, desc=desc, unit="batch", leave=False, delay=2.0, disable=desc is None):
            part = plan.ids[start : start + batch_size]
            pred = in_cpu_chunks(predict, inputs.get(part)).argmax(dim=1).cpu()
            correct[start : start + len(part)] = (pred == plan.labels[start : start + len(part)]).numpy()
    tasks = [_mean(plan.task == k, correct) for k in range(plan.tasks)]
    return Accuracies(_mean(plan.old, correct), _mean(plan.new, correct), float(correct.mean()), tasks)
