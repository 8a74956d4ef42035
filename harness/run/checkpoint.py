"""Checkpoints, so that a killed run resumes where it stopped and gives the numbers it would have given.

A checkpoint is one file per run phase (pre-training, joint reference, continual run), written atomically
every K updates (``--checkpoint-every``; by default when ``checkpoint_seconds`` have passed) and at every
session end. It is keyed by everything that determines the run's numbers (``harness.identity.RunIdentity``'s
``checkpoint_key``: protocol spec hash, method string, resolved settings, ``--set`` overrides, seed, device and
caching), so re-running the same command finds it and a changed command never does. It holds every random
stream (Python, NumPy, torch, the run's own generators), so the resumed run draws exactly what the
uninterrupted one would have drawn. It is removed once the phase's result is stored.

``BENCH_KILL_AT=phase:N`` (phase: pretrain, joint, continual) makes the process SIGKILL itself after N updates
of that phase (fault injection for the resume tests; never set it otherwise).
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..atomic import atomic_write, move_aside
from ..environment import kill_at
from ..errors import BenchError

FORMAT = 4  # 2: DER++'s stored logits as blocks; 3: one progress record and FLOP tally for every stage;
# 4: one shape for every stage (stage.Stage: stage, kind, loop, rng, model, own)
# (a checkpoint of another format is set aside and its phase starts over)


def rng_state(*generators: np.random.Generator | torch.Generator) -> dict[str, Any]:
    """Every random stream a run draws from: the global ones and the run's own generators."""
    state: dict[str, Any] = {
        "python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
        "own": [g.bit_generator.state if isinstance(g, np.random.Generator) else g.get_state() for g in generators],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], *generators: np.random.Generator | torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for g, s in zip(generators, state["own"], strict=True):
        if isinstance(g, np.random.Generator):
            g.bit_generator.state = s
        else:
            g.set_state(s)


_done_here: dict[str, int] = {}


def maybe_die(phase: str) -> None:
    """Fault injection for the resume tests: with ``BENCH_KILL_AT=phase:N``, SIGKILL this process before the
    N-th update of ``phase`` it would run itself (counted from its start, so a resumed run goes on past N)."""
    spec = kill_at()
    if spec is None or spec[0] != phase:
        return
    _done_here[phase] = _done_here.get(phase, 0) + 1
    if _done_here[phase] > spec[1]:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Checkpointer:
    """Saves and finds one phase's checkpoint; decides when the next periodic one is due."""

    path: Path
    every: int | None = None  # updates between periodic checkpoints; None: by time
    seconds: float = 120.0
    _last: float = field(default_factory=time.monotonic)
    writes: int = 0
    bytes_written: int = 0
    _started: float = field(default_factory=time.monotonic)
    _before: float = 0.0  # wall seconds of the earlier processes of a resumed phase, as its checkpoint recorded

    def wall_seconds(self) -> float:
        """The phase's wall time over every process that ran it: this one's, plus what the checkpoint it
        resumed from recorded of the earlier ones (each counted up to its last checkpoint)."""
        return self._before + time.monotonic() - self._started

    def due(self, update: int) -> bool:
        """A periodic checkpoint is due before ``update`` (never at 0: the phase's start is a boundary)."""
        if update == 0:
            return False
        if self.every is not None:
            return self.every > 0 and update % self.every == 0
        return time.monotonic() - self._last >= self.seconds

    @property
    def mid_path(self) -> Path:
        """Where a mid-session checkpoint goes, beside the session-boundary one it continues from."""
        return self.path.with_name(self.path.stem + ".mid.pt")

    def save(self, state: dict[str, Any], mid: bool = False) -> None:
        """Write a checkpoint (no fsync: a kill cannot tear it, a crash only costs the time it saved).
        A boundary checkpoint supersedes the previous session's mid-session one."""
        path = self.mid_path if mid else self.path
        state = {**state, "wall_s": self.wall_seconds()}
        atomic_write(path, lambda fh: torch.save({"format": FORMAT, **state}, fh), durable=False,
                     what=f"the {'mid-session ' if mid else ''}checkpoint", kept=self.kept())
        if not mid:
            self.mid_path.unlink(missing_ok=True)
        self._last = time.monotonic()
        self.writes += 1
        self.bytes_written += path.stat().st_size

    def kept(self) -> str:
        """What a failed checkpoint write leaves to resume from (a failed write never touches it)."""
        there = [p for p in (self.path, self.mid_path) if p.is_file()]
        if not there:
            return ("No earlier checkpoint of this phase exists, so it starts over; results stored before "
                    "(references, earlier phases) are kept.")
        return f"The last good checkpoint is intact ({' and '.join(map(str, there))}); results stored before are kept."

    def load(self, mid: bool = False) -> dict[str, Any] | None:
        """The stored checkpoint, or None. An unreadable one is moved aside (named) and ignored: a
        checkpoint saves time, and a run that starts over still gives the same numbers."""
        path = self.mid_path if mid else self.path
        if not path.is_file():
            return None
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
            if not isinstance(state, dict) or state.get("format") != FORMAT:
                raise ValueError(f"not a bench checkpoint of format {FORMAT}")
            self._before = max(self._before, float(state.get("wall_s", 0.0)))  # absent from older checkpoints
            return state
        except Exception as exc:  # noqa: BLE001 - any failure to read means: start over, say so
            aside = move_aside(path)
            from tqdm.auto import tqdm

            tqdm.write(f"Checkpoint {path} could not be read ({type(exc).__name__}: {exc}); moved to {aside} "
                       f"and starting this phase over.")
            return None

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)
        self.mid_path.unlink(missing_ok=True)


def checkpointer(root: Path, phase: str, key: str, every: int | None, seconds: float) -> Checkpointer:
    """The checkpoint of one phase of one run, under ``<results>/checkpoints/``."""
    if every is not None and every < 0:
        raise BenchError(f"--checkpoint-every {every}: give a number of updates >= 0 (0: only at session ends).")
    return Checkpointer(root / "checkpoints" / f"{phase}-{key}.pt", every, seconds)
