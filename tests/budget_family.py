"""Fake results of a budget family for the leaderboard's tests: ``fake_flops@0.5x`` and ``fake_flops@2x``
(a made-up base, never a built-in protocol, so the boards' hash is the results' own), methods vanilla and
vanilla+sgm, seeds 0 and 1, one joint reference per budget and seed. One learning session (session 2) each,
written by hand so a test can state the exact numbers; the FLOPs per update are fixed (0.025 TFLOPs), so a
budget of B TFLOPs per session pays for B / 0.025 updates."""

from __future__ import annotations

from pathlib import Path

from results_factory import hand_result

from bench_stability_gap.harness.results.curves import ReferenceSession, SessionCurve
from bench_stability_gap.harness.results.schema import Budget, ProtocolStamp, RunResult, save_result

BASE = "fake_flops"
BASE_TFLOPS = 0.2  # the base protocol's training budget per session
TFLOPS_PER_UPDATE = 0.025
JOINT_OLD = 0.8

# old-class accuracy at the eval points of session 2 (update 0, then every 2 updates), per budget, method, seed
OLD: dict[tuple[str, str, int], list[float]] = {
    ("0.5", "vanilla", 0): [0.8, 0.4, 0.6],
    ("0.5", "vanilla", 1): [0.8, 0.52, 0.7],
    ("0.5", "vanilla+sgm", 0): [0.8, 0.7, 0.76],
    ("0.5", "vanilla+sgm", 1): [0.8, 0.72, 0.78],
    ("2", "vanilla", 0): [0.8, 0.4, 0.6, 0.7, 0.75, 0.78, 0.79, 0.8, 0.8],
    ("2", "vanilla", 1): [0.8, 0.5, 0.62, 0.72, 0.76, 0.79, 0.8, 0.8, 0.81],
    ("2", "vanilla+sgm", 0): [0.8, 0.72, 0.77, 0.79, 0.8, 0.8, 0.8, 0.8, 0.8],
    ("2", "vanilla+sgm", 1): [0.8, 0.74, 0.78, 0.79, 0.8, 0.8, 0.81, 0.81, 0.81],
}


def session_curve(old: list[float], lift: float) -> SessionCurve:
    """Session 2 with eval points every 2 updates; new-class accuracy climbs to 0.6 + ``lift``."""
    n = len(old)
    updates = [2 * p for p in range(n)]
    new = [0.0] + [min(0.6 + lift, (0.6 + lift) * p / 3) for p in range(1, n)]
    all_ = [(o + x) / 2 for o, x in zip(old, new)]
    flops = [u * TFLOPS_PER_UPDATE * 1e12 for u in updates]
    return SessionCurve(session=2, total_updates=updates[-1], updates=updates, old=old, new=new, all=all_,
                        tasks=[old, new], train_flops=flops)


def _stamped(r: RunResult, factor: str, updates: int) -> RunResult:
    budget = BASE_TFLOPS * float(factor)
    return r.model_copy(update={
        "protocol": ProtocolStamp(name=f"{BASE}@{factor}x", version=1, hash=f"hash-{factor}".ljust(16, "0")),
        "budget": Budget(updates_per_session=[updates], train_tflops_budget=budget, batch_new=1, batch_old=0,
                         samples_trained=updates, optimizer_steps=updates, memory_policy="none", memory_capacity=None,
                         memory_peak_samples=0, memory_peak_bytes=0, train_flops=updates * TFLOPS_PER_UPDATE * 1e12,
                         train_flops_per_session=[updates * TFLOPS_PER_UPDATE * 1e12])})


def family_results() -> list[RunResult]:
    out = []
    for (factor, method, seed), old in OLD.items():
        c = session_curve(old, 0.1 if "sgm" in method else 0.0)
        r = hand_result(f"{method.replace('+', '_')}-{factor}-{seed}", method, seed, curves=[c])
        out.append(_stamped(r, factor, c.total_updates))
    for factor in ("0.5", "2"):
        for seed in (0, 1):
            joint = hand_result(f"joint-{factor}-{seed}", "joint", seed, reference=[
                ReferenceSession(session=2, old=JOINT_OLD, new=0.75, all=0.78, tasks=[JOINT_OLD, 0.75])])
            out.append(_stamped(joint, factor, 30))
    return out


def write_family(root: Path, extra: list[RunResult] = ()) -> Path:  # type: ignore[assignment]
    for r in [*family_results(), *extra]:
        save_result(root, r)
    return root
