"""Learning without Forgetting (Li & Hoiem 2017) as in the paper's appendix (Harun & Kanan 2024, Table 12).

No rehearsal: every sample of a batch comes from the current session (``rehearsal = False``; the
harness fills the whole batch with new samples). At the start of each session a frozen copy of the
model (the teacher: the model as it was before the session) is kept; each update adds a
distillation term on the outputs of the classes known before the session::

    loss = CE(z, y) + lambda * KL( softmax(z_teacher[:, :K_old] / T) || softmax(z[:, :K_old] / T) )

with T = 2 and lambda = 1 (LwF's defaults). Original LwF (Li & Hoiem 2017, eq. for L_old) and the
paper's use of it do not multiply by T^2 (Hinton et al.'s gradient-scale correction); ``t2_scale:
true`` does. (KL and LwF's cross-entropy with the teacher's soft targets differ by the teacher's
entropy, a constant: the same gradients.) The teacher runs in eval mode without gradients; every
sample it forwards is declared in ``ctx.counters["teacher_forward_samples"]`` (body and head, plus the
trunk when inputs are images) so FLOP accounting charges it. The teacher is copied before any
modifier's ``begin_session`` (so before LoRA injects adapters: the teacher is plain weights). With
``+sgm`` the cross-entropy term takes SGM's soft targets; the distillation term is unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..harness.data.stream import Session
from .base import StandardMethod, TrainBatch
from .configs import LwFConfig


class LwF(StandardMethod):
    name = "lwf"
    summary = "Learning without Forgetting: no rehearsal; distils old-class outputs of the pre-session model."
    Config = LwFConfig
    config: LwFConfig
    rehearsal = False

    def setup(self, model, ctx) -> None:
        super().setup(model, ctx)
        self.teacher: torch.nn.Module | None = None
        self.n_old = 0

    def begin_session(self, session: Session) -> None:
        # The harness has grown the head already: the old classes are the rows before the new ones.
        self.n_old = session.seen_classes - len(session.new_classes)  # a full head holds unseen units too
        self.teacher = copy.deepcopy(self.model).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        super().begin_session(session)

    def distillation(self, batch: TrainBatch, logits: Tensor) -> Tensor:
        if self.teacher is None or self.n_old == 0 or self.config.distill_weight == 0:
            return logits.new_zeros(())
        with torch.no_grad():
            teacher = self.teacher(batch.x)[:, : self.n_old].float()
        self.ctx.counters["teacher_forward_samples"] = (self.ctx.counters.get("teacher_forward_samples", 0) +
                                                        len(batch.y))
        t = self.config.temperature
        student = F.log_softmax(logits[:, : self.n_old].float() / t, dim=1)
        kd = F.kl_div(student, F.log_softmax(teacher / t, dim=1), reduction="batchmean", log_target=True)
        return self.config.distill_weight * (t * t if self.config.t2_scale else 1.0) * kd

    def loss(self, batch: TrainBatch, logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits, targets) + self.distillation(batch, logits)

    def end_session(self, session: Session) -> None:
        super().end_session(session)
        self.teacher = None  # the next session's teacher is copied at its start

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["lwf"] = {"n_old": self.n_old,
                        "teacher": None if self.teacher is None else self.teacher.state_dict()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        own = state.get("lwf") or {}
        self.n_old = own.get("n_old", 0)
        if own.get("teacher") is not None:
            if self.teacher is None:  # a resumed session's begin_session made it before LoRA (+sgm) went in
                self.teacher = copy.deepcopy(self.model).eval()
            self.teacher.load_state_dict(own["teacher"])
            for p in self.teacher.parameters():
                p.requires_grad_(False)
