"""An example method with its own training step: plain SGD on the output layer only.

It implements the ``Method`` contract directly (one optimizer step per ``observe``), so it does not
use the standard step and modifiers cannot hook into it: ``example_head_sgd+sgm`` is a clear error.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from bench_stability_gap.methods.base import Method, StepStats


class HeadSGDConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(0.01, gt=0)


class HeadSGD(Method):
    name = "example_head_sgd"
    summary = "Example plugin: SGD on the output layer with its own step (no modifiers)."
    Config = HeadSGDConfig

    def setup(self, model, ctx) -> None:
        self.model, self.ctx = model, ctx
        for p in model.body.parameters():
            p.requires_grad_(False)

    def begin_session(self, session) -> None:
        # the harness grew the head before this call: optimise its current parameters
        self.optimizer = torch.optim.SGD(self.model.head.parameters(), lr=self.config.lr)

    def observe(self, batch) -> StepStats:
        self.model.train()
        loss = F.cross_entropy(self.model(batch.x), batch.y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return StepStats(loss=float(loss.detach()))

    def predict(self, x):
        return self.model(x)
