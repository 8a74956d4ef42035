"""Dynamic soft targets (SGM, Harun & Kanan 2024, Sec. 4).

For each class k a running mean u_k of the model's softmax outputs on samples of class k is kept,
updated only when such a sample is classified correctly (the published code; ``update_on: all`` is the
text's "when an example from class k is observed"), uniform before the first update.
The target of a sample of class k predicted as y' is u_k with t[k] = 1 and, when y' != k,
t[y'] = 1/K, renormalised to sum to one. Targets of a batch are built from u as it was before the
batch (the paper's figure: u_k^i trains theta_{i+1}); the batch then updates u.

Published code (yousuf907/SGM, model_sgm.py ``soft_cross_entropy`` / ``update_soft_targets``), the
defaults: the accumulators are reset at every session start (``reset: session``), and a sample of a
class new in this session gets the *current* softmax as its base vector instead of u_k
(``new_samples: softmax``), then the same prediction -> 1/C, true class -> 1, renormalise; C is the
number of output units (bench's head holds the classes seen so far; the code's head held all 1365
from the start). ``reset: never`` with ``new_samples: running_mean`` is the paper's text (Sec. 4,
eq. 6-7: one running mean per class over the whole run).

Growing the head (``reset: never``): an existing u_k that has been updated (c_k > 0) is zero-padded for the new classes
(it already sums to one, so it stays a distribution: "class k's outputs put no mass on classes that
did not exist"); a u_k never updated (c_k = 0) is still "uniform before the first update", now
uniform over the new K. ``grow: reset`` instead resets every u_k to uniform over the new K and its
count to zero.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel
from torch import Tensor

from ...harness.data.stream import Session
from ...harness.model.device import to_device
from ..base import Modifier, StandardMethod, TrainBatch
from ..configs import SoftTargetsConfig


class SoftTargets(Modifier):
    name = "soft"
    summary = "Dynamic soft targets: per-class running mean of correct softmax outputs, true class set to 1."
    Config = SoftTargetsConfig
    config: SoftTargetsConfig

    def __init__(self, config: BaseModel | None = None) -> None:
        super().__init__(config)
        self.u = torch.empty(0, 0)                      # (K, K): row k = u_k
        self.counts = torch.empty(0, dtype=torch.long)  # c_k
        self._new_of: Session | None = None  # the session whose new classes ``_new_classes`` holds
        self._new_classes = torch.empty(0, dtype=torch.long)

    @property
    def num_classes(self) -> int:
        return self.u.shape[0]

    def grow(self, num_classes: int, device: torch.device | None = None) -> None:
        """Extend u to ``num_classes`` (see the module docstring for how existing rows extend)."""
        device = device or self.u.device
        self.u, self.counts = self.u.to(device), self.counts.to(device)
        k_old, k = self.num_classes, num_classes
        if k < k_old:
            raise ValueError(f"soft targets cannot shrink from {k_old} to {k} classes")
        if k == k_old:
            return
        uniform = torch.full((k, k), 1.0 / k, device=device)
        counts = torch.zeros(k, dtype=torch.long, device=device)
        if self.config.grow == "pad" and k_old:
            seen = self.counts > 0
            uniform[:k_old][seen] = 0.0
            uniform[:k_old, :k_old][seen] = self.u[seen]
            counts[:k_old] = self.counts
        self.u, self.counts = uniform, counts

    def begin_session(self, method: StandardMethod, session: Session) -> None:
        if self.config.reset == "session":
            self.u, self.counts = torch.empty(0, 0), torch.empty(0, dtype=torch.long)
            self.grow(method.model.head.num_classes, method.model.head.fc.weight.device)

    def build(self, probs: Tensor, y: Tensor, is_new: Tensor | None = None) -> Tensor:
        """Targets for a batch from u as it is now (does not update u). ``is_new`` marks samples of the
        session's new classes, whose base vector is their current softmax (``new_samples: softmax``).
        Rows are chosen by ``torch.where``, never by boolean-mask indexing, which waits for the device to
        count the rows: an update of SGM then never waits for the GPU."""
        k = self.num_classes
        rows = torch.arange(len(y), device=y.device)
        t = self.u[y].clone()
        if is_new is not None and self.config.new_samples == "softmax":
            t = torch.where(is_new[:, None], probs.to(t.dtype), t)
        pred = probs.argmax(1)
        # the predicted unit of a wrong prediction gets 1/K; a right one's is the true class, set to 1 next
        t[rows, pred] = torch.where(pred != y, 1.0 / k, t[rows, pred])
        t[rows, y] = 1.0
        return t / t.sum(1, keepdim=True)

    def update(self, probs: Tensor, y: Tensor) -> None:
        """u_k <- (c_k u_k + sum of the batch's correct softmax vectors of class k) / (c_k + n_k), for every
        class with n_k > 0 (the others keep u_k and c_k to the bit)."""
        correct = probs.argmax(1) == y if self.config.update_on == "correct" else torch.ones_like(y, dtype=torch.bool)
        pc = torch.where(correct[:, None], probs.to(self.u.dtype), 0.0)  # a wrong one adds exactly zero
        sums = torch.zeros_like(self.u).index_add_(0, y, pc)
        n = torch.zeros_like(self.counts).index_add_(0, y, correct.to(self.counts.dtype))
        c = self.counts.to(self.u.dtype)[:, None]
        self.u.copy_(torch.where((n > 0)[:, None], (c * self.u + sums) / (c + n.to(self.u.dtype)[:, None]), self.u))
        self.counts += n

    def targets(self, method: StandardMethod, batch: TrainBatch, logits: Tensor) -> Tensor:
        probs = logits.detach().float().softmax(1)
        self.grow(logits.shape[1], logits.device)
        if self._new_of is not method.session:  # copied to the device once a session, not once an update
            self._new_of = method.session
            self._new_classes = to_device(torch.tensor(method.session.new_classes, dtype=torch.int64),
                                          batch.y.device)
        t = self.build(probs, batch.y, torch.isin(batch.y, self._new_classes))  # by class, as the code's mask
        self.update(probs, batch.y)
        return t.to(logits.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"u": self.u.detach().cpu().clone(), "counts": self.counts.detach().cpu().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.u, self.counts = state["u"].clone(), state["counts"].clone()
