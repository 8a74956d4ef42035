"""ER-ACE as a bench plugin: asymmetric cross-entropy for replay (Caccia et al., "New Insights on
Reducing Abrupt Representation Change in Online Continual Learning", ICLR 2022).

The session's new samples (``batch.is_new``) are scored only against the classes present among them
(``mask: batch``) or among the session's classes (``mask: session``), so learning them does not push
the old classes' logits down; replayed samples get the usual cross-entropy over every class seen so far
(the head's outputs, in introduction order). It subclasses ``StandardMethod`` and only changes the
loss, so ``er_ace+sgm`` works: SGM's soft targets arrive as a probability vector, and their mass on a
masked class is dropped and the rest renormalised (a target on a logit of -inf would make the loss inf).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from bench_stability_gap.methods.base import MethodConfig, StandardMethod, TrainBatch


class ERACEConfig(MethodConfig):
    mask: Literal["batch", "session"] = Field(
        "batch", description="classes a new sample competes with: those in the batch's new part, or the session's")


def masked_cross_entropy(logits: Tensor, targets: Tensor, allowed: Tensor) -> Tensor:
    """Per-sample cross-entropy over the ``allowed`` classes only; ``targets`` are class indices or
    probability vectors (renormalised over ``allowed``)."""
    t = targets if targets.is_floating_point() else F.one_hot(targets, logits.shape[1]).to(logits.dtype)
    t = t * allowed
    t = t / t.sum(1, keepdim=True).clamp_min(torch.finfo(t.dtype).tiny)
    log_p = F.log_softmax(logits.masked_fill(~allowed, float("-inf")), dim=1)
    return -(t * log_p.masked_fill(~allowed, 0.0)).sum(1)


class ERACE(StandardMethod):
    name = "er_ace"
    summary = "Example plugin: ER-ACE, new samples compete only with their own classes, replay uses full CE."
    Config = ERACEConfig

    def begin_session(self, session) -> None:
        self.session_classes = torch.as_tensor(session.classes)
        super().begin_session(session)

    def loss(self, batch: TrainBatch, logits: Tensor, targets: Tensor) -> Tensor:
        new = batch.is_new
        per_sample = logits.new_zeros(len(logits))
        if bool(new.any()):
            allowed = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
            present = batch.y[new] if self.config.mask == "batch" else self.session_classes.to(logits.device)
            allowed[present] = True
            per_sample[new] = masked_cross_entropy(logits[new], targets[new], allowed.expand(int(new.sum()), -1))
        old = ~new
        if bool(old.any()):
            everything = torch.ones_like(logits[old], dtype=torch.bool)
            per_sample[old] = masked_cross_entropy(logits[old], targets[old], everything)
        return per_sample.mean()
