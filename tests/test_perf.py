"""`bench perf` runs end to end on synthetic tensors (a smoke test: the numbers are a benchmark's)."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from bench_stability_gap.harness.cli import main


def test_bench_perf_runs_on_synthetic_tensors_and_prints_the_ratios():
    out = CliRunner().invoke(main, ["perf", "--protocol", "tiny_cil", "--updates", "1", "--warmup", "0",
                                    "--repeats", "1", "--eval-samples", "32"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    for words in ("plain PyTorch loop", "harness update", "harness / plain time", "cached trunk",
                  "no trunk cache", "x vs no trunk cache", "forward MACs per sample (fvcore)",
                  "roofline: fp32 GEMM", "train, harness update", "eval, cached trunk", "% of roofline",
                  "cached trunk, 16-row chunks, hooked", "x faster than 16-row chunks"):
        assert words in out.output


@pytest.mark.parametrize("device", ["xla", "cpu:0", "cuda:7"])
@pytest.mark.parametrize("paper", [[], ["--paper", "-p", "cil_places_lt_synthetic"]])
def test_bench_perf_refuses_a_device_bench_run_refuses_before_building_anything(device, paper, monkeypatch):
    from support import refused

    from bench_stability_gap.harness.tools import perf, perf_scale

    def built(*args, **kwargs):
        raise AssertionError("bench perf built its network before checking --device")

    monkeypatch.setattr(perf, "_rig", built)
    monkeypatch.setattr(perf_scale, "paper_report", built)
    out = CliRunner().invoke(main, ["perf", "--device", device, *paper])
    refused(out, f"--device {device!r} is not a device bench can train on here", "Give one of: auto, cpu", lines=1)
    assert CliRunner().invoke(main, ["run", "--device", device, "--no-mlflow"]).output == out.output


@pytest.mark.parametrize("args, needles", [
    (["--budget-of", "online_cub_20k"], ["--budget-of online_cub_20k: online_cub_20k's budget does not fit "
                                         "cil_places_lt_synthetic's data", "classes_per_session (40) does not divide "
                                         "the 365 stream classes"]),
    (["--project-tflops", "-3"], ["--project-tflops -3: a device's sustained rate is a positive, finite number"]),
    (["--project-tflops", "inf"], ["--project-tflops inf: a device's sustained rate"]),
])
def test_bench_perf_paper_refuses_options_that_project_nothing_real_before_measuring(args, needles, monkeypatch):
    from support import refused

    from bench_stability_gap.harness.data import stream

    def built(*a, **k):
        raise AssertionError("bench perf --paper built the stream before checking its options")

    monkeypatch.setattr(stream, "build_stream", built)
    out = CliRunner().invoke(main, ["perf", "--paper", "-p", "cil_places_lt_synthetic", *args])
    refused(out, *needles, lines=1)


@pytest.mark.parametrize("args, needle", [
    (["--budget-of", "cil_places_lt"], "--budget-of applies to bench perf --paper only."),
    (["--paper-images", "8", "--project-tflops", "400"], "--project-tflops and --paper-images apply to bench perf "
                                                         "--paper only."),
])
def test_an_option_of_the_projection_without_paper_is_refused_not_ignored(args, needle, monkeypatch):
    from support import refused

    from bench_stability_gap.harness.tools import perf

    def built(*a, **k):
        raise AssertionError("bench perf ran the plain benchmark, ignoring an option of --paper")

    monkeypatch.setattr(perf, "_rig", built)
    refused(CliRunner().invoke(main, ["perf", "-p", "tiny_cil", *args]), needle, lines=1)


def test_a_budget_that_fits_the_data_is_projected_under_both_names():
    from bench_stability_gap.harness.spec.protocol import load_protocol
    from bench_stability_gap.harness.tools.perf_scale import with_budget_of

    real = load_protocol("cil_places_lt")
    twin = with_budget_of(load_protocol("cil_places_lt_synthetic"), "cil_places_lt")
    assert twin.name == "cil_places_lt_synthetic@cil_places_lt"
    budget = ("training", "eval", "joint", "sessions", "classes_per_session")
    assert [getattr(twin, f) for f in budget] == [getattr(real, f) for f in budget]
    assert twin.pretrain_data == load_protocol("cil_places_lt_synthetic").pretrain_data


def test_roofline_share_is_achieved_macs_over_the_gemm_rate():
    from bench_stability_gap.harness.tools.perf import gemm_gmacs, roofline_line

    # 200 images/s x 5 M MACs each = 1 GMAC/s; against a 4 GMAC/s GEMM that is 25 %
    assert roofline_line("eval", 200.0, 5e6, 4.0).split() == ["eval", "1.00", "GMAC/s", "25.0", "%", "of", "roofline"]
    import torch

    assert gemm_gmacs(torch.device("cpu"), size=64, calls=2) > 0


def test_the_roofline_is_measured_in_the_precision_the_stages_compute_in():
    import torch

    from bench_stability_gap.harness.tools.roofline import gemm_gmacs, roofline_precision

    # bf16 only where the stages run under bf16 autocast: CUDA with --amp; the CPU computes in fp32
    assert roofline_precision(torch.device("cuda"), True) == "bf16"
    assert roofline_precision(torch.device("cuda"), False) == "fp32"
    assert roofline_precision(torch.device("cpu"), True) == "fp32"
    assert gemm_gmacs(torch.device("cpu"), size=64, calls=2, precision="bf16") > 0
    with pytest.raises(KeyError):
        gemm_gmacs(torch.device("cpu"), size=8, calls=1, precision="fp8")


def test_image_files_decode_through_loader_workers_to_the_same_tensors(tmp_path, monkeypatch):
    """Real-data path: a DataLoader (one worker) builds the kept images, a thread pool decodes per
    batch; both give exactly what the plain in-order path gives, mixed with an in-memory split."""
    import numpy as np
    import torch
    from PIL import Image

    from bench_stability_gap.harness.data.sources import ArraySplit, FileSplit
    from bench_stability_gap.harness.data.inputs import InputStore, Preprocess
    from bench_stability_gap.harness.spec.protocol import load_protocol
    from bench_stability_gap.harness.data.stream import Catalog

    rng = np.random.default_rng(0)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (20 + i, 24, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    files = FileSplit(tmp_path, [f"{i}.png" for i in range(6)], [0, 1, 0, 1, 0, 1], ["a", "b"])
    arrays = ArraySplit(rng.integers(0, 256, (3, 28, 28), dtype=np.uint8), [0, 1, 1], ["a", "b"])
    catalog = Catalog((files, arrays), np.array([0, 1, 0, 1, 0, 1, 0, 1, 1]))
    pre = Preprocess(load_protocol("tiny_cil").backbone)
    ids = np.array([8, 0, 5, 6, 2, 3, 1, 7, 4])
    expected = pre.images(catalog, ids)
    monkeypatch.setenv("BENCH_LOADER_WORKERS", "1")
    kept = InputStore(catalog, pre, None, torch.device("cpu"), chunk=4)
    assert kept.kind == "images"
    assert torch.equal(kept.get(ids), expected)
    decoded = InputStore(catalog, pre, None, torch.device("cpu"), keep_images=False)
    assert decoded.kind == "decode"
    assert torch.equal(decoded.get(ids), expected)
    assert decoded.distinct_seen() == 9 and decoded.fetched == 9


def test_paper_projection_multiplies_per_image_costs_by_stage_images():
    from bench_stability_gap.harness.tools.perf_scale import Costs, project

    costs = Costs(decode=0.01, trunk=0.002, body_eval=0.001, train_step=0.004, write_gbs=1, read_gbs=1,
                  flops_trunk=1, flops_body=1)
    stages = {"trunk pass": {"decode": 100, "trunk": 100}, "joint": {"train": 10, "eval": 50}}
    cpu = project(costs, stages, train_streamed=True, eval_streamed=False, workers=2, cuda=False)
    assert cpu == pytest.approx({"trunk pass": 100 * (0.005 + 0.002), "joint": 10 * (0.005 + 0.006) + 50 * 0.001})
    gpu = project(costs, stages, train_streamed=True, eval_streamed=False, workers=2, cuda=True, compute_scale=2)
    assert gpu == pytest.approx({"trunk pass": 100 * 0.005, "joint": 10 * 0.005 + 50 * 0.0005})
    streamed = project(costs, stages, train_streamed=False, eval_streamed=True, workers=2, cuda=False)
    assert streamed == pytest.approx({"trunk pass": 0.0, "joint": 10 * 0.004 + 50 * (0.005 + 0.003)})
    nvjpeg = dataclasses.replace(costs, decode_device=0.0006)  # workers read bytes; the GPU decodes in series
    gpu_decoded = project(nvjpeg, stages, train_streamed=True, eval_streamed=False, workers=2, cuda=True, compute_scale=2)
    assert gpu_decoded == pytest.approx({"trunk pass": 100 * (0.001 + 0.0003),
                                         "joint": 10 * (0.003 + 0.0003) + 50 * 0.0005})


def test_paper_stage_images_count_a_full_run(tiny_protocol):
    from bench_stability_gap.harness.run.evaluation import eval_plan
    from bench_stability_gap.harness.tools.perf_scale import stage_images
    from bench_stability_gap.harness.data.stream import build_stream

    stream = build_stream(tiny_protocol, 0)
    st = stage_images(tiny_protocol, stream)
    t, j = tiny_protocol.training, tiny_protocol.joint
    sets = [len(eval_plan(stream, s).ids) for s in stream.sessions]
    assert st["CL training"]["train"] == len(stream.sessions) * t.updates * t.batch.size
    assert st["joint reference"] == {"train": len(stream.sessions) * j.updates * j.batch_size, "eval": sum(sets)}
    assert st["CL evaluation"]["eval"] == len(tiny_protocol.eval.points(t.updates)) * sum(sets)
    assert st["eval-set trunk pass"]["decode"] == int((stream.test.labels >= 0).sum())


def test_bench_perf_paper_prints_costs_and_stage_projection(tiny_protocol_file):
    out = CliRunner().invoke(main, ["perf", "--paper", "-p", str(tiny_protocol_file), "--paper-images", "4",
                                    "--repeats", "1", "--project-tflops", "100"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    for needle in ("JPEG decode + preprocess", "trunk forward", "train step", "GiB/s", "data path",
                   "CL evaluation", "an assumption, not a measurement", "% of roofline", "roofline: fp32 GEMM"):
        assert needle in out.output
