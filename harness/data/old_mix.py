"""Where a rehearsal batch's samples come from, by source: the pre-training data (ImageNet-1K on the
paper's protocols) and earlier learning sessions (earlier Places classes), declared before compute.

Two readings of the paper:

* ``pooled`` (the text, §5.1: half the batch "from data seen in earlier CL batches and
  ImageNet-1K"): ``batch.old`` drawn uniformly from the whole memory, so each source's share is its
  share of what the memory holds. With ImageNet's 1.28 M images beside 62,500 Places-LT ones, the
  earlier Places classes get a few of 64 old samples.
* ``by_source`` (the published code, yousuf907/SGM ``train_sgm.py``: three loaders zipped, new at
  batch 96, ImageNet at 128, earlier Places at 32 when B = 128; new and ImageNet at 128 in the first
  learning session): ``batch.old`` from the pre-training data always, and from the second learning
  session on a quarter of ``batch.new`` from earlier sessions' samples, ``batch.new`` less that from the
  session. Each part is drawn uniformly within its source.

``plan_old_mix`` gives, per session, the samples per batch by source: exact under ``by_source``, the
expectation under ``pooled`` (from what the memory policy holds at the session's start).

How each source's samples are drawn within a session (``training.source_draw``, by_source only):

* ``tiled`` (the published loaders): ``train_sgm.py`` tiles the stored ImageNet indices to
  ``batch_size * num_iter`` (``q = int(comp_budget / len(all_idxs)) + 1`` copies, cut to the budget),
  shuffles that list in place (``np.random.shuffle``) at every session start and reads it in order (``IndexSampler``);
  the earlier-Places loader (``utils_data.get_places_data_loader`` with ``num_iter``) repeats the
  session's stored Places indices to ``num_iter * 32`` (appending the list to itself, then cut), and
  ``SubsetRandomSampler`` reads that list in one random permutation. Either way a session draws each
  stored id floor(n) or ceil(n) times (n = the session's draws from the source / its stored ids), the
  first ids of the list the extra time. ``SourceTiles`` does that: the list in storage order tiled and
  cut to the session's draws, one permutation from the harness's generator, read in order.
* ``per_batch`` (unset): every batch draws each part afresh, uniformly within its source, so a stored id's
  count over a session is binomial (at cil_places_std_24k's 8.3 draws per ImageNet id: 0 to 21, std 2.9).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..spec.protocol import Protocol
from .stream import Stream


@dataclass(frozen=True)
class Shares:
    """Samples of one batch by source: the session's (new), the stored pre-training data, earlier
    sessions' stored samples."""

    new: float
    pretrain: float
    earlier: float


@dataclass(frozen=True)
class SessionMix:
    session: int
    draw: str            # pooled | by_source
    shares: Shares       # per batch; expected values when pooled
    held_pretrain: int   # samples the memory holds by source at the session's start (expected when capped)
    held_earlier: int

    def as_dict(self) -> dict:
        return asdict(self)


def by_source_shares(protocol: Protocol, position: int, b_new: int, b_old: int) -> Shares | None:
    """The fixed per-source counts of a ``by_source`` batch in the session at ``position`` (0 = the first
    learning session), or None when the protocol pools (or the method rehearses nothing)."""
    if protocol.training.old_mix != "by_source" or not b_old:
        return None
    earlier = b_new // 4 if position > 0 else 0
    return Shares(new=b_new - earlier, pretrain=b_old, earlier=earlier)


def _held(protocol: Protocol, stream: Stream, position: int) -> tuple[int, int]:
    """Samples of each source the memory holds at the start of the session at ``position``: exact for
    unlimited and split memories; for a capped reservoir or class-balanced buffer, its cap shared in
    proportion to the samples offered (reservoir) or the classes offered (class-balanced)."""
    m = protocol.memory
    pre = len(stream.pretrain_ids) if m.include_pretrain else 0
    offered = sum(len(s.train_ids) for s in stream.sessions[:position])
    if m.policy == "none":
        return 0, 0
    if m.policy == "unlimited":
        return pre, offered
    if m.policy == "split":
        pretrain_cap, stream_cap = m.split_caps()
        return min(pre, pretrain_cap), min(offered, stream_cap)
    if m.capacity is None:  # the protocol gives every other policy a cap
        raise ValueError(f"memory policy {m.policy!r} has no capacity")
    stored = min(m.capacity, pre + offered)
    weights = (pre, offered)
    if m.policy == "class_balanced" and pre + offered > m.capacity:
        weights = (stream.pretrain_classes if m.include_pretrain else 0,
                   sum(len(s.new_classes) for s in stream.sessions[:position]))
    kept = round(stored * weights[0] / sum(weights)) if sum(weights) else 0
    return kept, stored - kept


def plan_old_mix(protocol: Protocol, stream: Stream, rehearsal: bool = True) -> list[SessionMix]:
    """Per learning session, the samples per batch by source as the run will draw them."""
    b = protocol.training.batch
    b_new, b_old = (b.new, b.old) if rehearsal else (b.new + b.old, 0)
    out = []
    for position, session in enumerate(stream.sessions):
        held_pre, held_earlier = _held(protocol, stream, position)
        fixed = by_source_shares(protocol, position, b_new, b_old)
        if fixed is None:  # uniform over what is held, or over the classes held under a class-balanced draw
            weights = (held_pre, held_earlier)
            if protocol.training.class_balanced:
                weights = (stream.pretrain_classes * (held_pre > 0),
                           sum(len(s.new_classes) for s in stream.sessions[:position]) * (held_earlier > 0))
            old_pre = b_old * weights[0] / sum(weights) if sum(weights) else 0.0
            fixed = Shares(new=b_new, pretrain=old_pre, earlier=b_old - old_pre if sum(weights) else 0.0)
        out.append(SessionMix(session.index, protocol.training.old_mix or "pooled", fixed, held_pre, held_earlier))
    return out


def describe_old_mix(mix: list[SessionMix]) -> str:
    """The plan as the run prints it before compute: one line per session."""
    if not mix:
        return ""
    lines = [f"batch by source ({mix[0].draw}; per batch{', expected' if mix[0].draw == 'pooled' else ''}):"]
    for m in mix:
        s = m.shares
        lines.append(f"  session {m.session}: {s.new:g} new + {s.pretrain:.2f} pre-training + {s.earlier:.2f} earlier "
                     f"sessions (memory at its start: {m.held_pretrain:,} pre-training, {m.held_earlier:,} earlier)")
    return "\n".join(lines)


class SourceTiles:
    """A ``tiled`` session's draws of the pre-training and the earlier sessions' stored samples: per source,
    the ids it holds at the session's start, in storage order, tiled and cut to ``updates`` x the batch's
    count from it, then shuffled once; ``take`` reads both lists in order. Its state (``state`` /
    ``load``) goes into a mid-session checkpoint, so a resumed session reads on where it stopped."""

    def __init__(self, stored: np.ndarray, boundary: int, shares: Shares, updates: int,
                 rng: np.random.Generator) -> None:
        self.orders = [self._tiled(stored[stored < boundary], updates * int(shares.pretrain), rng),
                       self._tiled(stored[stored >= boundary], updates * int(shares.earlier), rng)]
        self.positions = [0, 0]

    @staticmethod
    def _tiled(ids: np.ndarray, draws: int, rng: np.random.Generator) -> np.ndarray:
        if not len(ids) or not draws:  # nothing stored (or asked for) from this source: no draws from it
            return np.empty(0, dtype=np.int64)
        return rng.permutation(np.resize(ids.astype(np.int64), draws))  # resize: the list repeated, then cut

    def take(self, pretrain: int, earlier: int) -> np.ndarray:
        """The next ``pretrain`` and ``earlier`` ids of the session's lists (an empty source gives none)."""
        out = []
        for k, n in enumerate((pretrain, earlier)):
            order, pos = self.orders[k], self.positions[k]
            if not len(order):
                continue
            if pos + n > len(order):
                raise RuntimeError(f"the session's tiled draws ran out ({len(order)} listed, {pos + n} asked for)")
            out.append(order[pos:pos + n])
            self.positions[k] = pos + n
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    def state(self) -> dict:
        return {"orders": [o.copy() for o in self.orders], "positions": list(self.positions)}

    def load(self, state: dict) -> None:
        self.orders = [np.asarray(o, dtype=np.int64) for o in state["orders"]]
        self.positions = [int(p) for p in state["positions"]]
