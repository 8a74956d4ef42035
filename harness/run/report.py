"""How every stage of a run times and reports itself: wall and GPU seconds per stage, progress for an
executor that runs it elsewhere, and the harness's log lines (``RunOptions.log``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from tqdm.auto import tqdm

from ..results.schema import GPU_STAGE
from .options import RunOptions

Span = tuple[torch.cuda.Event, torch.cuda.Event]


@contextmanager
def timed(seconds: dict[str, float], stage: str, device: torch.device | None = None,
          spans: list[Span] | None = None) -> Iterator[None]:
    """Add the wall time of the block to ``seconds[stage]`` (kept in checkpoints, so resumes add up).

    On a CUDA ``device`` it also adds the GPU time the block spans, measured by CUDA events, to
    ``seconds[GPU_STAGE + stage]``: wall time on a GPU counts the host's launch overhead and the GPU's
    queue, so the two differ and both are worth reporting. The block waits for its end event, unless
    ``spans`` is given: then the events are kept there, for ``settle_spans`` to read once the host has
    synchronised anyway (a training update must not wait for the GPU just to be timed)."""
    gpu = getattr(device, "type", None) == "cuda"
    if gpu:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - t0
        if gpu:
            end.record()
            if spans is not None:
                spans.append((start, end))
            else:
                settle_spans(seconds, stage, [(start, end)])


def settle_spans(seconds: dict[str, float], stage: str, spans: list[Span]) -> None:
    """Add the GPU time of the kept ``spans`` to ``seconds[GPU_STAGE + stage]`` and empty the list (waits for
    the last one's end)."""
    if not spans:
        return
    spans[-1][1].synchronize()
    key = GPU_STAGE + stage
    seconds[key] = seconds.get(key, 0.0) + sum(start.elapsed_time(end) for start, end in spans) / 1000.0
    spans.clear()


def report_progress(options: RunOptions, phase: str, update: int, total: int) -> None:
    if options.on_progress is not None:
        options.on_progress(phase, update, total)


def say(options: RunOptions, msg: str) -> None:
    if options.log:
        tqdm.write(msg)
