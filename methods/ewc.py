"""Elastic weight consolidation (Kirkpatrick et al., "Overcoming catastrophic forgetting in neural
networks", PNAS 2017), the regularisation baseline in which De Lange et al. (ICLR 2023) first measured
the stability gap. No rehearsal: every sample of a batch comes from the current session.

Loss (Kirkpatrick et al., eq. 3)::

    L(theta) = L_CE(theta) + sum_i (lambda / 2) F_i (theta_i - theta*_i)^2

with F the diagonal of the empirical Fisher information, F_i = mean over samples of
(d log p(y | x, theta) / d theta_i)^2 at theta* (eq. 3's F, estimated from per-sample gradients of the
true label's log-likelihood on ``fisher_samples`` samples drawn with the method's own generator).

Several tasks: the *online* reading (Schwarz et al., "Progress & Compress", ICML 2018, eq. 8; Huszár,
PNAS 2018): one anchor theta* = the parameters at the end of the latest session, and one accumulated
Fisher F <- gamma F + F_new (gamma = 1: the Fishers of every session add up, which is what Huszár shows
the Laplace approximation of the joint posterior needs). Kirkpatrick's text keeps one penalty per task;
the online form gives the same pull towards the previous solution at constant memory and compute on
long streams, which is why bench uses it (``gamma`` < 1 forgets old Fishers geometrically, as Schwarz et al.).
The first anchor and Fisher come from the deployed model on the pre-training data (S1, lent until the
first session begins); each session's end adds that session's Fisher and moves the anchor.

The penalty reads the *effective* weights: under LoRA (``+lora``, ``+sgm``) a pointwise layer's weight
is its frozen base plus the adapters' delta, so the penalty reaches the adapters that train; the
Fisher is estimated over every body and head parameter whatever trains (LoRA freezes the bases). Head
rows of classes introduced after the last anchor carry no penalty (they have no anchor). Under old-class
freezing (``oocf``) the anchored head rows get no gradient; the body's share still trains.

How this compares with the common libraries, whose lambda a user may carry over: bench's penalty
carries eq. 3's 1/2, Avalanche's ``EWCPlugin`` and Mammoth's ``ewc_on`` do not (``lambda * sum F (theta -
theta*)^2``), so bench's lambda = 100 is their 50. F here is the empirical Fisher of the *true* labels
(not of labels sampled from the model), from per-sample gradients, each squared on its own, in eval mode;
Avalanche squares minibatch-mean gradients (a smaller estimate: the cross terms of a batch average out),
and Mammoth squares per-sample gradients weighted by p(y | x).

Every Fisher sample is one forward and backward pass through body and head, counted by the harness's
meter as training compute; ``ctx.counters["ewc_fisher_samples"]`` declares how many.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..harness.data.stream import Session
from .base import Context, StandardMethod, TrainBatch
from .configs import EWCConfig

if TYPE_CHECKING:
    from ..harness.model.backbone import SplitModel

FISHER_COUNTER = "ewc_fisher_samples"


def effective_parameters(model: nn.Module) -> dict[str, Tensor]:
    """Body and head weights by their plain names (``body.5.0.conv_pw.weight``), LoRA folded in: a peft
    layer's weight is its base plus the adapters' delta, so gradients reach the adapters."""
    from .sgm.lora import ADAPTER, lora_modules

    out: dict[str, Tensor] = {}
    for prefix in ("body", "head"):
        part = getattr(model, prefix)
        for name, p in part.named_parameters():
            if "lora_" not in name:
                out[f"{prefix}.{name.replace('base_layer.', '')}"] = p
        for name, layer in lora_modules(part):
            base = layer.get_base_layer().weight
            # peft's LoRA layers (Linear, Conv2d) define get_delta_weight; their LoraLayer base does not declare it
            out[f"{prefix}.{name}.weight"] = base + layer.get_delta_weight(ADAPTER)  # type: ignore[attr-defined]
    return out


def fisher_diagonal(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """Empirical diagonal Fisher of body and head parameters: the mean over samples of each parameter's
    squared per-sample gradient of -log p(y | x), in eval mode (BatchNorm statistics untouched)."""
    params = {n: p for n, p in effective_parameters(model).items() if isinstance(p, nn.Parameter)}
    flags = {n: p.requires_grad for n, p in params.items()}
    was = model.training
    model.eval()
    sums = {n: torch.zeros_like(p) for n, p in params.items()}
    try:
        for p in params.values():
            p.requires_grad_(True)
        for i in range(len(x)):
            grads = torch.autograd.grad(F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]), list(params.values()),
                                        allow_unused=True)
            for (n, _), g in zip(params.items(), grads):
                if g is not None:
                    sums[n] += g.detach() ** 2
    finally:
        for n, p in params.items():
            p.requires_grad_(flags[n])
        model.train(was)
    return {n: s / max(len(x), 1) for n, s in sums.items()}


def ewc_penalty(current: dict[str, Tensor], anchor: dict[str, Tensor], fisher: dict[str, Tensor],
                weight: float) -> Tensor:
    """(lambda / 2) sum_i F_i (theta_i - theta*_i)^2 over the anchored names; a tensor that grew since
    (the head) is compared on its first rows, those the anchor has."""
    total: Tensor | None = None
    for name, theta_star in anchor.items():
        theta = current.get(name)
        if theta is None:
            continue
        rows = theta_star.shape[0]
        term = (fisher[name] * (theta[:rows] - theta_star) ** 2).sum()
        total = term if total is None else total + term
    if total is None:
        raise ValueError("no anchored parameter is left in the model")
    return 0.5 * weight * total


class EWC(StandardMethod):
    name = "ewc"
    summary = ("EWC (online): no rehearsal; penalty (lambda/2) sum F (theta - theta*)^2 towards the last session's "
               "weights (lambda 100 = Avalanche's and Mammoth's 50), F the empirical Fisher of the true labels, "
               "one sample at a time.")
    Config = EWCConfig
    config: EWCConfig
    rehearsal = False

    def setup(self, model: SplitModel, ctx: Context) -> None:
        super().setup(model, ctx)
        self.fisher: dict[str, Tensor] = {}
        self.anchor: dict[str, Tensor] = {}
        self.consolidate(ctx.stream.pretrain_ids)  # S1 is lent until the first session begins

    def consolidate(self, ids: np.ndarray) -> None:
        """F <- gamma F + F(ids), theta* <- the current (folded) weights."""
        n = min(self.config.fisher_samples, len(ids))
        chosen = np.sort(self.ctx.rng.choice(np.asarray(ids, dtype=np.int64), size=n, replace=False))
        x = self.ctx.inputs.get(chosen)
        y = torch.as_tensor(self.ctx.stream.train.labels[chosen], device=self.ctx.device)
        new = fisher_diagonal(self.model, x, y)
        self.ctx.counters[FISHER_COUNTER] = self.ctx.counters.get(FISHER_COUNTER, 0) + n
        for name, f in new.items():
            old = self.fisher.get(name)
            if old is not None:  # a grown head: the old Fisher covers its first rows
                f = f.clone()
                f[: old.shape[0]] += self.config.gamma * old
            self.fisher[name] = f
        self.anchor = {name: p.detach().clone() for name, p in effective_parameters(self.model).items()}

    def end_session(self, session: Session) -> None:
        super().end_session(session)  # LoRA folds first: the anchor is the weights the next session starts from
        self.consolidate(session.train_ids)

    def loss_terms(self, batch: TrainBatch, logits: Tensor, targets: Tensor) -> dict[str, Tensor]:
        penalty = ewc_penalty(effective_parameters(self.model), self.anchor, self.fisher, self.config.weight)
        return {"cross_entropy": F.cross_entropy(logits, targets), "ewc_penalty": penalty}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "ewc": {"fisher": self.fisher, "anchor": self.anchor}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        own = state["ewc"]
        self.fisher = {n: t.clone() for n, t in own["fisher"].items()}
        self.anchor = {n: t.clone() for n, t in own["anchor"].items()}
