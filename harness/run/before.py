"""The "before session j" point of the standard CL metrics: the model a session starts from.

ACC's matrix R reads task k's accuracy before it is learned (FWT) and the deployed model's accuracy
(forgetting, BWT) from this point, never from the session's update-0 point: a method's ``begin_session``
(SGM's data-driven head init, for one) changes the model before update 0, and reading that as "before"
would credit the method's own initialisation as transfer.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from torch import nn

from ..model.flops import FlopMeter
from ..results.curves import BeforePoint
from .evaluation import EvalPlan, evaluate


def measure_before(model: nn.Module, predict_of: Any, method: Any, inputs: Any, plan: EvalPlan, batch_size: int,
                   meter: FlopMeter, accel: AbstractContextManager) -> BeforePoint:
    """Accuracies on the session's test classes of the model as it stands, before head growth and
    ``begin_session``. A measurement the harness makes for its metrics: not counted in the method's
    evaluation FLOPs, and the model's train/eval mode is left as it was."""
    was_training = model.training
    model.eval()
    with meter.paused(), accel, predict_of(method) as predict:
        acc = evaluate(predict, inputs, plan, batch_size)
    model.train(was_training)
    return BeforePoint(old=acc.old, new=acc.new, all=acc.all, tasks=acc.tasks)
