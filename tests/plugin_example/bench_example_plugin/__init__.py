"""An example bench method published by a third party: rehearsal with label-smoothed cross-entropy.

It subclasses ``StandardMethod`` and only changes the loss, so every modifier composes with it
(``example_replay+sgm``, ``example_replay+lora``): SGM's soft targets arrive as ``targets``.
"""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import Field

from bench_stability_gap.methods.base import MethodConfig, StandardMethod


class ExampleReplayConfig(MethodConfig):
    smoothing: float = Field(0.1, ge=0, lt=1, description="label smoothing of the cross-entropy")


class ExampleReplay(StandardMethod):
    name = "example_replay"
    summary = "Example plugin: rehearsal with label-smoothed cross-entropy (standard step, so +sgm works)."
    Config = ExampleReplayConfig

    def loss(self, batch, logits, targets):
        return F.cross_entropy(logits, targets, label_smoothing=self.config.smoothing)
