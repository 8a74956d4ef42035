"""What every training stage of a run shares: pre-training the deployed model, each joint model and the
continual sessions are ``Stage`` objects, so each keeps its state in typed attributes and every checkpoint
has one shape.

A checkpoint is ``{"format", "stage", "kind", "loop", "rng", "model", "own", "wall_s"}``: ``loop`` is where
the shared training loop stands and what the stage counted (``LoopState``), ``rng`` every random stream
the stage draws from, ``model`` the trained model's weights and ``own`` what only this stage keeps (the
learner and its batch order offline; the method, the memory and the open session in a continual run).
A stage supplies its streams, its model and its own part; the base writes and reads the rest alike.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from ..data.inputs import InputStore
from ..model import flops as FL
from ..model.backbone import SplitModel
from .checkpoint import Checkpointer, rng_state, set_rng_state
from .loop import Progress, seen_state, setseen_state

STAGES = ("pretrain", "joint", "continual")  # also the phases BENCH_KILL_AT names


@dataclass
class LoopState:
    """Where the shared loop stands in a stage and what the stage has counted so far."""

    stretch: int = 0  # the stretch to run next: a continual run's session position; 0 in a one-stretch stage
    update: int = 0  # the update that stretch continues from (0: its start)
    pending: list | None = None  # batches drawn before a mid-stretch checkpoint and not trained yet
    progress: Progress = field(default_factory=Progress)
    tally: FL.Tally = field(default_factory=FL.Tally.zero)  # the FLOPs counted, shared by the stage's meters

    def state(self) -> dict[str, Any]:
        return {"stretch": self.stretch, "update": self.update, "pending": self.pending,
                "progress": self.progress.state(), "tally": copy.deepcopy(self.tally)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LoopState:
        return cls(stretch=state["stretch"], update=state["update"], pending=state["pending"],
                   progress=Progress.from_state(state["progress"]), tally=copy.deepcopy(state["tally"]))


class Stage:
    """One training stage: its loop state and model, its random streams, its own part, and its checkpoint.

    A subclass sets ``model``, ``stores`` (the input stores whose fetched ids its FLOP accounting reads;
    none where nothing reads them) and ``streams`` (its own generators, beside the global ones), and
    overrides ``own_state`` / ``load_own`` for what only it keeps."""

    name: ClassVar[str] = ""  # the checkpoint's "stage": one of STAGES
    # a mid-stretch checkpoint goes beside the boundary one it continues from (a stage of several
    # stretches); a one-stretch stage keeps one file, which the latest checkpoint replaces
    mid_apart: ClassVar[bool] = True

    def __init__(self, checkpoint: Checkpointer | None) -> None:
        self.checkpoint = checkpoint
        self.loop = LoopState()
        self.model: SplitModel
        self.stores: Sequence[InputStore] = ()
        self.streams: tuple[np.random.Generator | torch.Generator, ...] = ()

    @property
    def progress(self) -> Progress:
        return self.loop.progress

    @progress.setter
    def progress(self, progress: Progress) -> None:
        self.loop.progress = progress

    def own_state(self) -> dict[str, Any]:
        """What only this stage keeps, beside the loop, the streams and the model."""
        return {}

    def load_own(self, own: dict[str, Any]) -> None:
        """Put ``own_state`` back (after the model, before the random streams)."""

    def state_dict(self, kind: str) -> dict[str, Any]:
        """The stage's checkpoint: ``kind`` says where it was taken ("mid": within a stretch, "boundary":
        between stretches)."""
        own = self.own_state()  # first: what a hook reads or draws while saving is in the state after it
        return {"stage": self.name, "kind": kind, "loop": self._loop_state(), "rng": rng_state(*self.streams),
                "model": self.model.state_dict(), "own": own}

    def _loop_state(self) -> dict[str, Any]:
        return {**self.loop.state(), "seen": [seen_state(s) for s in self.stores]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put a ``state_dict`` back into this stage's objects, built alike: the model, the stage's own part,
        then the random streams (so nothing the own part's loading draws shifts them) and the loop."""
        if state.get("stage") != self.name:
            raise ValueError(f"a checkpoint of stage {state.get('stage')!r}, not of {self.name!r}")
        self.model.load_state_dict(state["model"])
        self.load_own(state["own"])
        set_rng_state(state["rng"], *self.streams)
        self.loop = LoopState.from_state(state["loop"])
        for store, seen in zip(self.stores, state["loop"]["seen"], strict=True):
            setseen_state(store, seen)

    def stored(self, mid: bool = False) -> dict[str, Any] | None:
        """This stage's stored checkpoint (the mid-stretch one with ``mid``), or None."""
        state = self.checkpoint.load(mid=mid) if self.checkpoint is not None else None
        return state if state is not None and state.get("stage") == self.name else None

    def save(self, kind: str, mid: bool = False) -> None:
        """Checkpoint the stage as it stands (nothing without a checkpointer)."""
        if self.checkpoint is not None:
            self.checkpoint.save(self.state_dict(kind), mid=mid)

    def save_finished(self) -> None:
        """Checkpoint a finished stage whose outcome is its loop state (a joint model's part, combined
        later): its model, streams and own part are not needed again, so the record holds none of them."""
        if self.checkpoint is not None:
            self.checkpoint.save({"stage": self.name, "kind": "finished", "loop": self._loop_state(), "rng": None,
                                  "model": None, "own": None})

    def save_at(self, update: int, pending: list | None) -> None:
        """A mid-stretch checkpoint before ``update`` (``Stretch.save``)."""
        self.loop.update, self.loop.pending = update, pending
        self.save("mid", mid=self.mid_apart)
