"""Rehearsal memory: the storage cap is the harness's, counted in samples and in bytes.

The memory holds global sample ids (what a real system would store is the sample itself; its size
is what ``sample_bytes`` reports), so any policy can be replayed exactly from its state dict.

``split`` is the storage-limited Places365 setting of the paper (appendix: "80% ImageNet-1K + 20%
Places365-Standard") as its published code builds it (yousuf907/SGM, train_sgm.py, model_sgm.py
``update_buffer``): a fixed subset of the pre-training data, ``pretrain_share`` of the cap, drawn once
(the same for every seed, as the code's ``rehearsal_ixs_ImageNet_*.npy`` file), beside a buffer of
stream samples: each arriving sample is stored, and once that part is full a random sample of its
largest class (the arriving one included) is dropped. One reservoir over both would drift towards
the stream (measured: 47 % ImageNet by the end of cil_places_std_24k).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

import numpy as np

from ..spec.protocol import Memory as MemorySpec

PRETRAIN_SUBSET_SEED = 0  # the split policy's S1 subset: fixed across runs and seeds


class Overfilled(RuntimeError):
    """A memory policy kept more samples than the cap: a bug of the policy (the method's, when it brings
    its own eviction), which the harness turns into an error naming the method."""


class Memory:
    def __init__(self, spec: MemorySpec, labels: np.ndarray, sample_bytes: Callable[[int], int],
                 rng: np.random.Generator) -> None:
        self.spec = spec
        self.labels = labels
        self.sample_bytes = sample_bytes
        self.rng = rng
        self.ids: list[int] = []
        # ``ids`` mirrored in a growing array, so a draw does not convert a list of a million ids every update
        self._array = np.empty(0, dtype=np.int64)
        self._held = np.zeros(len(labels), dtype=np.int32)  # copies of each train id held: membership in O(1)
        self.seen = 0           # samples offered so far (reservoir sampling needs it)
        self.bytes = 0
        self.peak_samples = 0
        self.peak_bytes = 0
        # split policy: stream ids per class (insertion order) and each stored id's slot in ``ids``
        self.pretrain: set[int] = set()
        self.by_class: dict[int, list[int]] = {}
        self.slot: dict[int, int] = {}
        self.order: dict[int, int] = {}                         # class -> first-seen rank
        self.heaps: dict[int, list[tuple[int, int]]] = {}       # count -> heap of (rank, class)
        self.top = 0

    @property
    def capacity(self) -> int | None:
        return self.spec.capacity

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, ids: Iterable[int], pretrain: bool = False) -> None:
        """Offer samples to the memory; the policy decides what is kept. ``pretrain``: these are S1's
        samples (the split policy keeps its fixed share of them; other policies treat all alike)."""
        if self.spec.policy == "none":
            return
        if self.spec.arrival == "by_class" and not pretrain:  # the data's own order, as an unshuffled loader
            ids = np.sort(np.asarray(list(ids), dtype=np.int64))
        if self.spec.policy == "split":
            self._add_split(np.asarray(list(ids), dtype=np.int64), pretrain)
        else:
            for gid in ids:
                self._offer(int(gid))
        self.peak_samples = max(self.peak_samples, len(self.ids))
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        if self.capacity is not None and len(self.ids) > self.capacity:  # a check that `python -O` keeps
            raise Overfilled(f"memory policy {self.spec.policy!r} kept {len(self.ids)} samples over its cap of "
                             f"{self.capacity}")

    @property
    def pretrain_capacity(self) -> int:
        return self.spec.split_caps()[0]

    def _add_split(self, ids: np.ndarray, pretrain: bool) -> None:
        if pretrain:
            room = self.pretrain_capacity - len(self.pretrain)
            keep = (ids if len(ids) <= room
                    else np.random.default_rng(PRETRAIN_SUBSET_SEED).choice(ids, room, replace=False))
            for gid in np.sort(keep):
                self.pretrain.add(int(gid))
                self._store(int(gid))
            self.seen += len(ids)
            return
        cap = self.spec.split_caps()[1]
        for gid in ids:
            self._offer_stream(int(gid), cap)

    def _offer_stream(self, gid: int, cap: int) -> None:
        """Store; past the stream part's cap, drop a random sample of the largest class (maybe this one)."""
        self.seen += 1
        c = int(self.labels[gid])
        if c not in self.by_class:
            self.by_class[c], self.order[c] = [], len(self.order)
        self.by_class[c].append(gid)
        if len(self.ids) - len(self.pretrain) < cap:
            self._counted(c)
            self.slot[gid] = len(self.ids)
            self._store(gid)
            return
        self._counted(c)
        largest = self._largest()
        victims = self.by_class[largest]
        victim = victims.pop(int(self.rng.integers(0, len(victims))))
        self._counted(largest)
        if victim == gid:
            return
        slot = self.slot.pop(victim)
        self.slot[gid] = slot
        self._store(gid, slot)

    def _counted(self, c: int) -> None:
        """Class ``c``'s count changed: file it under its new count (older entries go stale)."""
        n = len(self.by_class[c])
        heapq.heappush(self.heaps.setdefault(n, []), (self.order[c], c))
        self.top = max(self.top, n)

    def _largest(self) -> int:
        """The class with most stored samples, the first seen among ties (``max`` over the code's dict),
        in O(log classes): one heap of (first-seen order, class) per count, stale entries skipped."""
        while True:
            heap = self.heaps.get(self.top, [])
            while heap and len(self.by_class[heap[0][1]]) != self.top:
                heapq.heappop(heap)
            if heap:
                return heap[0][1]
            self.top -= 1

    def _store(self, gid: int, slot: int | None = None) -> None:
        if slot is None:
            self.ids.append(gid)
            slot = len(self.ids) - 1
            if slot == len(self._array):  # full: double it (appends cost O(1) amortised)
                self._array = np.resize(self._array, max(2 * slot, 1024))
        else:
            self.bytes -= self.sample_bytes(self.ids[slot])
            self._held[self.ids[slot]] -= 1
            self.ids[slot] = gid
        self._array[slot] = gid
        self._held[gid] += 1
        self.bytes += self.sample_bytes(gid)

    def holds(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the memory holds now (a boolean per id)."""
        return self._held[ids] > 0

    def id_array(self) -> np.ndarray:
        """The stored ids in storage order as an int64 array (a view: read it before the memory changes)."""
        return self._array[:len(self.ids)]

    def _offer(self, gid: int) -> None:
        self.seen += 1
        cap = self.capacity
        if cap is None or len(self.ids) < cap:
            self._store(gid)
        elif self.spec.policy == "reservoir":
            j = int(self.rng.integers(0, self.seen))
            if j < cap:
                self._store(gid, j)
        elif self.spec.policy == "class_balanced":
            # GDumb: evict a random sample of the largest class, unless the new sample's class is it.
            stored = self.labels[self.id_array()]
            counts = np.bincount(stored, minlength=int(self.labels.max()) + 1)
            largest = int(np.argmax(counts))
            if counts[self.labels[gid]] >= counts[largest]:
                return
            victims = np.flatnonzero(stored == largest)
            self._store(gid, int(self.rng.choice(victims)))

    def sample(self, n: int, class_balanced: bool = False) -> np.ndarray:
        """Draw ``n`` stored ids (without replacement when possible); class-balanced on request."""
        return self._draw(self.id_array(), n, class_balanced)

    def sample_by_source(self, pretrain: int, earlier: int, boundary: int, class_balanced: bool = False) -> np.ndarray:
        """``pretrain`` stored ids below ``boundary`` (the pre-training data's ids come first) and ``earlier``
        ids at or past it, each part drawn within its source as ``sample`` draws (the published code's
        training loop reads one loader per source)."""
        ids = self.id_array()
        return np.concatenate([self._draw(ids[ids < boundary], pretrain, class_balanced),
                               self._draw(ids[ids >= boundary], earlier, class_balanced)])

    def _draw(self, ids: np.ndarray, n: int, class_balanced: bool) -> np.ndarray:
        if n == 0 or not len(ids):
            return np.empty(0, dtype=np.int64)
        if class_balanced:
            classes = np.unique(self.labels[ids])
            picks = self.rng.choice(classes, size=n)
            return np.array([self.rng.choice(ids[self.labels[ids] == c]) for c in picks], dtype=np.int64)
        return self.rng.choice(ids, size=n, replace=len(ids) < n).astype(np.int64)

    def add_bytes(self, n: int) -> None:
        """Charge ``n`` more bytes for samples already stored (DER++'s logits, recorded after entry)."""
        self.bytes += int(n)
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def recount_bytes(self) -> None:
        """Re-evaluate the stored bytes (a method's storage format is known only once it is set up)."""
        self.bytes = int(sum(self.sample_bytes(int(g)) for g in self.ids))
        self.peak_bytes = self.bytes

    def state_dict(self) -> dict:
        return {"ids": list(self.ids), "seen": self.seen, "bytes": self.bytes,
                "peak_samples": self.peak_samples, "peak_bytes": self.peak_bytes,
                "pretrain": sorted(self.pretrain), "by_class": {c: list(v) for c, v in self.by_class.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.ids = list(state["ids"])
        self._array = np.asarray(self.ids, dtype=np.int64)
        self._held = np.bincount(self._array, minlength=len(self.labels)).astype(np.int32)
        self.seen, self.bytes = state["seen"], state["bytes"]
        self.peak_samples, self.peak_bytes = state["peak_samples"], state["peak_bytes"]
        self.pretrain = set(state.get("pretrain", []))
        self.by_class = {int(c): list(v) for c, v in state.get("by_class", {}).items()}
        self.slot = {gid: i for i, gid in enumerate(self.ids) if gid not in self.pretrain}
        self.order = {c: i for i, c in enumerate(self.by_class)}
        self.heaps, self.top = {}, 0
        for c in self.by_class:
            self._counted(c)
