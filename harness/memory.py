"""Rehearsal memory: the storage cap is the harness's, counted in samples and in bytes.

The memory holds global sample ids (what a real system would store is the sample itself; its size
is what ``sample_bytes`` reports), so any policy can be replayed exactly from its state dict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from .protocol import Memory as MemorySpec


class Memory:
    def __init__(self, spec: MemorySpec, labels: np.ndarray, sample_bytes: Callable[[int], int],
                 rng: np.random.Generator) -> None:
        self.spec = spec
        self.labels = labels
        self.sample_bytes = sample_bytes
        self.rng = rng
        self.ids: list[int] = []
        self.seen = 0           # samples offered so far (reservoir sampling needs it)
        self.bytes = 0
        self.peak_samples = 0
        self.peak_bytes = 0

    @property
    def capacity(self) -> int | None:
        return self.spec.capacity

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, ids: Iterable[int]) -> None:
        """Offer samples to the memory; the policy decides what is kept."""
        if self.spec.policy == "none":
            return
        for gid in ids:
            self._offer(int(gid))
        self.peak_samples = max(self.peak_samples, len(self.ids))
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        if self.capacity is not None:
            assert len(self.ids) <= self.capacity, "memory policy overfilled its cap"

    def _store(self, gid: int, slot: int | None = None) -> None:
        if slot is None:
            self.ids.append(gid)
        else:
            self.bytes -= self.sample_bytes(self.ids[slot])
            self.ids[slot] = gid
        self.bytes += self.sample_bytes(gid)

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
            stored = self.labels[np.asarray(self.ids)]
            counts = np.bincount(stored, minlength=int(self.labels.max()) + 1)
            largest = int(np.argmax(counts))
            if counts[self.labels[gid]] >= counts[largest]:
                return
            victims = np.flatnonzero(stored == largest)
            self._store(gid, int(self.rng.choice(victims)))

    def sample(self, n: int, class_balanced: bool = False) -> np.ndarray:
        """Draw ``n`` stored ids (without replacement when possible); class-balanced on request."""
        if n == 0 or not self.ids:
            return np.empty(0, dtype=np.int64)
        ids = np.asarray(self.ids)
        if class_balanced:
            classes = np.unique(self.labels[ids])
            picks = self.rng.choice(classes, size=n)
            return np.array([self.rng.choice(ids[self.labels[ids] == c]) for c in picks], dtype=np.int64)
        return self.rng.choice(ids, size=n, replace=len(ids) < n).astype(np.int64)

    def recount_bytes(self) -> None:
        """Re-evaluate the stored bytes (a method's storage format is known only once it is set up)."""
        self.bytes = int(sum(self.sample_bytes(int(g)) for g in self.ids))
        self.peak_bytes = self.bytes

    def state_dict(self) -> dict:
        return {"ids": list(self.ids), "seen": self.seen, "bytes": self.bytes,
                "peak_samples": self.peak_samples, "peak_bytes": self.peak_bytes}

    def load_state_dict(self, state: dict) -> None:
        self.ids = list(state["ids"])
        self.seen, self.bytes = state["seen"], state["bytes"]
        self.peak_samples, self.peak_bytes = state["peak_samples"], state["peak_bytes"]
