"""The nearest-mean-classifier head (Łapacz et al., "Exploring the Stability Gap in Continual Learning:
The Role of the Classification Head", WACV 2025), as the modifier ``+nmc``.

Training is the base method's, linear head included (its cross-entropy is what trains the body); only
prediction changes. With h(x) the body's penultimate features (``model.embed``) and phi = h/||h||,
each class c seen so far gets a prototype from the samples of c the method holds (iCaRL's NMC, Rebuffi
et al., CVPR 2017, Alg. 2, which Łapacz et al. use)::

    mu_c = normalise( (1/|X_c|) sum_{x in X_c} phi(x) ),      score_c(x) = -|| phi(x) - mu_c ||^2

and the prediction is argmax_c score_c(x), i.e. the nearest mean. X_c: the rehearsal memory's samples
of c, plus, on batch (not online) protocols, the samples of the session in progress (the data the
method may read now; online protocols add arrivals to the memory, so the memory is all there is), at
most ``per_class`` of each class, the first in id order (no random draw). A class with no sample held
scores the lowest float. Łapacz et al. find that the linear head, not the representation, causes most
of the gap: with the same training, the NMC's accuracy dips far less at task boundaries.

The means are recomputed after each update that the harness evaluates after (and at each session's
start, for the point at update 0), inside ``observe``, so their forwards are counted as training
compute, and they are part of the method's state (a resumed run predicts from the same means). Under a
compute-scheduled evaluation (``eval.tflops``) or a FLOP budget the method cannot know which updates
those are and recomputes after every update. ``ctx.counters["nmc_mean_forward_samples"]`` declares
the samples forwarded.

Refused (exit 2): a base without memory (nothing to compute the means from), a base with its own
``predict`` (REMIND predicts from reconstructed features), and the modifiers that act on the linear
head's rows the NMC head does not predict with (``init``, ``oocf``, so ``sgm`` unless its ``use``
leaves both out).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel
from torch import Tensor

from ..harness.data.stream import Session
from ..harness.errors import BenchError
from ..harness.spec.protocol import Protocol
from .base import Method, Modifier, StandardMethod
from .configs import NMCConfig
from .sgm.init import class_mean_rows

MEANS_COUNTER = "nmc_mean_forward_samples"
HEAD_MODIFIERS = ("init", "oocf")  # they act on the linear head's rows, which NMC does not predict with


def nmc_scores(features: Tensor, means: Tensor, present: Tensor) -> Tensor:
    """-||phi(x) - mu_c||^2 for every output class (rows of ``means``); classes not ``present`` (no
    sample held) get the lowest float, so they are never the nearest mean."""
    phi = F.normalize(features, dim=1)
    scores = -torch.cdist(phi, means.to(phi.dtype)) ** 2
    return scores.masked_fill(~present, torch.finfo(scores.dtype).min)


class NearestMeanHead(Modifier):
    name = "nmc"
    summary = "Nearest-mean head: predict the class whose mean normalised feature (from the held samples) is nearest."
    Config = NMCConfig
    config: NMCConfig

    def __init__(self, config: BaseModel | None = None) -> None:
        super().__init__(config)
        self.means: Tensor | None = None    # (classes, features), unit rows
        self.present: Tensor | None = None  # (classes,) bool: a sample of the class was held
        self.updates = 0

    def check_combination(self, modifiers: list[Modifier]) -> None:
        for m in modifiers:
            parts = list(getattr(m.config, "use", [])) if m.name == "sgm" else [m.name]
            clash = [p for p in parts if p in HEAD_MODIFIERS]
            if clash:
                via = "" if m.name != "sgm" else " (inside sgm; --set sgm.use=[soft,lora,onecycle] leaves them out)"
                raise BenchError(
                    f"Modifier nmc predicts from class means of the body's features, but {', '.join(clash)}{via} "
                    f"acts on the linear head's output rows, which the NMC head does not predict with: the "
                    f"combination would be reported as an SGM part it is not. Drop {' and '.join(clash)}.")

    def check_base(self, method_cls: type[Method], protocol: Protocol) -> None:
        if getattr(method_cls, "predict", None) is not StandardMethod.predict:
            raise BenchError(f"Modifier nmc replaces the head's prediction, but method {method_cls.name!r} "
                             f"predicts in its own way (its own predict()); use a base on the standard step.")
        if not method_cls.rehearsal or protocol.memory.policy == "none":
            who = (f"method {method_cls.name!r} replays nothing" if not method_cls.rehearsal
                   else f"protocol {protocol.name!r} stores nothing (memory.policy: none)")
            raise BenchError(f"Modifier nmc computes its class means from the rehearsal memory the method holds, "
                             f"but {who}; use a rehearsal method on a protocol with a memory.")

    def begin_session(self, method: StandardMethod, session: Session) -> None:
        self.updates = 0
        self._total = method.session_updates(session)
        self.refresh(method)  # the evaluation at update 0

    def after_update(self, method: StandardMethod) -> None:
        self.updates += 1
        schedule = method.ctx.protocol.eval
        known = self._total is not None and schedule.every is not None and method.ctx.planned_updates is None
        if not known or self.updates == self._total or schedule.due(self.updates):
            self.refresh(method)

    def held_ids(self, method: StandardMethod) -> np.ndarray:
        """The samples the means come from: the memory, and the session in progress on batch protocols."""
        ctx = method.ctx
        ids = np.asarray(ctx.memory.ids, dtype=np.int64)
        if not ctx.protocol.training.online:
            ids = np.concatenate([ids, np.asarray(ctx.inputs.current, dtype=np.int64)])
        ids = np.unique(ids)
        if self.config.per_class is None:
            return ids
        labels = ctx.stream.train.labels[ids]
        keep = [ids[labels == c][: self.config.per_class] for c in np.unique(labels)]
        return np.sort(np.concatenate(keep)) if keep else ids

    @torch.no_grad()
    def refresh(self, method: StandardMethod) -> None:
        """Recompute every class's mean from the samples held, in eval mode (BatchNorm untouched)."""
        model, ctx = method.model, method.ctx
        classes = model.head.num_classes
        ids = self.held_ids(method)
        ids = ids[ctx.stream.train.labels[ids] < classes]
        was = model.training
        model.eval()
        try:
            parts = [model.embed(ctx.inputs.get(ids[s : s + self.config.batch_size]))
                     for s in range(0, len(ids), self.config.batch_size)]
        finally:
            model.train(was)
        feats = torch.cat(parts) if parts else torch.zeros(0, model.head.fc.in_features, device=ctx.device)
        labels = torch.as_tensor(ctx.stream.train.labels[ids], device=feats.device)
        present = torch.zeros(classes, dtype=torch.bool, device=feats.device)
        present[labels.unique()] = True
        means = torch.zeros(classes, feats.shape[1], device=feats.device, dtype=feats.dtype)
        if len(ids):
            held = present.nonzero().flatten()
            means[held] = F.normalize(class_mean_rows(feats, labels, held), dim=1)
        self.means, self.present = means, present
        ctx.counters[MEANS_COUNTER] = ctx.counters.get(MEANS_COUNTER, 0) + len(ids)

    def predict(self, method: StandardMethod, x: Tensor) -> Tensor | None:
        if self.means is None or self.present is None:
            return None
        return nmc_scores(method.model.embed(x), self.means, self.present)

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "means": self.means, "present": self.present}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = state.get("updates", 0)
        self.means, self.present = state.get("means"), state.get("present")

