"""EWC (Kirkpatrick et al. 2017), as a plugin author would first write it: a quadratic penalty that
keeps each parameter near its value in the deployed model, weighted by a diagonal Fisher estimated on
pre-training samples, anchored by parameter name and, for the head, to the pre-training classes' rows.

Alone it works. Under ``+sgm`` it is inert: LoRA wraps the body's 1x1 convolutions (``fc1.weight`` becomes
``fc1.base_layer.weight``, no longer in the anchors) and freezes every other body parameter, and
old-class freezing zeroes the gradient of the anchored head rows, so the penalty reaches nothing that
trains. ``bench check-method ewc_fixture+sgm`` says so (docs/writing-a-method.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from bench_stability_gap.methods.base import MethodConfig, StandardMethod

FISHER_SAMPLES = 32


class EWCConfig(MethodConfig):
    weight: float = Field(1000.0, ge=0, description="strength of the quadratic penalty (lambda)")


class EWCFixture(StandardMethod):
    name = "ewc_fixture"
    summary = "Fixture: EWC anchored to the deployed model by parameter name (inert under +sgm)."
    Config = EWCConfig

    def setup(self, model, ctx):
        super().setup(model, ctx)
        ids = ctx.stream.pretrain_ids[:FISHER_SAMPLES]  # S1 is lent until the first session begins
        x = ctx.inputs.get(ids)
        y = torch.as_tensor(ctx.stream.train.labels[ids], device=ctx.device)
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        self.anchors = {n: (p.detach().clone(), p.grad.detach() ** 2 if p.grad is not None else torch.zeros_like(p))
                        for n, p in model.named_parameters() if p.requires_grad}
        model.zero_grad(set_to_none=True)

    def penalty(self) -> torch.Tensor:
        total = torch.zeros((), device=self.ctx.device)
        for n, p in self.model.named_parameters():
            if n not in self.anchors:
                continue  # a parameter made after setup (a LoRA adapter, a renamed weight): no anchor
            anchor, fisher = self.anchors[n]
            rows = anchor.shape[0]  # the head grows: only the rows that existed at setup are anchored
            total = total + (fisher * (p[:rows] - anchor) ** 2).sum()
        return self.config.weight * total

    def loss_terms(self, batch, logits, targets):
        return {"cross_entropy": F.cross_entropy(logits, targets), "ewc_penalty": self.penalty()}

    def state_dict(self):
        return {**super().state_dict(), "anchors": self.anchors}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.anchors = state["anchors"]
