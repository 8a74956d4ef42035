"""Dark Experience Replay++ (Buzzega et al., NeurIPS 2020) as in the paper (Harun & Kanan 2024, Sec. 5.2).

Each update trains on the batch the harness draws (session samples + memory samples, the protocol's
composition, so the compute is exactly vanilla rehearsal's) with::

    loss = CE(new) + alpha * MSE(z_old, stored logits) + beta * CE(old)      alpha = 0.1, beta = 0.9

where ``z_old`` are the current logits of the memory samples and the stored logits are those the
sample had when it was first seen: for a session sample, the (detached) logits of the training
forward of the first update it arrived in (no extra compute); for a sample that enters the memory
without having been trained on by this method (the pre-training data the protocol stores, or a
session sample no update happened to draw), one eval-mode forward when it enters, declared in
``ctx.counters["derpp_logit_forward_samples"]``. Mammoth's DER++ draws two separate memory batches
for the two terms; here both use the one memory draw of the protocol's batch, so DER++ never
trains on more samples than the budget allows.

Grown head: logits stored before the head grew are shorter than the current ones. They are padded
on the right (``pad_logits: zero``, default: the new classes' logits are pulled towards 0 on old
samples) or the MSE is taken over the stored columns only (``pad_logits: none``).

Storage: a stored sample costs the raw sample plus its logits (float32), which ``sample_bytes``
reports; the cap itself is counted in samples, as in the paper. Logits of samples that left the
memory are dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..harness.stream import Session
from .base import StandardMethod, TrainBatch
from .configs import DERppConfig

LOGIT_BYTES = 4  # float32


def recount_memory_bytes(memory) -> None:
    """Re-evaluate the bytes of what the memory holds (the harness stores pre-training samples before
    ``setup``, when a method's ``sample_bytes`` cannot know its own storage format yet)."""
    memory.recount_bytes()


class DERpp(StandardMethod):
    name = "derpp"
    summary = "DER++: rehearsal + MSE to the logits stored when a sample was first seen (alpha 0.1) + CE on memory (beta 0.9)."
    Config = DERppConfig

    def __init__(self, config, modifiers=None) -> None:
        super().__init__(config, modifiers)
        self.logits: dict[int, np.ndarray] = {}

    def setup(self, model, ctx) -> None:
        super().setup(model, ctx)
        self.logits = {}
        self.record_on_entry(np.asarray(ctx.memory.ids, dtype=np.int64))
        recount_memory_bytes(ctx.memory)

    # -- stored logits -------------------------------------------------------------------------
    def record_on_entry(self, ids: np.ndarray) -> None:
        """Eval-mode logits for samples that have none yet (they enter the memory unseen)."""
        ids = np.asarray([g for g in ids if int(g) not in self.logits], dtype=np.int64)
        if len(ids) == 0:
            return
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for i in range(0, len(ids), self.config.logit_batch_size):
                    chunk = ids[i : i + self.config.logit_batch_size]
                    z = self.model(self.ctx.inputs.get(chunk)).float().cpu().numpy()
                    for gid, row in zip(chunk, z):
                        self.logits[int(gid)] = row
        finally:
            self.model.train(was_training)
        self.ctx.counters["derpp_logit_forward_samples"] = (
            self.ctx.counters.get("derpp_logit_forward_samples", 0) + len(ids))

    def stored(self, ids: np.ndarray, width: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """Stored logits padded to ``width`` columns, and a mask of the columns that were stored."""
        out = torch.zeros(len(ids), width, device=device)
        mask = torch.zeros(len(ids), width, dtype=torch.bool, device=device)
        for r, gid in enumerate(ids):
            row = self.logits.get(int(gid))
            if row is None:  # cannot happen through the harness; treat as "no target" rather than guess
                continue
            k = min(len(row), width)
            out[r, :k] = torch.from_numpy(row[:k]).to(device)
            mask[r, :k] = True
        if self.config.pad_logits == "zero":
            has = mask.any(1, keepdim=True)
            mask = has.expand_as(mask).clone()
        return out, mask

    def sample_bytes(self, gid: int) -> int | None:
        ctx = getattr(self, "ctx", None)
        if ctx is None:
            return None
        row = self.logits.get(int(gid))
        return int(ctx.stream.train.sample_bytes(int(gid))) + (0 if row is None else LOGIT_BYTES * len(row))

    # -- the step ------------------------------------------------------------------------------
    def loss(self, batch: TrainBatch, logits: Tensor, targets: Tensor) -> Tensor:
        new, old = batch.is_new, ~batch.is_new
        ids = np.asarray(batch.ids)
        # first sight of a session sample: keep the logits of this very forward (no extra compute)
        new_ids = ids[new.cpu().numpy()]
        fresh = [r for r, g in enumerate(new_ids) if int(g) not in self.logits]
        if fresh:
            z_new = logits[new].detach().float().cpu().numpy()
            for r in fresh:
                self.logits[int(new_ids[r])] = z_new[r].copy()
        loss = F.cross_entropy(logits[new], targets[new]) if bool(new.any()) else logits.new_zeros(())
        if bool(old.any()):
            z_old = logits[old].float()
            if self.config.beta:
                loss = loss + self.config.beta * F.cross_entropy(logits[old], targets[old])
            if self.config.alpha:
                ref, mask = self.stored(ids[old.cpu().numpy()], z_old.shape[1], z_old.device)
                if bool(mask.any()):
                    loss = loss + self.config.alpha * ((z_old - ref) ** 2)[mask].mean()
        return loss

    def end_session(self, session: Session) -> None:
        super().end_session(session)
        # session samples no update drew enter the memory now (offline protocols): logits on entry
        self.record_on_entry(session.train_ids)

    def begin_session(self, session: Session) -> None:
        keep = set(int(g) for g in self.ctx.memory.ids)
        self.logits = {g: z for g, z in self.logits.items() if g in keep}
        super().begin_session(session)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["derpp_logits"] = {g: z.copy() for g, z in self.logits.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.logits = {int(g): np.asarray(z) for g, z in state.get("derpp_logits", {}).items()}
