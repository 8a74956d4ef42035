"""Where a distributed sweep stands: one overall line (done / running / failed, ETA) and, per running
task, where it is (protocol, method, seed, phase, update).

``ProgressBoard`` is plain Python: the Ray executor hosts it in an actor that tasks report to (their
workers are elsewhere), and the driver renders its snapshot. The ETA is a rough one, said as such:
each task not finished is expected to take the mean time of the tasks finished so far, less what a
running task has already spent, and that work is shared by the tasks running at once; so it counts
down between two tasks' ends instead of standing still until the next one finishes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..progress_bar import duration as _duration


@dataclass(frozen=True)
class TaskState:
    label: str
    status: str = "pending"  # pending, running, done, failed, skipped (a stage it needs failed)
    attempts: int = 0  # > 1: a worker died and Ray retried the task
    node: str = ""
    phase: str = ""  # e.g. "session 3", "joint S1..S4", "pretrain S1"
    update: int = 0
    total: int = 0
    started: float | None = None
    finished: float | None = None
    age: float = 0.0  # seconds since it started, as of the snapshot (the board's clock: workers' may differ)
    note: str = ""  # why it failed
    went_on_from: str = ""  # where this attempt's first update was: after a retry, where it resumed


class ProgressBoard:
    def __init__(self, labels: dict[str, str], clock=time.monotonic, work: dict[str, float | None] | None = None
                 ) -> None:
        self.clock = clock
        self.begun = clock()
        self.tasks = {key: TaskState(label) for key, label in labels.items()}
        self.work = work  # each task's share of the sweep's work, where the plan knows it (eta_seconds)

    def started(self, key: str, node: str) -> int:
        """A worker began the task (again, after a retry: the attempt count says so); returns the attempt."""
        t = self.tasks[key]
        self.tasks[key] = replace(t, status="running", attempts=t.attempts + 1, node=node, phase="", update=0,
                                  total=0, started=self.clock(), went_on_from="")
        return t.attempts + 1

    def at(self, key: str, phase: str, update: int, total: int) -> None:
        t = self.tasks[key]
        if t.status == "running":
            first = t.went_on_from or f"{phase}, update {update}"
            self.tasks[key] = replace(t, phase=phase, update=update, total=total, went_on_from=first)

    def finished(self, key: str, status: str, note: str = "") -> None:
        self.tasks[key] = replace(self.tasks[key], status=status, finished=self.clock(), note=note)

    def snapshot(self) -> dict[str, TaskState]:
        now = self.clock()
        return {k: replace(t, age=now - t.started) if t.status == "running" and t.started is not None else t
                for k, t in self.tasks.items()}


def count(states: dict[str, TaskState], status: str) -> int:
    return sum(t.status == status for t in states.values())


def eta_seconds(states: dict[str, TaskState], work: dict[str, float | None] | None = None) -> float | None:
    """Seconds left: each task not finished is expected to take its share of the work (``work``: what the
    plan knows of each task, the samples it trains on) at the speed the finished tasks measured, or,
    where the work of some task is not known, the mean duration of the finished ones; a running task
    that less its age. The sum is shared by the tasks running at once. None before any task finished
    (nothing to go by)."""
    done = {k: t.finished - t.started for k, t in states.items()
            if t.status == "done" and t.started is not None and t.finished is not None}
    running = {k: t for k, t in states.items() if t.status == "running"}
    pending = [k for k, t in states.items() if t.status == "pending"]
    if not running and not pending:
        return 0.0
    if not done:
        return None
    weights = work if work is not None and all(work.get(k) is not None for k in states) else None
    if weights is not None and sum(weights[k] or 0.0 for k in done) > 0:
        rate = sum(done.values()) / sum(weights[k] or 0.0 for k in done)  # seconds per unit of work
        expect = {k: (weights[k] or 0.0) * rate for k in [*pending, *running]}
    else:
        mean = sum(done.values()) / len(done)
        expect = {k: mean for k in [*pending, *running]}
    left = sum(expect[k] for k in pending) + sum(max(0.0, expect[k] - t.age) for k, t in running.items())
    return left / max(1, len(running))




def overall_line(states: dict[str, TaskState], elapsed: float, work: dict[str, float | None] | None = None) -> str:
    retried = sum(t.attempts > 1 for t in states.values())
    eta = eta_seconds(states, work)
    parts = [f"tasks: {count(states, 'done')}/{len(states)} done", f"{count(states, 'running')} running",
             f"{count(states, 'failed')} failed"]
    if count(states, "skipped"):
        parts.append(f"{count(states, 'skipped')} skipped")
    if retried:
        parts.append(f"{retried} retried")
    parts.append(f"elapsed {_duration(elapsed)}")
    parts.append(f"ETA {_duration(eta)}" if eta is not None else "ETA -")
    return ", ".join(parts)


def running_lines(states: dict[str, TaskState]) -> list[str]:
    out = []
    for t in states.values():
        if t.status != "running":
            continue
        where = f"{t.phase}, update {t.update}/{t.total}" if t.phase else "preparing"
        extra = f" (node {t.node}" + (f", attempt {t.attempts})" if t.attempts > 1 else ")")
        out.append(f"  {t.label}: {where}{extra}")
    return out
