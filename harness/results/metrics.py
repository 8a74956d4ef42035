"""Metrics computed from a run's accuracy curves: the paper's gaps (sec. 3.2) and the extras reported beside them.

Everything here is a pure function of ``SessionCurve`` lists (one per learning session 2..N) and the
reference accuracies (joint model per session, best CL accuracy on each session's new classes), so the
same numbers come out of a live run, a resumed run and a re-scored results file. Accuracies may be
fractions or percentages: every metric is either a ratio or in the curves' own unit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .catalog import CURVE_METRICS, METRICS, TIME_TO_RESULT_KEYS
from .curves import ReferenceSession, SessionCurve

# Table 4 of the paper: recover 97/98/99/100 % of the joint model's accuracy on ImageNet-1K, the
# pre-training classes (task 1: ``tasks[0]``), not on all old classes; ``recovery_on="old"`` is the other reading.
RECOVERY_FRACTIONS: dict[str, float] = {"97": 0.97, "98": 0.98, "99": 0.99, "100": 1.0}
RecoveryOn = Literal["pretrain", "old"]
# Fig. 5 of the paper: updates to reach 99 % of the best new-class accuracy, each method's own best
# (``speed_reference="own"``) as the figure compares methods that peak at different levels;
# ``"all_runs"`` measures against A_best(E_j), the best of every run (P_Δ's scale).
BEST_NEW_FRACTION = 0.99
SpeedReference = Literal["own", "all_runs"]
# Time to result: the share of A_joint(E_1:j−1) the old classes must get back to, and of A_best(E_j) (P_Δ's
# reference) the new classes must reach, after each session starts.
TIME_TO_RESULT_FRACTION = 0.99
# How Ω weights a session's eval points (the paper averages every update 1..L, §3.2; the curves hold
# eval points only): "interval" (bench) weights point p by the updates since the previous point, update 0
# left out; "compute" (bench, FLOP-budgeted protocols) by the training FLOPs since the previous point, so
# methods whose updates cost different FLOPs are averaged over the same compute; "points" is the plain
# mean of the points after update 0; "points_with_start" the plain mean of every point, update 0
# included. They agree on evenly spaced points without update 0 counted.
EvalWeighting = Literal["interval", "compute", "points", "points_with_start"]

_T = TypeVar("_T")


# --------------------------------------------------------------------------------------- helpers


def _ordered(curves: Sequence[SessionCurve]) -> list[SessionCurve]:
    """Curves sorted by session, checked to be exactly sessions 2..N.

    The paper averages over j = 2..N; a missing or repeated session means a curve was lost or
    recorded twice, and silently averaging over what is left would report a wrong number.
    """
    if not curves:
        raise ValueError("no session curves: metrics need at least one learning session")
    ordered = sorted(curves, key=lambda c: c.session)
    for expected, curve in enumerate(ordered, start=2):
        if curve.session != expected:
            seen = [c.session for c in ordered]
            raise ValueError(f"session curves must be sessions 2..N once each; got sessions {seen}")
    return ordered


def _by_session(joint: Sequence[ReferenceSession]) -> dict[int, ReferenceSession]:
    """Joint references keyed by session number (a duplicate is ambiguous, so an error)."""
    refs: dict[int, ReferenceSession] = {}
    for ref in joint:
        if ref.session in refs:
            raise ValueError(f"two joint references for session {ref.session}")
        refs[ref.session] = ref
    return refs


def _reference(refs: Mapping[int, _T], session: int, what: str) -> _T:
    """The reference for one session; a missing one is an error that names the session."""
    try:
        return refs[session]
    except KeyError:
        raise ValueError(f"no {what} for session {session}") from None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _gap(omegas: Sequence[float]) -> float:
    return 1.0 - _mean(omegas)


# ------------------------------------------------------------------------------ the paper's gaps


def omega(updates: Sequence[int], acc: Sequence[float], reference: float,
          weighting: EvalWeighting = "interval", train_flops: Sequence[float] | None = None) -> float:
    """Ω_j: mean accuracy over a session's eval points relative to a reference (paper eq. 1-3).

    The paper averages A_i / A_ref over every update i = 1..L. We only have eval points
    ``updates[0] = 0 < u_1 < ... < u_L``; the update-0 point is the model before any training in
    the session, kept for the curves but not part of the mean. Each point p >= 1 stands for the
    updates since the previous point, so it is weighted by ``(u_p - u_{p-1}) / u_L`` (a
    right-endpoint Riemann sum of the per-update curve). With evenly spaced points (u_p = p*c) every weight
    is 1/L and this is the plain mean; a denser start (where the gap is deepest) then does not
    over-count the first updates. ``weighting="compute"`` is the same sum over the cumulative
    ``train_flops`` at each point instead of the update count. ``weighting``: see ``EvalWeighting``.
    """
    if len(updates) != len(acc):
        raise ValueError(f"{len(updates)} eval points but {len(acc)} accuracies")
    if len(updates) < 2:
        raise ValueError("Ω needs at least one eval point after update 0")
    if updates[0] != 0:
        raise ValueError(f"the first eval point must be update 0, got {updates[0]}")
    if any(b <= a for a, b in zip(updates, updates[1:])):
        raise ValueError("eval points must be strictly increasing")
    if not reference > 0:
        raise ValueError(f"the reference accuracy must be positive, got {reference}")
    if weighting == "points":
        return _mean(acc[1:]) / reference
    if weighting == "points_with_start":
        return _mean(acc) / reference
    if weighting == "compute":
        if train_flops is None or len(train_flops) != len(acc):
            raise ValueError("compute weighting needs the training FLOPs at every eval point")
        if any(b <= a for a, b in zip(train_flops, train_flops[1:])):
            raise ValueError("training FLOPs must grow from one eval point to the next")
        xs: Sequence[float] = [f - train_flops[0] for f in train_flops]
    elif weighting == "interval":
        xs = updates
    else:
        raise ValueError(f"unknown eval-point weighting {weighting!r}")
    weighted = sum((xs[p] - xs[p - 1]) * acc[p] for p in range(1, len(xs)))
    return weighted / xs[-1] / reference


def _omega(c: SessionCurve, acc: Sequence[float], reference: float, weighting: EvalWeighting) -> float:
    return omega(c.updates, acc, reference, weighting, c.train_flops)


def stability_gap(curves: Sequence[SessionCurve], joint: Sequence[ReferenceSession],
                  weighting: EvalWeighting = "interval") -> float:
    """S_Δ = 1 − mean_j Ω_j(old / A_joint(E_1:j−1)): how much old-class accuracy is missing."""
    refs = _by_session(joint)
    return _gap(
        [
            _omega(c, c.old, _reference(refs, c.session, "joint reference").old, weighting)
            for c in _ordered(curves)
        ]
    )


def continual_knowledge_gap(curves: Sequence[SessionCurve], joint: Sequence[ReferenceSession],
                            weighting: EvalWeighting = "interval") -> float:
    """CK_Δ = 1 − mean_j Ω_j(all / A_joint(E_1:j)): the balance of old and new knowledge."""
    refs = _by_session(joint)
    return _gap(
        [
            _omega(c, c.all, _reference(refs, c.session, "joint reference").all, weighting)
            for c in _ordered(curves)
        ]
    )


def plasticity_gap(curves: Sequence[SessionCurve], best_new: Mapping[int, float],
                   weighting: EvalWeighting = "interval") -> float | None:
    """P_Δ = 1 − mean_j Ω_j(new / A_best(E_j)): how slowly new classes are learned.

    Normalized by the best CL accuracy on E_j (see ``best_new_accuracy``), not by the joint model,
    because a joint model never learns E_j incrementally. None (undefined, never 0 or 1) while no CL
    run of the protocol has classified a single new-class test image of some session correctly.
    """
    ordered = _ordered(curves)
    best = [float(_reference(best_new, c.session, "best new-class accuracy")) for c in ordered]
    if not all(b > 0 for b in best):
        return None
    return _gap([_omega(c, c.new, b, weighting) for c, b in zip(ordered, best)])


def best_new_accuracy(runs: Iterable[Sequence[SessionCurve]]) -> dict[int, float]:
    """A_best(E_j): per session, the best new-class accuracy any CL run reached at any eval point.

    Pass every CL run on one protocol (the run being scored included), so P_Δ ranks runs on a
    common scale.
    """
    best: dict[int, float] = {}
    for run in runs:
        for curve in run:
            top = max(curve.new)
            best[curve.session] = max(best.get(curve.session, top), top)
    return best


# -------------------------------------------------------------------- end-of-session accuracies


def sigma(curves: Sequence[SessionCurve]) -> float:
    """σ: final accuracy on the pre-training classes (task 1), what the deployed model must keep."""
    return _ordered(curves)[-1].tasks[0][-1]


def mu(curves: Sequence[SessionCurve]) -> float:
    """μ: mean over sessions 2..N of the end-of-session accuracy on all classes seen so far."""
    return _mean([c.all[-1] for c in _ordered(curves)])


def alpha(curves: Sequence[SessionCurve]) -> float:
    """α: final accuracy on all classes, the classic end-of-stream CL number."""
    return _ordered(curves)[-1].all[-1]


# ------------------------------------------------------------------------------ speed (Table 4)


def _flops_at(curve: SessionCurve, point: int) -> float | None:
    """Training FLOPs spent in this session up to eval point ``point`` (index).

    Subtracting the update-0 value makes this right whether ``train_flops`` is cumulative over the
    session (first value 0) or over the whole run.
    """
    if curve.train_flops is None:
        return None
    return curve.train_flops[point] - curve.train_flops[0]


def _recovered(curve: SessionCurve, on: RecoveryOn) -> Sequence[float]:
    return curve.tasks[0] if on == "pretrain" else curve.old


def _recovery_point(curve: SessionCurve, joint_old: float, fraction: float, on: RecoveryOn) -> int | None:
    acc = _recovered(curve, on)
    threshold = fraction * joint_old
    below = next((p for p, a in enumerate(acc) if a < threshold), None)
    if below is None:
        return 0
    return next((p for p in range(below + 1, len(acc)) if acc[p] >= threshold), None)


def recovery_updates(curve: SessionCurve, joint_old: float, fraction: float, on: RecoveryOn = "pretrain") -> int | None:
    """Updates needed to get accuracy on the pre-training classes (``on="old"``: all old classes) back
    to ``fraction`` × the joint model's on the same classes (Table 4); ``joint_old`` is that reference.

    0 if the curve never falls below the threshold (no stability gap; the update-0 point counts).
    Otherwise the update count of the first eval point, after the first one below the threshold, at
    which it is back at or above it; None if it never gets back (the table's hyphen).
    """
    point = _recovery_point(curve, joint_old, fraction, on)
    return None if point is None else curve.updates[point]


def recovery_flops(curve: SessionCurve, joint_old: float, fraction: float, on: RecoveryOn = "pretrain") -> float | None:
    """Training FLOPs (this session) at the point ``recovery_updates`` finds; None without FLOPs."""
    point = _recovery_point(curve, joint_old, fraction, on)
    return None if point is None else _flops_at(curve, point)


def _best_new_point(curve: SessionCurve, best_new: float, fraction: float) -> int | None:
    if not best_new > 0:  # nothing learned by any run: there is no level to reach
        return None
    threshold = fraction * best_new
    return next((p for p, a in enumerate(curve.new) if a >= threshold), None)


def updates_to_best_new(
    curve: SessionCurve, best_new: float, fraction: float = BEST_NEW_FRACTION
) -> int | None:
    """Updates until new-class accuracy first reaches ``fraction`` × A_best(E_j) (paper Fig. 5).

    How fast a method learns the new classes; None if it never gets there.
    """
    point = _best_new_point(curve, best_new, fraction)
    return None if point is None else curve.updates[point]


def flops_to_best_new(
    curve: SessionCurve, best_new: float, fraction: float = BEST_NEW_FRACTION
) -> float | None:
    """Training FLOPs (this session) at the point ``updates_to_best_new`` finds; None without FLOPs."""
    point = _best_new_point(curve, best_new, fraction)
    return None if point is None else _flops_at(curve, point)


class TimeToResult(BaseModel):
    """Time to result per session (index 0 = session 2), counted from the session's update-0 point: updates
    and training FLOPs until old-class accuracy is back at ``TIME_TO_RESULT_FRACTION`` × A_joint(E_1:j−1)
    (``recovery_updates`` on all old classes) and until new-class accuracy first reaches it × A_best(E_j)
    (``updates_to_best_new`` against P_Δ's reference). None: not reached in that session. The FLOP lists
    are None when the run recorded no FLOPs."""

    model_config = ConfigDict(extra="forbid")

    old_updates: list[int | None]
    old_flops: list[float | None] | None
    new_updates: list[int | None]
    new_flops: list[float | None] | None

    def reached(self, name: str) -> list[float] | None:
        """The values of the sessions that reached the level, of the list ``name``; None when not recorded."""
        values = getattr(self, name)
        return None if values is None else [float(v) for v in values if v is not None]


def time_to_result(curves: Sequence[SessionCurve], joint: Sequence[ReferenceSession],
                   best_new: Mapping[int, float], fraction: float = TIME_TO_RESULT_FRACTION) -> TimeToResult:
    """Time to result of one run: see ``TimeToResult``; ``best_new`` is A_best(E_j) as P_Δ uses it."""
    ordered = _ordered(curves)
    refs = _by_session(joint)
    old = [_reference(refs, c.session, "joint reference").old for c in ordered]
    best = [float(_reference(best_new, c.session, "best new-class accuracy")) for c in ordered]
    flops = any(c.train_flops is not None for c in ordered)
    return TimeToResult(
        old_updates=[recovery_updates(c, j, fraction, "old") for c, j in zip(ordered, old)],
        old_flops=[recovery_flops(c, j, fraction, "old") for c, j in zip(ordered, old)] if flops else None,
        new_updates=[updates_to_best_new(c, b, fraction) for c, b in zip(ordered, best)],
        new_flops=[flops_to_best_new(c, b, fraction) for c, b in zip(ordered, best)] if flops else None,
    )


# ---------------------------------------------------------------- De Lange et al. (ICLR 2023)


def min_acc(curves: Sequence[SessionCurve]) -> float:
    """De Lange's min-ACC for the final task k = N: mean over tasks i < N of their worst accuracy.

    The worst accuracy on task i is taken over every eval point after task i was learned: task 1
    (pre-training) is learned before session 2, so every point of every session counts; task i >= 2
    is learned at the end of session i, so the points of sessions > i count, update-0 points
    included (new output units may already disturb old classes there).
    """
    ordered = _ordered(curves)
    n_tasks = ordered[-1].session
    worst = [
        min(a for c in ordered if c.session > task for a in c.tasks[task - 1])
        for task in range(1, n_tasks)
    ]
    return _mean(worst)


def wc_acc(curves: Sequence[SessionCurve]) -> float:
    """De Lange's WC-ACC = (1/k)·a(T_k, final) + (1 − 1/k)·min-ACC with k = N tasks.

    A lower bound that trades the final task's accuracy against the worst case on earlier tasks.
    """
    ordered = _ordered(curves)
    k = ordered[-1].session
    return ordered[-1].tasks[-1][-1] / k + (1.0 - 1.0 / k) * min_acc(ordered)


# ------------------------------------------------------------------------------- all together


class Metrics(BaseModel):
    """Every metric of one run. Per-session lists hold sessions 2..N in order (index 0 = session 2)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")  # NaN stays NaN in the JSON

    S_delta: float
    P_delta: float | None  # None: no run has learned some session's new classes at all (A_best = 0)
    CK_delta: float
    sigma: float
    mu: float
    alpha: float
    min_acc: float
    wc_acc: float
    recovery_updates: dict[str, list[int | None]]
    recovery_flops: dict[str, list[float | None]] | None
    updates_to_best_new: list[int | None]
    flops_to_best_new: list[float | None] | None
    # the catalog's curve metrics (``metric_catalog.CURVE_METRICS``) by key; empty in results stored before
    # they existed (the leaderboard recomputes metrics, so those runs get them there); forgetting, BWT and
    # FWT are absent for curves without their "before" points (results stored before those were recorded)
    standard: dict[str, float] = Field(default_factory=dict)
    # None in results stored before time to result existed (the leaderboard recomputes metrics)
    time_to_result: TimeToResult | None = None

    @model_validator(mode="after")
    def _shapes(self) -> Metrics:
        n = len(self.updates_to_best_new)
        tables: dict[str, Mapping[str, Sequence[object]] | None] = {
            "recovery_updates": self.recovery_updates,
            "recovery_flops": self.recovery_flops,
        }
        for name, table in tables.items():
            if table is None:
                continue
            if set(table) != set(RECOVERY_FRACTIONS):
                raise ValueError(f"{name} must be keyed {sorted(RECOVERY_FRACTIONS)}, got {sorted(table)}")
            if any(len(v) != n for v in table.values()):
                raise ValueError(f"{name} must hold one value per session ({n})")
        if self.flops_to_best_new is not None and len(self.flops_to_best_new) != n:
            raise ValueError(f"flops_to_best_new must hold one value per session ({n})")
        ttr = self.time_to_result
        if ttr is not None and any(v is not None and len(v) != n for v in ttr.model_dump().values()):
            raise ValueError(f"time_to_result must hold one value per session ({n}) in each list")
        return self

    def value(self, key: str) -> float | None:
        """One scalar metric by its catalog key, a field or one of the ``standard`` ones (None: not there).
        A time-to-result key is the mean over the sessions that reached the level (None: none did)."""
        info = METRICS.get(key)
        if info is not None and info.per_session is not None:
            reached = self.reached(key)
            if not reached:
                return None
            return sum(reached) / len(reached) / info.per_session[1]
        if key in type(self).model_fields and key not in ("standard", "time_to_result"):
            value = getattr(self, key)
            return None if value is None else float(value)
        return self.standard.get(key)

    def reached(self, key: str) -> list[float] | None:
        """A time-to-result key's per-session values where the level was reached (None: not recorded)."""
        info = METRICS[key]
        if self.time_to_result is None or info.per_session is None:
            return None
        return self.time_to_result.reached(info.per_session[0])

    @property
    def sessions(self) -> int:
        return len(self.updates_to_best_new)

    def scalars(self) -> dict[str, float]:
        """A flat ``name -> float`` dict for MLflow; per-session values as e.g. ``recovery_99_s3``.

        None (no recovery, no FLOPs) is left out: MLflow has no missing value.
        """
        out: dict[str, float] = {
            name: float(getattr(self, name))
            for name in ("S_delta", "P_delta", "CK_delta", "sigma", "mu", "alpha", "min_acc", "wc_acc")
            if getattr(self, name) is not None
        }
        out.update(self.standard)

        def per_session(prefix: str, values: Sequence[float | None]) -> None:
            for index, value in enumerate(values):
                if value is not None:
                    out[f"{prefix}_s{index + 2}"] = float(value)

        for key, values in self.recovery_updates.items():
            per_session(f"recovery_{key}", values)
        for key, flops in (self.recovery_flops or {}).items():
            per_session(f"recovery_flops_{key}", flops)
        per_session("updates_to_best_new", self.updates_to_best_new)
        per_session("flops_to_best_new", self.flops_to_best_new or [])
        if self.time_to_result is not None:
            for info in (METRICS[k] for k in TIME_TO_RESULT_KEYS):
                field, divisor = info.per_session  # type: ignore[misc]  # these keys all have one
                per_session(info.key, [None if v is None else v / divisor
                                       for v in getattr(self.time_to_result, field) or []])
                if (mean := self.value(info.key)) is not None:
                    out[info.key] = mean
        return out


def _joint_recovery_reference(ref: ReferenceSession, on: RecoveryOn) -> float:
    if on == "old":
        return ref.old
    if not ref.tasks:
        raise ValueError(f"joint reference of session {ref.session} has no per-task accuracies; recovery on "
                         f"the pre-training classes needs tasks[0]")
    return ref.tasks[0]


def compute_metrics(
    curves: Sequence[SessionCurve],
    joint: Sequence[ReferenceSession],
    best_new: Mapping[int, float],
    recovery_on: RecoveryOn = "pretrain",
    speed_reference: SpeedReference = "own",
    eval_weighting: EvalWeighting = "interval",
) -> Metrics:
    """All metrics of one run from its curves, the joint references and A_best per session.

    FLOP-based entries are None overall when no curve recorded FLOPs, and None for a session whose
    curve did not. ``recovery_on`` and ``speed_reference``: see RECOVERY_FRACTIONS / BEST_NEW_FRACTION;
    ``eval_weighting``: how Ω weights the eval points of S_Δ, P_Δ and CK_Δ (see ``EvalWeighting``).
    """
    ordered = _ordered(curves)
    refs = _by_session(joint)
    joint_old = [_joint_recovery_reference(_reference(refs, c.session, "joint reference"), recovery_on)
                 for c in ordered]
    best = [max(c.new) if speed_reference == "own"
            else float(_reference(best_new, c.session, "best new-class accuracy"))
            for c in ordered]
    has_flops = any(c.train_flops is not None for c in ordered)
    return Metrics(
        S_delta=stability_gap(ordered, joint, eval_weighting),
        P_delta=plasticity_gap(ordered, best_new, eval_weighting),
        CK_delta=continual_knowledge_gap(ordered, joint, eval_weighting),
        sigma=sigma(ordered),
        mu=mu(ordered),
        alpha=alpha(ordered),
        min_acc=min_acc(ordered),
        wc_acc=wc_acc(ordered),
        recovery_updates={
            key: [recovery_updates(c, j, f, recovery_on) for c, j in zip(ordered, joint_old)]
            for key, f in RECOVERY_FRACTIONS.items()
        },
        recovery_flops=(
            {
                key: [recovery_flops(c, j, f, recovery_on) for c, j in zip(ordered, joint_old)]
                for key, f in RECOVERY_FRACTIONS.items()
            }
            if has_flops
            else None
        ),
        updates_to_best_new=[updates_to_best_new(c, b) for c, b in zip(ordered, best)],
        flops_to_best_new=[flops_to_best_new(c, b) for c, b in zip(ordered, best)] if has_flops else None,
        standard={m.key: float(v) for m in CURVE_METRICS if m.compute is not None
                  and (v := m.compute(ordered)) is not None},
        time_to_result=time_to_result(ordered, joint, best_new),
    )
