"""A resumed run's wall time is summed over its processes: each records in its checkpoints how long the
phase has run, and the process that resumes adds its own time to that."""

from __future__ import annotations

import time

from bench_stability_gap.harness.run.checkpoint import Checkpointer


def test_the_wall_time_of_a_resumed_phase_adds_the_earlier_processes(tmp_path):
    first = Checkpointer(tmp_path / "run.pt", every=1)
    time.sleep(0.3)
    earlier = first.wall_seconds()
    first.save({"next_session": 1})  # the first process checkpoints (recording at least ``earlier``), then is killed
    assert earlier >= 0.3

    second = Checkpointer(tmp_path / "run.pt", every=1)  # the command run again: a new process
    assert second.load() is not None
    time.sleep(0.1)
    total = second.wall_seconds()
    assert earlier + 0.1 <= total < earlier + 5
    fresh = Checkpointer(tmp_path / "other.pt", every=1)  # nothing to resume: this process's time only
    assert fresh.load() is None and fresh.wall_seconds() < 1
