"""Where a distributed sweep stands: one overall line (done / running / failed, ETA) and, per running
task, where it is (protocol, method, seed, phase, update).

``ProgressBoard`` is plain Python: the Ray executor hosts it in an actor that tasks report to (their
workers are elsewhere), and the driver renders its snapshot. The ETA is a rough one, said as such:
the mean time of the tasks finished so far times the tasks left, over the tasks running at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace


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
    note: str = ""  # why it failed
    went_on_from: str = ""  # where this attempt's first update was: after a retry, where it resumed


class ProgressBoard:
    def __init__(self, labels: dict[str, str], clock=time.monotonic) -> None:
        self.clock = clock
        self.begun = clock()
        self.tasks = {key: TaskState(label) for key, label in labels.items()}

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
        return dict(self.tasks)


def count(states: dict[str, TaskState], status: str) -> int:
    return sum(t.status == status for t in states.values())


def eta_seconds(states: dict[str, TaskState]) -> float | None:
    """Mean duration of the finished tasks x tasks left / tasks running at once; None before any finished."""
    took = [t.finished - t.started for t in states.values()
            if t.status == "done" and t.started is not None and t.finished is not None]
    left = count(states, "pending") + count(states, "running")
    if not took or not left:
        return None if left else 0.0
    return sum(took) / len(took) * left / max(1, count(states, "running"))


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def overall_line(states: dict[str, TaskState], elapsed: float) -> str:
    retried = sum(t.attempts > 1 for t in states.values())
    eta = eta_seconds(states)
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
