"""The one x axis of a run's MLflow step metrics: updates counted from the start of the first learning
session, for method runs and joint runs alike, so their curves share a chart in the MLflow UI.

A session's last eval point and the next session's update-0 point fall on the same step (no update lies
between them) but measure different class sets. MLflow keeps both and draws a zigzag, so the update-0
point of every session after the first is logged under its own keys (``session_start_acc_old`` ...):
each key then has one value per step. The ``session`` key says which session a step belongs to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..errors import BenchError
from .schema import RunResult

if TYPE_CHECKING:
    from ..spec.protocol import Protocol

STEP_AXIS_TAG = "bench.step_axis"  # "updates", or "session" for a joint run without a fixed update count
SESSION_START = "session_start_"  # key prefix of a later session's update-0 point
SESSION_KEY = "session"


def point_metrics(step: int, session: int, update: int, first: bool, values: Mapping[str, float],
                  session_key: bool = True) -> list:
    """One eval point's step metrics (``values``: key -> value) at ``step``; ``first``: the point is in the
    run's first learning session, whose update-0 point has a step of its own."""
    from mlflow.entities import Metric

    start = update == 0 and not first
    prefix = SESSION_START if start else ""
    metrics = [Metric(prefix + key, float(v), 0, step) for key, v in values.items()]
    if session_key and not start:
        metrics.append(Metric(SESSION_KEY, float(session), 0, step))
    return metrics


def reference_steps(result: RunResult, protocol: Protocol | None = None) -> dict[int, int] | None:
    """A joint run's steps on the method runs' axis: the accuracy of the model trained on S1..Sj at the
    end of learning session j, (j − 1) · U updates in (session 1 is the deployed model's, at 0). Needs the
    run's spec (``protocol``, else the built-in one of its name when the hashes agree) and a fixed update
    count U per session; None otherwise (a FLOP budget or an online stream: each method's axis differs)."""
    if not result.reference:
        return None
    if protocol is not None and getattr(protocol, "reference", None) is not None \
            and protocol.spec_hash != result.protocol.hash:
        protocol = protocol.reference  # a NAME@Kx run's joint reference is NAME's
    if protocol is None or protocol.spec_hash != result.protocol.hash:
        from ..spec.protocol import load_protocol

        try:
            protocol = load_protocol(result.protocol.name)
        except BenchError:
            return None
        if protocol.spec_hash != result.protocol.hash:
            return None
    training = protocol.training
    updates = None if training.online else training.session_updates(0)
    if not updates:
        return None
    return {r.session: (r.session - 1) * updates for r in result.reference}
