"""Stage timing: wall seconds everywhere, GPU seconds (CUDA events) on a GPU only."""

from __future__ import annotations

import time

import pytest
import torch
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness.cli import summary_lines
from bench_stability_gap.harness.results.schema import save_result
from bench_stability_gap.harness.run.report import timed
from bench_stability_gap.leaderboard.site import build_site
from bench_stability_gap.leaderboard.sources import load_folder


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


def test_wall_and_gpu_seconds_are_labelled_apart_in_the_summary_and_on_the_run_page(tmp_path) -> None:
    run = two_session_run("r1").model_copy(update={"stage_seconds": {"train": 12.4, "gpu_train": 3.2, "eval": 5.0}})
    assert run.stage_times() == [("eval", 5.0, False), ("train", 3.2, True), ("train", 12.4, False)]
    assert ", eval 5 s, GPU train 3 s, train 12 s |" in summary_lines(run, "r1.json")[0]
    root = tmp_path / "r"
    save_result(root, joint_run("j1"))
    save_result(root, run)
    build_site(load_folder(root), tmp_path / "site")
    (page,) = [p for p in (tmp_path / "site" / "runs").glob("*.html") if "r1" in p.read_text()]
    html = page.read_text()
    assert "GPU seconds, train</th><td>3.2 s" in html and "wall seconds, train</th><td>12.4 s" in html
