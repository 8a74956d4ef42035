"""Stage timing: wall seconds everywhere, GPU seconds (CUDA events) on a GPU only."""

from __future__ import annotations

import time

import pytest
import torch

from bench_stability_gap.harness.run.options import timed


def test_cpu_blocks_add_wall_seconds_and_no_gpu_seconds() -> None:
    seconds: dict[str, float] = {"train": 1.0}
    with timed(seconds, "train", torch.device("cpu")):
        time.sleep(0.02)
    with timed(seconds, "eval", torch.device("cpu")):
        pass
    assert seconds["train"] >= 1.02  # added to what a checkpoint carried over
    assert set(seconds) == {"train", "eval"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_blocks_add_gpu_seconds_spanned_by_the_block() -> None:
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    seconds: dict[str, float] = {}
    with timed(seconds, "train", device):
        for _ in range(20):
            a = a @ a / 64.0
        float(a.sum())  # the host read every timed block ends with
    assert set(seconds) == {"train", "gpu_train"}
    # 20 products of 4096^3 are ~2.7 TFLOP: well over a millisecond on any GPU; the events span the
    # block's work, within the microseconds it takes to record them of its wall time
    assert 1e-3 < seconds["gpu_train"] <= seconds["train"] + 1e-3
