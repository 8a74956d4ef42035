"""Hand-built RunResults for unit tests: every number is written here, so a test can state the exact output."""

from __future__ import annotations

from bench_stability_gap.harness.results.curves import BeforePoint, ReferenceSession, SessionCurve
from bench_stability_gap.harness.results.schema import Budget, MethodStamp, ProtocolStamp, RunResult


def curve(session: int, total: int, updates: list[int], old: list[float], new: list[float], all_: list[float],
          tasks: list[list[float]] | None = None, before: list[float] | None = None) -> SessionCurve:
    """A session curve; ``tasks`` defaults to task 1 = ``old`` and the others = ``new``; ``before`` (per
    task) the accuracies of the model the session starts from (its old/all: task 1's, new: the last's)."""
    tasks = tasks or [old] + [new] * (session - 1)
    point = None if before is None else BeforePoint(old=before[0], new=before[-1], all=before[0], tasks=before)
    return SessionCurve(session=session, total_updates=total, updates=updates, old=old, new=new, all=all_,
                        tasks=tasks, before=point)


def hand_result(run_id: str, method: str = "vanilla", seed: int = 0, curves: list[SessionCurve] | None = None,
                reference: list[ReferenceSession] | None = None, *, params: int = 1_500_000,
                steps: int = 10, wall: float = 12.5, flops: float | None = None) -> RunResult:
    parts = method.split("+")
    return RunResult(
        run_id=run_id, status="complete",
        protocol=ProtocolStamp(name="hand", version=1, hash="h" * 16),
        method=MethodStamp(spec=method, base=parts[0], modifiers=parts[1:], distribution="bench-stability-gap",
                           version="0.1.0"),
        config={}, seed=seed, trainable_params=params, curves=curves or [], reference=reference or [],
        budget=Budget(updates_per_session=[steps], batch_new=1, batch_old=0, samples_trained=steps,
                      optimizer_steps=steps, memory_policy="none", memory_capacity=None, memory_peak_samples=0,
                      memory_peak_bytes=0, train_flops=flops),
        versions={}, git_commit=None, started_at="2026-01-01T00:00:00+00:00", wall_time_s=wall,
    )


def two_session_run(run_id: str = "r1", method: str = "vanilla", seed: int = 0, lift: float = 0.0) -> RunResult:
    """Sessions 2 (U=4, points 0, 2, 4) and 3 (U=6, points 0, 3), accuracies as fractions."""
    return hand_result(run_id, method, seed, curves=[
        curve(2, 4, [0, 2, 4], [0.9, 0.5 + lift, 0.8], [0.0, 0.6, 0.7], [0.45, 0.55, 0.75], before=[0.9, 0.0]),
        curve(3, 6, [0, 3], [0.7, 0.6 + lift], [0.1, 0.9], [0.5, 0.7],
              tasks=[[0.8, 0.65], [0.6, 0.55], [0.1, 0.9]], before=[0.8, 0.7, 0.0]),
    ])


def joint_run(run_id: str = "j1", seed: int = 0) -> RunResult:
    return hand_result(run_id, "joint", seed, reference=[
        ReferenceSession(session=2, old=0.9, new=0.8, all=0.85, tasks=[0.9, 0.8]),
        ReferenceSession(session=3, old=0.88, new=0.9, all=0.89, tasks=[0.87, 0.89, 0.9]),
    ], steps=30)


def spread_run(run_id: str, method: str, seed: int, skill: float) -> RunResult:
    """A two-session run whose old, new and all-class accuracies all move with ``skill`` and differ by seed
    in the second decimal, each method in its own way, as real runs do: every mean then has a spread, a t
    interval and a paired test with a p-value (and usually a seed count for 80 % power), so the tables'
    cells are as wide as real ones."""
    jitter = (0.0, 0.0137, -0.0091)[(seed + len(method)) % 3]
    s = skill + jitter
    return hand_result(run_id, method, seed, curves=[
        curve(2, 4, [0, 2, 4], [0.9, 0.5123 + s, 0.8017 + s / 2], [0.0, 0.6031 + s, 0.7129 + s / 3],
              [0.45, 0.5577 + s, 0.7573 + s / 2], before=[0.9, 0.0]),
        curve(3, 6, [0, 3], [0.7, 0.6043 + s], [0.1, 0.8861 + s / 4], [0.5, 0.7193 + s / 2],
              tasks=[[0.8, 0.6517 + s], [0.6, 0.5541 + s], [0.1, 0.8861 + s / 4]], before=[0.8, 0.7, 0.0]),
    ])
