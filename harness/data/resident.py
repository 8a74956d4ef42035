"""Trunk features on the accelerator: kept there for the whole run when they fit, streamed ahead when not.

An evaluation point of a paper-size protocol reads every eval-set feature row once; read from host
memory at every point, the copies, not the body's arithmetic, set its pace. So on CUDA a store of
trunk features decides once, when it opens (``placement``):

- ``resident``: the rows, in the dtype they are stored in (bf16 under CUDA autocast: half of float32's
  bytes), fit the device's free memory with ``RESIDENT_MARGIN_BYTES`` and ``RESIDENT_MARGIN_SHARE``
  of its total left over for the model, its activations and the allocator. They are copied there
  once and every batch is an index on the device.
- ``streamed``: otherwise. Batches the caller announces (``RowsAhead``) are read from the shards by a
  background thread into pinned host memory in the stored dtype, and copied by a side stream without
  blocking, ``AHEAD`` batches in advance, so the copy of batch k+1 overlaps the compute of batch k.
- ``host``: any other device (the CPU), where rows are read when asked, as before.

Every path hands the model the same float32 values: a bf16 or float16 row converts to float32 exactly,
on the host or on the device.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from .features import FeatureShards

GiB = 2**30
RESIDENT_MARGIN_BYTES = 2 * GiB  # free device memory a resident table leaves, at least ...
RESIDENT_MARGIN_SHARE = 0.10  # ... or this share of the device's total, whichever is larger
AHEAD = 2  # batches in flight while one is computed: double buffering

Placement = Literal["resident", "streamed", "host"]


def fits_device(nbytes: int, free_bytes: int, total_bytes: int) -> bool:
    """Whether ``nbytes`` can stay on a device with ``free_bytes`` free of ``total_bytes`` and still
    leave the declared margin."""
    margin = max(RESIDENT_MARGIN_BYTES, int(RESIDENT_MARGIN_SHARE * total_bytes))
    return nbytes + margin <= free_bytes


def placement(nbytes: int, device: torch.device) -> Placement:
    """Where a store's feature rows live for the run (see the module's docstring)."""
    if device.type != "cuda":
        return "host"
    free, total = torch.cuda.mem_get_info(device)
    return "resident" if fits_device(nbytes, free, total) else "streamed"


class RowsAhead:
    """Announced batches of shard rows, read ahead by a thread and copied to ``device`` without blocking.

    ``take(rows)`` returns the next announced batch as float32 on the device when ``rows`` is it, and
    None otherwise (the caller then reads as usual). On a CPU device it only reads ahead."""

    def __init__(self, shards: FeatureShards, batches: list[np.ndarray], device: torch.device) -> None:
        self.shards, self.device = shards, device
        self.cuda = device.type == "cuda"
        self.copier = torch.cuda.Stream(device) if self.cuda else None
        self.todo = deque(np.asarray(b, dtype=np.int64) for b in batches)
        self.reads: deque[tuple[np.ndarray, Future[Tensor]]] = deque()
        self.copies: deque[tuple[np.ndarray, Tensor, torch.cuda.Event | None]] = deque()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="bench-rows-ahead")
        self.taken = 0  # batches served from the read-ahead (what tests read)
        self._fill()

    def _read(self, rows: np.ndarray) -> Tensor:
        host = self.shards.read(rows, stored=True)
        return host.pin_memory() if self.cuda else host

    def _fill(self) -> None:
        """Keep ``AHEAD`` reads going, and start the copy of every read that has finished."""
        while self.todo and len(self.reads) + len(self.copies) < AHEAD:
            rows = self.todo.popleft()
            self.reads.append((rows, self.pool.submit(self._read, rows)))
        while self.reads and (self.reads[0][1].done() or not self.copies):
            rows, future = self.reads.popleft()
            host = future.result()
            if not self.cuda:
                self.copies.append((rows, host, None))
                continue
            with torch.cuda.stream(self.copier):
                moved = host.to(self.device, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self.copier)
            self.copies.append((rows, moved, done))

    def take(self, rows: np.ndarray) -> Tensor | None:
        if not self.copies and not self.reads:
            return None
        self._fill()
        expected, moved, done = self.copies[0]
        if len(expected) != len(rows) or not np.array_equal(expected, rows):
            return None
        self.copies.popleft()
        if done is not None:  # the compute stream waits for the copy, and keeps its memory alive until used
            torch.cuda.current_stream(self.device).wait_event(done)
            moved.record_stream(torch.cuda.current_stream(self.device))
        self.taken += 1
        self._fill()
        return moved.float()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.todo.clear()
        self.reads.clear()
        self.copies.clear()
