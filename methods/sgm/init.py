"""Data-driven initialisation of new output rows (SGM, Harun & Kanan 2024, Sec. 4, eq. 5).

At session start (after the harness has grown the head, before the optimizer is built), each new
class k's output row becomes w_k = (1/V) sum_j h_j / ||h_j||, the mean of the L2-normalised
penultimate embeddings (``model.embed``) of class k's training samples in the session; its bias is
left as it is. The embeddings are taken in eval mode (BatchNorm running statistics, nothing
updated) and every sample forwarded is counted in ``ctx.counters["init_forward_samples"]`` so FLOP
accounting can charge the pass.

Online protocols (``training.updates: per_sample``) deliver a session one sample at a time, so the
session's samples are not there at its start: reading them then would use the future. With ``when:
auto`` (default) such a protocol initialises a class's row at the class's first arrival instead, just
before the update that first trains on it, from the samples of that class that have arrived by then
(the arriving ones in that batch; ``centre: session`` centres on them too); ``when: session_start``
forces the session-start reading (what the published code does for its batch sessions, and a peek
at the future online), ``when: first_arrival`` forces the online reading.

``centre: none, scale: unit`` (the Config defaults) is exactly that. Two deviations are available
because the literal rule misbehaves on backbones whose penultimate features are non-negative and
sparse (EfficientNet-Lite: ReLU6 then global pooling): the row lies in the positive orthant along the
features, so it fires on *every* input, old classes included, and louder than the trained rows
(tiny_cil, deployed model: +15.0 on its own class vs +8.3 for a trained row; +2.5 on old-class
inputs where trained rows give -3.7; 13 % of old test inputs flip to a new class at update 0).

- ``centre: session`` subtracts the session's mean embedding m before normalising,
  w_k = mean_j (h_j - m)/||h_j - m||, so the rows point along what tells the new classes apart rather
  than along what all inputs share.
- ``scale: logit`` rescales the new rows by one common factor s so that their mean logit on their own
  class's session samples equals the old rows' mean logit on their own class's samples, measured on
  up to ``calibration_per_class`` stored samples per old class taken from the rehearsal memory in
  stored order (no random draw; these forwards are counted too). Norm matching would be the wrong
  yardstick: the literal rows are aligned with the (sparse, non-negative) embeddings while trained
  rows are not, so a literal row fires about twice as loud as a trained row with a larger norm.
  ``scale: unit`` keeps the paper's mean of unit vectors (norm <= 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel
from torch import Tensor

from ...harness.data.stream import Session
from ..base import Modifier, StandardMethod, TrainBatch
from ..configs import InitConfig


def class_mean_rows(embeddings: Tensor, labels: Tensor, classes: list[int] | Tensor,
                    centre: Tensor | None = None) -> Tensor:
    """One row per class: the mean of its (optionally centred) L2-normalised embeddings (eq. 5)."""
    h = embeddings if centre is None else embeddings - centre
    h = F.normalize(h, dim=1)
    rows = []
    for k in classes:
        mask = labels == int(k)
        if not bool(mask.any()):
            raise ValueError(f"no embedding of class {int(k)} to initialise its output row from")
        rows.append(h[mask].mean(0))
    return torch.stack(rows)


class DataDrivenInit(Modifier):
    name = "init"
    summary = "Data-driven output init: new rows = mean of L2-normalised embeddings of the class; bias kept."
    Config = InitConfig
    config: InitConfig

    def __init__(self, config: BaseModel | None = None) -> None:
        super().__init__(config)
        self.pending: set[int] = set()  # new classes of the session whose row waits for a first arrival

    def online(self, method: StandardMethod) -> bool:
        if self.config.when == "auto":
            return method.ctx.protocol.training.online
        return self.config.when == "first_arrival"

    def begin_session(self, method: StandardMethod, session: Session) -> None:
        new = [int(k) for k in session.new_classes]
        if not new:
            return
        if self.online(method):
            self.pending = set(new)
            return
        labels = method.ctx.stream.train.labels[session.train_ids]
        ids = session.train_ids[np.isin(labels, new)]
        if self.config.centre == "session":
            ids = session.train_ids  # the centre is the mean over all of the session's samples
        self.write_rows(method, ids, new)

    def before_update(self, method: StandardMethod, batch: TrainBatch) -> None:
        """Online: rows of classes arriving for the first time, from their arrived samples in ``batch``."""
        if not self.pending:
            return
        arriving, labels = batch.host_is_new(), batch.host_labels()
        first = sorted({int(c) for c in labels[arriving]} & self.pending)
        if not first:
            return
        ids = np.asarray(batch.ids, dtype=np.int64)[arriving]
        if self.config.centre != "session":
            ids = ids[np.isin(labels[arriving], first)]
        self.write_rows(method, ids, first)
        self.pending -= set(first)

    def write_rows(self, method: StandardMethod, ids: np.ndarray, new: list[int]) -> None:
        """Rows of classes ``new`` from the samples ``ids`` (which hold every class in ``new``)."""
        model, ctx = method.model, method.ctx
        embeddings = self.embed(method, ids)
        y = torch.as_tensor(ctx.stream.train.labels[ids], device=embeddings.device)
        centre = embeddings.mean(0) if self.config.centre == "session" else None
        rows = class_mean_rows(embeddings, y, new, centre)
        fc = model.head.fc
        if self.config.scale == "logit":
            rows = rows * self.logit_scale(method, embeddings, y, rows, new)
        with torch.no_grad():
            fc.weight[new] = rows.to(fc.weight.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"pending": sorted(self.pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = set((state or {}).get("pending", []))

    def logit_scale(self, method: StandardMethod, embeddings: Tensor, y: Tensor, rows: Tensor,
                    new: list[int]) -> float:
        """s with mean_j(s w_yj . h_j + b_yj) over new samples = mean own-class logit of old rows on memory."""
        fc, ctx = method.model.head.fc, method.ctx
        mem = np.asarray(getattr(ctx.memory, "ids", []), dtype=np.int64)
        mem_labels = ctx.stream.train.labels[mem] if len(mem) else np.empty(0, dtype=np.int64)
        keep = np.isin(mem_labels, new, invert=True)
        mem, mem_labels = mem[keep], mem_labels[keep]
        picked = np.concatenate([mem[mem_labels == c][: self.config.calibration_per_class]
                                 for c in np.unique(mem_labels)]) if len(mem) else mem
        if not len(picked):
            return 1.0  # nothing to calibrate against (no memory): the paper's rows
        h_old = self.embed(method, picked)
        y_old = torch.as_tensor(ctx.stream.train.labels[picked], device=h_old.device)
        with torch.no_grad():
            w, b = fc.weight.detach().float(), fc.bias.detach().float()
            ref = ((h_old * w[y_old]).sum(1) + b[y_old]).mean()
            index = {k: i for i, k in enumerate(new)}
            is_new = torch.as_tensor([int(k) in index for k in y.tolist()], device=y.device)
            h_new, y_new = embeddings[is_new], y[is_new]
            local = torch.as_tensor([index[int(k)] for k in y_new.tolist()], device=rows.device)
            cur = (h_new * rows[local]).sum(1).mean()
            s = (ref - b[y_new].mean()) / cur
        return float(s) if float(cur) > 0 and float(s) > 0 else 1.0

    def embed(self, method: StandardMethod, ids: np.ndarray) -> Tensor:
        model, ctx = method.model, method.ctx
        was_training = model.training
        model.eval()
        out = []
        # whether the stored inputs are trunk features is the store's to say: REMIND's step marks the
        # model as fed features (its reconstructions) while it runs, whatever the store holds
        cached = getattr(ctx.inputs, "cached", model.trunk_cached)
        try:
            with torch.no_grad():
                for i in range(0, len(ids), self.config.batch_size):
                    x = ctx.inputs.get(ids[i : i + self.config.batch_size])
                    out.append(model.body(x if cached else model.trunk(x)).float())
        finally:
            model.train(was_training)
        ctx.counters["init_forward_samples"] = ctx.counters.get("init_forward_samples", 0) + len(ids)
        return torch.cat(out)
