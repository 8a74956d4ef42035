"""ER-ACE: experience replay with the asymmetric cross-entropy (Caccia et al., "New Insights on Reducing
Abrupt Representation Change in Online Continual Learning", ICLR 2022, Sec. 4, eq. 4-5).

For a batch of incoming samples B_in and replayed samples B_bf (paper, eq. 5)::

    L_ACE = L_CE(B_in; classes C_curr) + L_CE(B_bf; classes C_old u C_curr)

    L_CE(B; C) = -(1/|B|) sum_{(x,y) in B} log( exp(z_y(x)) / sum_{c in C} exp(z_c(x)) )      (eq. 4)

C_curr is the set of classes present in the incoming batch (``mask: batch``, the paper's reading), or
the classes of the whole session (``mask: session``, a switch); C_old u C_curr is every class seen so
far, the head's outputs in introduction order. New samples therefore never push the old classes'
logits down, which is what the paper credits for the smaller drop at task boundaries.

Which units a replayed sample competes with matters only where the head holds units of classes not seen
yet (``backbone.head_units: full``, the published ConvNeXtV2 models' head of every class from the
start; a grown head holds the seen classes only). ``replay_classes: seen`` (the default) is eq. 5's
C_old u C_curr: the units of classes not seen yet are masked out of the replayed samples' softmax.
``replay_classes: all`` runs it over every head unit, as Mammoth's ``er_ace`` (aimagelab/mammoth,
``models/er_ace.py``: an unmasked cross-entropy on the buffer's logits, its head holding every class
from the start) does, which pushes the unseen units down through every replayed sample.

bench computes one mean over the batch's samples (new and replayed together, each scored under its own
mask), which equals eq. 5's two means scaled by the batch's new/old shares; at the protocols' equal
halves (``batch: {new: B, old: B}``) it is eq. 5 divided by two, the same optimum and the same relative
weights. It subclasses the standard step and changes only the loss, so ``er_ace+sgm`` works: SGM's soft
targets arrive as a probability vector, and their mass on a masked class is dropped and the rest
renormalised (a target on a logit of -inf would make the loss infinite).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..harness.data.stream import Session
from .base import StandardMethod, TrainBatch
from .configs import ERACEConfig


def masked_cross_entropy(logits: Tensor, targets: Tensor, allowed: Tensor) -> Tensor:
    """Per-sample cross-entropy over the ``allowed`` classes only (eq. 4 with C = allowed); ``targets``
    are class indices or probability vectors (renormalised over ``allowed``)."""
    t = targets if targets.is_floating_point() else F.one_hot(targets, logits.shape[1]).to(logits.dtype)
    t = t * allowed
    t = t / t.sum(1, keepdim=True).clamp_min(torch.finfo(t.dtype).tiny)
    log_p = F.log_softmax(logits.masked_fill(~allowed, float("-inf")), dim=1)
    return -(t * log_p.masked_fill(~allowed, 0.0)).sum(1)


class ERACE(StandardMethod):
    name = "er_ace"
    summary = ("ER-ACE: replay; new samples compete only with the classes in their batch, replayed ones with every "
               "seen class.")
    Config = ERACEConfig
    config: ERACEConfig

    seen_units: int | None = None  # head units of the classes seen so far (labels 0..n-1); None: every unit

    def begin_session(self, session: Session) -> None:
        self.session_classes = torch.tensor(session.classes)  # a copy: the stream's arrays are sealed
        self.seen_units = int(session.seen_classes)
        super().begin_session(session)

    def loss_terms(self, batch: TrainBatch, logits: Tensor, targets: Tensor) -> dict[str, Tensor]:
        """One term, ``asymmetric_cross_entropy`` (eq. 5), so ``check-method`` follows it through the modifiers."""
        new = batch.is_new.to(logits.device)
        per_sample = logits.new_zeros(len(logits))
        if bool(new.any()):
            allowed = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
            present = (batch.y.to(logits.device)[new] if self.config.mask == "batch"
                       else self.session_classes.to(logits.device))
            allowed[present] = True
            per_sample[new] = masked_cross_entropy(logits[new], targets[new], allowed.expand(int(new.sum()), -1))
        old = ~new
        if bool(old.any()):
            seen = torch.ones(logits.shape[1], dtype=torch.bool, device=logits.device)
            if self.config.replay_classes == "seen" and self.seen_units is not None:
                seen[self.seen_units:] = False  # units of classes not seen yet: outside C_old u C_curr
            per_sample[old] = masked_cross_entropy(logits[old], targets[old], seen.expand(int(old.sum()), -1))
        return {"asymmetric_cross_entropy": per_sample.mean()}
