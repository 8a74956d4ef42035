"""The standard continual-learning metrics every CL paper reports beside the gaps, from the stored curves.

They all read the accuracy matrix R of the run: R[i][k] is the accuracy on the classes of task k after
learning task i (tasks are sessions; task 1 is pre-training). The curves give it directly:

- R[1][1] (after pre-training) is session 2's "before" point: the deployed model, measured before the
  method's ``begin_session`` and before the head grows;
- R[i][k] for i >= 2 is the last eval point of session i;
- R[i-1][i] (task i before it is learned, for FWT) is session i's "before" point, on task i.

The update-0 point of a session is measured after ``begin_session`` (a data-driven head init, for one,
has already changed the model there): S_Δ and the plots read it, these metrics never do. A result stored
before the "before" point was recorded has no R[1][1] nor R[i-1][i]: forgetting, BWT and FWT are None for
it (shown as "–"), ACC and Ā, which read end-of-session points only, are computed as ever.

Sources: Lopez-Paz & Ranzato, "Gradient Episodic Memory for Continual Learning", NeurIPS 2017 (ACC,
BWT, FWT, eq. 2-4) and Chaudhry et al., "Riemannian Walk for Incremental Learning", ECCV 2018 (average
accuracy and forgetting, eq. 4-6). Every value is in the curves' unit (fractions or %), like μ and α.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .curves import SessionCurve

if TYPE_CHECKING:
    from ..spec.protocol import Protocol


def _sessions(curves: Sequence[SessionCurve]) -> list[SessionCurve]:
    """Curves sorted by session, exactly sessions 2..N (a gap would shift every index of R)."""
    if not curves:
        raise ValueError("no session curves: CL metrics need at least one learning session")
    ordered = sorted(curves, key=lambda c: c.session)
    if [c.session for c in ordered] != list(range(2, len(ordered) + 2)):
        raise ValueError(f"session curves must be sessions 2..N once each; got {[c.session for c in ordered]}")
    return ordered


def accuracy_matrix(curves: Sequence[SessionCurve]) -> dict[tuple[int, int], float]:
    """R as ``{(i, k): accuracy}`` for every task i = 2..N and every task k <= i, plus (1, 1) and (i-1, i)
    where the curves hold their "before" points.

    Tasks are numbered from 1 (pre-training) to N (the last session).
    """
    ordered = _sessions(curves)
    r: dict[tuple[int, int], float] = {}
    if ordered[0].before is not None:
        r[(1, 1)] = ordered[0].before.tasks[0]
    for c in ordered:
        i = c.session
        if c.before is not None:
            r[(i - 1, i)] = c.before.tasks[i - 1]  # task i on the model the session starts from
        for k in range(1, i + 1):
            r[(i, k)] = c.tasks[k - 1][-1]
    return r


def _has_before(r: dict[tuple[int, int], float], n: int) -> bool:
    """Every "before" entry of R is there (results stored before it was recorded have none)."""
    return (1, 1) in r and all((k - 1, k) in r for k in range(2, n + 1))


def _n_tasks(curves: Sequence[SessionCurve]) -> int:
    return _sessions(curves)[-1].session


def final_task_accuracy(curves: Sequence[SessionCurve]) -> float:
    """ACC = 1/N Σ_{k=1..N} R[N][k]: final accuracy averaged over tasks (each task weighs the same,
    whatever its class count; α weighs each test image the same)."""
    r, n = accuracy_matrix(curves), _n_tasks(curves)
    return sum(r[(n, k)] for k in range(1, n + 1)) / n


def average_task_accuracy(curves: Sequence[SessionCurve]) -> float:
    """Ā = 1/(N−1) Σ_{i=2..N} A_i with A_i = 1/i Σ_{k=1..i} R[i][k]: Chaudhry's average accuracy after
    each learning session, averaged over the sessions (the task-averaged counterpart of μ)."""
    r, n = accuracy_matrix(curves), _n_tasks(curves)
    return sum(sum(r[(i, k)] for k in range(1, i + 1)) / i for i in range(2, n + 1)) / (n - 1)


def average_forgetting(curves: Sequence[SessionCurve]) -> float | None:
    """F = 1/(N−1) Σ_{k=1..N−1} (max_{l=k..N−1} R[l][k] − R[N][k]): how far each earlier task fell from
    its best end-of-session accuracy (Chaudhry et al. 2018, eq. 5-6)."""
    r, n = accuracy_matrix(curves), _n_tasks(curves)
    if not _has_before(r, n):
        return None
    return sum(max(r[(j, k)] for j in range(k, n)) - r[(n, k)] for k in range(1, n)) / (n - 1)  # j: the docstring's l


def backward_transfer(curves: Sequence[SessionCurve]) -> float | None:
    """BWT = 1/(N−1) Σ_{k=1..N−1} (R[N][k] − R[k][k]): the change on each earlier task from right after
    it was learned to the end (negative: forgetting; Lopez-Paz & Ranzato 2017, eq. 3)."""
    r, n = accuracy_matrix(curves), _n_tasks(curves)
    if not _has_before(r, n):
        return None
    return sum(r[(n, k)] - r[(k, k)] for k in range(1, n)) / (n - 1)


def forward_transfer(curves: Sequence[SessionCurve], baseline: Mapping[int, float] | None = None) -> float | None:
    """FWT = 1/(N−1) Σ_{k=2..N} (R[k−1][k] − b_k): accuracy on task k before it is learned, above the
    baseline b_k (Lopez-Paz & Ranzato 2017, eq. 4).

    The paper's b_k is a randomly initialised model's accuracy on task k, which bench does not train;
    without ``baseline`` b_k = 0, so FWT is the mean accuracy on the classes still to come of the model
    that has not met them (0 for a class-incremental head, which has no units for them yet: the head grows
    after this point).
    """
    r, n = accuracy_matrix(curves), _n_tasks(curves)
    if not _has_before(r, n):
        return None
    base = baseline or {}
    return sum(r[(k - 1, k)] - base.get(k, 0.0) for k in range(2, n + 1)) / (n - 1)


def forward_transfer_possible(protocol: Protocol) -> bool:
    """Whether FWT can differ from 0 on ``protocol``, by its structure alone. R[k−1][k] is read before session
    k's classes get their head units; on a class-incremental stream (``ordering: cil``) whose head grows
    (``backbone.head_units`` grown or unset) the model has no unit for any of them then, so it predicts none:
    R[k−1][k] = 0 for every method, and b_k = 0 too, so FWT is 0 on every row whatever was trained. The
    published models' full head (``head_units: full``) scores every class from the first session, and an
    i.i.d. stream does not hold classes back, so there FWT measures something."""
    return protocol.ordering != "cil" or protocol.backbone.head_units == "full"
