"""Per-sample predictions of every eval point, for error analysis (``bench run --save-predictions``).

The recorder is an ``on_eval`` callback (``RunOptions``): the training loop hands it each eval point's
``Accuracies``, which carry the test ids, predicted and true classes behind the numbers. ``save`` writes
one compressed npz next to the result JSON (``<result>.predictions.npz``), concatenated over eval points:

- ``session``, ``update``: one entry per eval point, in order;
- ``offsets``: eval point p's samples are ``[offsets[p], offsets[p + 1])`` of the arrays below;
- ``test_id`` (index into the protocol's test set), ``predicted``, ``label``: one entry per sample.

A resumed run evaluated its earlier points in the process that was stopped, so only the points after
the restart are recorded; ``missing`` lists the (session, update) points of the result that are absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from ..atomic import atomic_write

RETRAIN = ("Running the same command again trains a new run (it does not resume this one, which is complete); "
           "do that, after freeing space, only if the predictions are needed.")

if TYPE_CHECKING:
    from .evaluation import Accuracies

EvalCallback = Callable[[int, int, "Accuracies"], None]


def chain(callbacks: Iterable[EvalCallback | None]) -> EvalCallback | None:
    """One ``on_eval`` that calls each given callback in order (None when there are none)."""
    live = [c for c in callbacks if c is not None]
    if not live:
        return None

    def call(session: int, update: int, acc: Accuracies) -> None:
        for c in live:
            c(session, update, acc)
    return call


class PredictionRecorder:
    """Collects the predictions of each eval point it is called with (see the module docstring)."""

    def __init__(self) -> None:
        self.points: list[tuple[int, int]] = []
        self._ids: list[np.ndarray] = []
        self._predicted: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []

    def eval_point(self, session: int, update: int, acc: Accuracies) -> None:
        if acc.predicted is None:
            raise ValueError("this evaluation carries no per-sample predictions")
        self.points.append((session, update))
        self._ids.append(np.asarray(acc.ids, dtype=np.int64))
        self._predicted.append(np.asarray(acc.predicted, dtype=np.int32))
        self._labels.append(np.asarray(acc.labels, dtype=np.int32))

    def save(self, result_json: Path, expected: Iterable[tuple[int, int]] = ()) -> Path:
        """Write the npz beside ``result_json``; ``expected``: the result's eval points (for ``missing``)."""
        path = result_json.with_name(result_json.stem + ".predictions.npz")
        sizes = [len(x) for x in self._ids]
        missing = [p for p in expected if p not in set(self.points)]
        kept = (f"The run's result is stored in {result_json}; only its predictions are not (they were held in "
                f"memory, and no half-written file is left).")
        atomic_write(path, lambda fh: np.savez_compressed(
            fh,
            session=np.array([s for s, _ in self.points], dtype=np.int32),
            update=np.array([u for _, u in self.points], dtype=np.int64),
            offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            test_id=np.concatenate(self._ids) if sizes else np.zeros(0, np.int64),
            predicted=np.concatenate(self._predicted) if sizes else np.zeros(0, np.int32),
            label=np.concatenate(self._labels) if sizes else np.zeros(0, np.int32),
            missing=np.array(missing, dtype=np.int64).reshape(-1, 2),
        ), what=f"the per-sample predictions of {len(self.points)} eval point(s)", kept=kept, then=RETRAIN)
        return path


class PointPredictions(TypedDict):
    """One eval point's predictions, as ``load_predictions`` reads them."""

    session: int
    update: int
    test_id: np.ndarray
    predicted: np.ndarray
    label: np.ndarray


def load_predictions(path: Path) -> list[PointPredictions]:
    """The npz as one dict per eval point: session, update, test_id, predicted, label."""
    with np.load(path) as z:
        off = z["offsets"]
        return [{"session": int(z["session"][p]), "update": int(z["update"][p]),
                 "test_id": z["test_id"][off[p]:off[p + 1]], "predicted": z["predicted"][off[p]:off[p + 1]],
                 "label": z["label"][off[p]:off[p + 1]]} for p in range(len(z["session"]))]
