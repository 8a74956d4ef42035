"""What each training update leaves on the device (its loss, its GPU time), read in one go.

Reading a CUDA tensor on the host waits for every kernel queued before it. Read after each update (the
loss for the curve, a finiteness check of the weights), it would stall the host once per update: a small
model's update then costs the launch latency of its kernels rather than their compute, and the GPU idles
while the host prepares the next batch. The continual loop keeps the values here and reads them where it
waits for the device anyway: at eval points, checkpoints and the session's end, and at least every
``READ_EVERY`` updates, which bounds how many updates a diverged run makes before it is stopped. On the
CPU the values are the same, read later.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .report import Span

READ_EVERY = 100


@dataclass
class UpdateReads:
    """The losses of the updates since the last read, by update, and the GPU spans of their training."""

    losses: list[tuple[int, Tensor | float]] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)  # CUDA: ``report.timed``'s events, read by ``settle_spans``

    def add(self, update: int, loss: Tensor | float) -> None:
        self.losses.append((update, loss))

    def due(self, update: int) -> bool:
        """Whether the oldest kept loss is ``READ_EVERY`` updates old by ``update``."""
        return bool(self.losses) and update - self.losses[0][0] >= READ_EVERY

    def read(self) -> list[tuple[int, float]]:
        """The kept losses as Python floats, with one host sync for all of them, and the list emptied.
        The same floats as ``float(loss)`` after each update: stacking promotes them to their widest dtype,
        and that and the widening to float64 are exact for float16, bfloat16 and float32. Widening once, after
        the stack, is one kernel on CUDA instead of one per update."""
        kept, self.losses = self.losses, []
        tensors = [loss for _, loss in kept if isinstance(loss, Tensor)]
        values = iter(torch.stack([t.detach().reshape(()).to(tensors[0].device) for t in tensors])
                      .to(torch.float64).tolist() if tensors else [])
        return [(u, next(values) if isinstance(loss, Tensor) else float(loss)) for u, loss in kept]
