"""Dark Experience Replay++ (Buzzega et al., NeurIPS 2020) as in the paper (Harun & Kanan 2024, Sec. 5.2).

Each update trains on the batch the harness draws (session samples + memory samples, the protocol's
composition, so the compute is exactly vanilla rehearsal's) with::

    loss = CE(new) + alpha * MSE(z_old, stored logits) + beta * CE(old)      alpha = 0.1, beta = 0.9

where ``z_old`` are the current logits of the memory samples and the stored logits are those the
sample had when it was first seen: for a session sample, the (detached) logits of the training
forward of the first update it arrived in (no extra compute); for a session sample no update
happened to draw, one eval-mode forward when it enters the memory at the session's end; for the
pre-training data the protocol stores (never trained on in the stream), the deployed model's
eval-mode logits. Those are computed when the sample is first replayed (``pretrain_logits:
on_replay``, default), from a frozen copy of the model as it was at ``setup``: the values the
setup pass (``at_setup``) gives, at a cost proportional to what is replayed rather than to the
whole pre-training set (1.28 M forwards for ImageNet). Every such forward is declared in
``ctx.counters["derpp_logit_forward_samples"]``. Mammoth's DER++ draws two separate memory batches
for the two terms; here both use the one memory draw of the protocol's batch, so DER++ never
trains on more samples than the budget allows.

Grown head: logits stored before the head grew are shorter than the current ones. They are padded
on the right (``pad_logits: zero``, default: the new classes' logits are pulled towards 0 on old
samples) or the MSE is taken over the stored columns only (``pad_logits: none``).

Storage: a stored sample costs the raw sample plus its logits (float32) once they are stored, which
``sample_bytes`` reports (a pre-training sample not yet replayed costs the raw sample: its logits
are a function of the deployed model, which is kept once); the cap itself is counted in samples, as
in the paper. Logits live in a ``LogitStore`` (float32 blocks, rows reused), not one array per
sample; those of samples that left the memory are dropped.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..harness.data.stream import Session
from .base import StandardMethod, TrainBatch
from .configs import DERppConfig

LOGIT_BYTES = 4  # float32


class LogitStore:
    """Stored logits by global sample id: float32 rows in fixed-size blocks and an id -> row map,
    instead of millions of small arrays. It grows one block at a time, so what is stored is never
    copied and at most one block stands empty (doubling one tensor left up to half of it empty and
    held old and new at once: 1.1 GB for cil_places_lt's 75k rows of 1365). Freed rows are reused;
    a row remembers how many columns were stored (the head grows)."""

    def __init__(self, n_ids: int, width: int, block_rows: int = 4096) -> None:
        self.row_of = np.full(n_ids, -1, dtype=np.int64)
        self.width, self.block_rows = width, block_rows
        self.blocks: list[Tensor] = []
        self.lengths = np.zeros(0, dtype=np.int64)
        self.free: list[int] = []

    def __len__(self) -> int:
        return int((self.row_of >= 0).sum())

    def __contains__(self, gid: int) -> bool:
        return bool(self.row_of[int(gid)] >= 0)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.blocks)

    def missing(self, ids: np.ndarray) -> np.ndarray:
        """The ids (first occurrence, in order) that have no stored logits."""
        ids = np.asarray(ids, dtype=np.int64)
        _, first = np.unique(ids, return_index=True)
        ids = ids[np.sort(first)]
        return ids[self.row_of[ids] < 0]

    def _rows(self, n: int) -> np.ndarray:
        """``n`` free rows (freed ones first), adding blocks when too few are free."""
        while len(self.free) < n:
            cap = len(self.lengths)
            self.blocks.append(torch.zeros(self.block_rows, self.width))
            self.lengths = np.concatenate([self.lengths, np.zeros(self.block_rows, dtype=np.int64)])
            self.free = list(range(cap + self.block_rows - 1, cap - 1, -1)) + self.free
        return np.asarray([self.free.pop() for _ in range(n)], dtype=np.int64)

    def _by_block(self, rows: np.ndarray) -> Iterator[tuple[Tensor, np.ndarray, np.ndarray]]:
        """(block, positions in ``rows``, offsets in the block) for each block ``rows`` touch."""
        block = rows // self.block_rows
        for b in np.unique(block):
            at = np.flatnonzero(block == b)
            yield self.blocks[int(b)], at, rows[at] % self.block_rows

    def put(self, ids: np.ndarray, logits: Tensor) -> None:
        """Store ``logits`` (n x k, k <= width) for ids that have none."""
        ids = np.asarray(ids, dtype=np.int64)
        rows = self._rows(len(ids))
        self.row_of[ids] = rows
        z = logits.detach().float().cpu()
        for block, at, offset in self._by_block(rows):
            index = torch.from_numpy(offset)
            block[index] = 0.0
            block[index, : z.shape[1]] = z[torch.from_numpy(at)]
        self.lengths[rows] = z.shape[1]

    def row(self, gid: int) -> np.ndarray | None:
        r = int(self.row_of[int(gid)])
        if r < 0:
            return None
        return self.blocks[r // self.block_rows][r % self.block_rows, : self.lengths[r]].numpy()

    def length(self, gid: int) -> int:
        r = int(self.row_of[int(gid)])
        return 0 if r < 0 else int(self.lengths[r])

    def get(self, ids: np.ndarray, width: int) -> tuple[Tensor, Tensor]:
        """(n x width) stored values, zero past each row's stored columns, and the stored-column mask."""
        rows = self.row_of[np.asarray(ids, dtype=np.int64)]
        have = np.flatnonzero(rows >= 0)
        out = torch.zeros(len(rows), width)
        lengths = np.zeros(len(rows), dtype=np.int64)
        lengths[have] = self.lengths[rows[have]]
        k = min(width, self.width)
        for block, at, offset in self._by_block(rows[have]):
            out[torch.from_numpy(have[at]), :k] = block[torch.from_numpy(offset), :k]
        mask = torch.arange(width).unsqueeze(0) < torch.from_numpy(np.minimum(lengths, width)).unsqueeze(1)
        return out * mask, mask

    def keep_only(self, ids: np.ndarray) -> None:
        """Drop the logits of every id not in ``ids`` (their rows are reused)."""
        keep = np.zeros(len(self.row_of), dtype=bool)
        keep[np.asarray(ids, dtype=np.int64)] = True
        drop = np.flatnonzero((self.row_of >= 0) & ~keep)
        self.free.extend(int(r) for r in self.row_of[drop])
        self.row_of[drop] = -1

    def state_dict(self) -> dict[str, Any]:
        """The store as it is, blocks by reference (as ``nn.Module.state_dict``: serialised at once,
        a checkpoint copies nothing more)."""
        ids = np.flatnonzero(self.row_of >= 0)
        return {"ids": ids, "row": self.row_of[ids], "lengths": self.lengths, "blocks": self.blocks,
                "free": np.asarray(self.free, dtype=np.int64), "block_rows": self.block_rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copies of a stored state (as ``nn.Module.load_state_dict``: the two never share rows)."""
        self.row_of[:] = -1
        if not state:
            self.blocks, self.lengths, self.free = [], np.zeros(0, np.int64), []
            return
        self.block_rows = int(state["block_rows"])
        self.row_of[state["ids"]] = state["row"]
        self.lengths = np.array(state["lengths"], dtype=np.int64)
        self.blocks = [b.clone() for b in state["blocks"]]
        self.free = [int(r) for r in state["free"]]


def recount_memory_bytes(memory) -> None:
    """Re-evaluate the bytes of what the memory holds (the harness stores pre-training samples before
    ``setup``, when a method's ``sample_bytes`` cannot know its own storage format yet)."""
    memory.recount_bytes()


class DERpp(StandardMethod):
    name = "derpp"
    summary = ("DER++: rehearsal + MSE to the logits stored when a sample was first seen (alpha 0.1) + "
               "CE on memory (beta 0.9).")
    Config = DERppConfig
    config: DERppConfig

    def __init__(self, config, modifiers=None) -> None:
        super().__init__(config, modifiers)
        self.logits = LogitStore(0, 0)
        # frozen copy of the model at setup: the source of lazy pre-training logits
        self.deployed: torch.nn.Module | None = None

    def setup(self, model, ctx) -> None:
        super().setup(model, ctx)
        self.logits = LogitStore(len(ctx.stream.train), len(ctx.stream.class_names))
        stored = np.asarray(ctx.memory.ids, dtype=np.int64)
        if self.config.pretrain_logits == "at_setup":
            self.record_on_entry(stored)
        elif len(stored):
            self.deployed = copy.deepcopy(model).eval()  # FLOP hooks travel with the copy: its forwards count
            for p in self.deployed.parameters():
                p.requires_grad_(False)
        recount_memory_bytes(ctx.memory)

    # -- stored logits -------------------------------------------------------------------------
    def _forward_logits(self, model, ids: np.ndarray, inputs: Tensor | None = None) -> None:
        """Eval-mode logits of ``ids`` through ``model`` (on ``inputs`` when the caller holds them,
        else fetched), stored and declared."""
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for i in range(0, len(ids), self.config.logit_batch_size):
                    chunk = ids[i : i + self.config.logit_batch_size]
                    # a fresh tensor either way: a view at an offset can take other SIMD paths (1e-6 apart)
                    x = self.ctx.inputs.get(chunk) if inputs is None else inputs[i : i + len(chunk)].clone()
                    self.logits.put(chunk, model(x))
        finally:
            model.train(was_training)
        self.ctx.counters["derpp_logit_forward_samples"] = (
            self.ctx.counters.get("derpp_logit_forward_samples", 0) + len(ids))

    def record_on_entry(self, ids: np.ndarray) -> None:
        """Eval-mode logits (current model) for samples that have none yet (they enter the memory unseen)."""
        missing = self.logits.missing(ids)
        if len(missing):
            self._forward_logits(self.model, missing)

    def _replay_logits(self, ids: np.ndarray, inputs: Tensor) -> None:
        """Deployed-model logits of replayed samples that have none (pre-training data, lazily), on
        the inputs the batch already holds (no second fetch, no extra augmentation draw)."""
        if self.deployed is None:
            return
        missing = self.logits.missing(ids)
        if len(missing):
            first: dict[int, int] = {}
            for r, g in enumerate(ids):
                first.setdefault(int(g), r)
            rows = torch.tensor([first[int(g)] for g in missing], dtype=torch.long, device=inputs.device)
            self._forward_logits(self.deployed, missing, inputs.index_select(0, rows))
            # their logits are stored now: the memory's bytes grow with them
            self.ctx.memory.add_bytes(LOGIT_BYTES * sum(self.logits.length(g) for g in missing))

    def stored(self, ids: np.ndarray, width: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """Stored logits padded to ``width`` columns, and a mask of the columns that were stored."""
        out, mask = self.logits.get(ids, width)
        if self.config.pad_logits == "zero":
            mask = mask.any(1, keepdim=True).expand_as(mask).clone()
        return out.to(device), mask.to(device)

    def shared_in_eval_copy(self) -> list[object]:
        """predict reads neither the stored logits nor the deployed copy: the eval copy shares them
        instead of copying (and fingerprinting) 0.4 GB of logits at every eval point at paper scale."""
        own = [self.logits, self.deployed] if self.deployed is not None else [self.logits]
        return own + super().shared_in_eval_copy()

    def sample_bytes(self, gid: int) -> int | None:
        ctx = getattr(self, "ctx", None)
        if ctx is None:
            return None
        return int(ctx.stream.train.sample_bytes(int(gid))) + LOGIT_BYTES * self.logits.length(gid)

    # -- the step ------------------------------------------------------------------------------
    def loss(self, batch: TrainBatch, logits: Tensor, targets: Tensor) -> Tensor:
        new, old = batch.is_new, ~batch.is_new
        ids = np.asarray(batch.ids)
        # first sight of a session sample: keep the logits of this very forward (no extra compute)
        new_mask = new.cpu().numpy()
        new_ids = ids[new_mask]
        fresh = self.logits.missing(new_ids)
        if len(fresh):
            last = {int(g): r for r, g in enumerate(new_ids)}  # a sample drawn twice keeps its last row
            pick = torch.tensor([last[int(g)] for g in fresh], dtype=torch.long, device=logits.device)
            self.logits.put(fresh, logits[new].detach()[pick])
        loss = F.cross_entropy(logits[new], targets[new]) if bool(new.any()) else logits.new_zeros(())
        if bool(old.any()):
            z_old = logits[old].float()
            if self.config.beta:
                loss = loss + self.config.beta * F.cross_entropy(logits[old], targets[old])
            if self.config.alpha:
                old_ids = ids[~new_mask]
                self._replay_logits(old_ids, batch.x[old])
                ref, mask = self.stored(old_ids, z_old.shape[1], z_old.device)
                if bool(mask.any()):
                    loss = loss + self.config.alpha * ((z_old - ref) ** 2)[mask].mean()
        return loss

    def end_session(self, session: Session) -> None:
        super().end_session(session)
        # session samples no update drew enter the memory now (offline protocols): logits on entry
        self.record_on_entry(session.train_ids)

    def begin_session(self, session: Session) -> None:
        self.logits.keep_only(np.asarray(self.ctx.memory.ids, dtype=np.int64))
        super().begin_session(session)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["derpp_logits"] = self.logits.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.logits.load_state_dict(state.get("derpp_logits", {}))
