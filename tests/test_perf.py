"""`bench perf` runs end to end on synthetic tensors (a smoke test: the numbers are a benchmark's)."""

from __future__ import annotations

from click.testing import CliRunner

from bench_stability_gap.harness.cli import main


def test_bench_perf_runs_on_synthetic_tensors_and_prints_the_ratios():
    out = CliRunner().invoke(main, ["perf", "--protocol", "tiny_cil", "--updates", "1", "--warmup", "0",
                                    "--repeats", "1", "--eval-samples", "32"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    for words in ("plain PyTorch loop", "harness update", "harness / plain time", "cached trunk",
                  "no trunk cache", "x vs no trunk cache", "forward MACs per sample (fvcore)"):
        assert words in out.output


def test_image_files_decode_through_loader_workers_to_the_same_tensors(tmp_path, monkeypatch):
    """Real-data path: a DataLoader (one worker) builds the kept images, a thread pool decodes per
    batch; both give exactly what the plain in-order path gives, mixed with an in-memory split."""
    import numpy as np
    import torch
    from PIL import Image

    from bench_stability_gap.harness.data.sources import ArraySplit, FileSplit
    from bench_stability_gap.harness.inputs import InputStore, Preprocess
    from bench_stability_gap.harness.protocol import load_protocol
    from bench_stability_gap.harness.stream import Catalog

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
