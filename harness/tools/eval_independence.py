"""Evaluation on other test images, for the check that evaluation teaches a method nothing, whatever the
route: the run is made again with every test image it is shown replaced by another test image, and a fair
method trains exactly as before.

The eval copy and its checks (``run.isolation``) catch what a method keeps through what it is lent; code
that leaves test data where no check looks (another package's module, an object found through the garbage
collector) escapes them. A method trains deterministically (``bench check-method`` checks that too), so
training losses or a final state that differ once the test images differ mean test data reached training."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ...methods.registry import build_method
from ..data.inputs import InputStore
from ..results.curves import SessionCurve
from ..run.continual import run_cl
from ..run.options import RunOptions
from ..run.referee import breach
from ..run.workbench import Workbench
from .state_compare import same_state


class OtherTestImages:
    """The eval store with each labelled test id read as another labelled test sample's (a fixed permutation:
    the store holds the labelled ones only): the labels and every count stay the same, the images predict
    sees do not."""

    def __init__(self, store: InputStore, seed: int) -> None:
        self._store = store
        labelled = np.flatnonzero(store.catalog.labels >= 0)
        self._other = np.arange(len(store.catalog))
        self._other[labelled] = np.random.default_rng([seed, 7]).permutation(labelled)

    def get(self, ids: np.ndarray) -> Any:
        return self._store.get(self._other[np.asarray(ids, dtype=np.int64)])

    def read_ahead(self, batches: Sequence[np.ndarray]) -> None:
        self._store.read_ahead([self._other[np.asarray(b, dtype=np.int64)] for b in batches])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def check_eval_independence(bench: Workbench, text: str, overrides: dict[str, object], trained: Any,
                            curves: list[SessionCurve], seed: int, options: RunOptions) -> str:
    """``trained`` (the method after its run on ``bench``, which gave ``curves``) against the same run with its
    evaluations shown other test images: the same training losses and final state, or a BenchError."""
    _, other = build_method(text, bench.protocol, overrides)
    shown = dataclasses.replace(bench, test_inputs=cast(InputStore, OtherTestImages(bench.test_inputs, seed)))
    other_curves, _, _ = run_cl(shown, other, seed, options)
    if [c.loss for c in other_curves] != [c.loss for c in curves] or \
            not same_state(other.state_dict(), trained.state_dict()):
        raise breach("eval_independence", f"Method {trained.name!r}: evaluated on other test images, it trained "
                                          f"differently (its training losses or its final state differ from the "
                                          f"run evaluated on the protocol's own).")
    return "evaluated on other test images, it trained exactly the same"
