"""JPEG files decoded on the device (nvJPEG on CUDA): DataLoader workers read bytes, the device decodes.

No GPU here: the same path runs with torchvision's CPU decoder (``decode_on(cpu)``), which exercises
everything but nvJPEG itself; the choice of decoder is tested for a CUDA device without running it.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from bench_stability_gap.harness.data import inputs
from bench_stability_gap.harness.data.sources import FileSplit
from bench_stability_gap.harness.data.inputs import InputStore, Preprocess, decode_on, gpu_decodable
from bench_stability_gap.harness.spec.protocol import Backbone
from bench_stability_gap.harness.data.stream import Catalog


def _jpegs(tmp_path, n: int = 10, suffix: str = ".JPEG") -> FileSplit:
    tmp_path.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    names = []
    for i in range(n):
        size = (40 + 3 * i, 32 + 5 * i)  # varied sizes: nothing stacks before the resize
        Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8)).save(tmp_path / f"{i}{suffix}", quality=90)
        names.append(f"{i}{suffix}")
    return FileSplit(tmp_path, names, np.arange(n) % 2, ["a", "b"], source="files")


def _backbone() -> Backbone:
    return Backbone.model_validate({"model": "tf_efficientnet_lite0", "weights": "none:", "input_size": 24,
                                    "trunk": ["conv_stem"], "body": ["global_pool"], "head": "classifier"})


def test_device_decoding_gives_the_pil_path_images(tmp_path):
    split, pre = _jpegs(tmp_path), Preprocess(_backbone())
    via_bytes = decode_on(torch.device("cpu"), pre, [torch.from_numpy(split.encoded(i)) for i in range(len(split))])
    via_pil = torch.stack([pre.one(split, i) for i in range(len(split))])
    assert via_bytes.shape == via_pil.shape == (len(split), 3, 24, 24)
    # libjpeg-turbo under both on the CPU, and the same resize: equal. nvJPEG's IDCT may differ by a grey
    # level, which is why features decoded on the GPU get their own cache key.
    assert torch.equal(via_bytes, via_pil)


def test_the_gpu_decoder_is_chosen_for_jpeg_files_on_cuda_only(tmp_path):
    jpeg = Catalog((_jpegs(tmp_path / "j", 3),), np.arange(3))
    (tmp_path / "p").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "p" / "0.png")
    png = Catalog((FileSplit(tmp_path / "p", ["0.png"], [0], ["a"]),), np.zeros(1, dtype=np.int64))
    plain, augmented = Preprocess(_backbone()), Preprocess(_backbone(), augment=True)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert gpu_decodable(jpeg, plain, cuda)
    assert not gpu_decodable(jpeg, plain, cpu)
    assert not gpu_decodable(jpeg, augmented, cuda)  # augmentation draws stay in order, on the CPU
    assert not gpu_decodable(png, plain, cuda)


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_store_decoding_bytes_serves_planned_and_unplanned_batches(tmp_path, monkeypatch, workers):
    """The decode-mode store with ``gpu_decode`` (here on the CPU decoder): planned batches come from the
    workers as bytes, other fetches are read in step; both equal the PIL path's images. The free heap
    is handed back before the worker forks (so it does not copy it), and only then."""
    monkeypatch.setenv("BENCH_LOADER_WORKERS", workers)
    trims: list[int] = []
    monkeypatch.setattr(inputs, "LIBC", SimpleNamespace(malloc_trim=trims.append))
    split, pre = _jpegs(tmp_path), Preprocess(_backbone())
    catalog = Catalog((split,), split.labels.copy())
    store = InputStore(catalog, pre, None, torch.device("cpu"), mode="decode", gpu_decode=True)
    plain = InputStore(catalog, pre, None, torch.device("cpu"), mode="decode")
    batches = [np.array([3, 1, 4]), np.array([0, 5]), np.array([9, 2, 6])]
    store.plan(batches)
    for ids in [batches[0], np.array([7, 8]), batches[1], batches[2]]:  # a method's own fetch in between
        assert torch.equal(store.get(ids), plain.get(ids))
    assert store.prefetched == (3 if workers == "1" else 0) and trims == ([0] if workers == "1" else [])


def _imagenet_tree(root, classes: int, train: int, val: int, seed: int) -> dict:
    """An ImageNet-layout folder of small JPEGs (``train/<wnid>/``, ``val/<wnid>/``) as a data source."""
    rng = np.random.default_rng(seed)
    for part, n in (("train", train), ("val", val)):
        for c in range(classes):
            folder = root / part / f"n{seed:02d}{c:04d}"
            folder.mkdir(parents=True)
            for i in range(n):
                base = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).resize((40, 40))
                base.save(folder / f"{i}.JPEG", quality=90)
    return {"source": "imagenet", "root": str(root), "train_per_class": train, "test_per_class": val}


def test_a_run_decoding_jpeg_bytes_in_batches_draws_and_scores_as_worker_decode(bench_cache, tmp_path, monkeypatch):
    """The device decoder's path (file bytes read by workers, each batch decoded at once by torchvision,
    here its CPU decoder) against the default one (each image decoded by PIL in a worker): a streamed
    trunk, so every training batch is decoded; the same batches drawn, the same curves to the bit."""
    from support import reduced_tiny

    from bench_stability_gap.harness.run import workbench
    from bench_stability_gap.harness.run.continual import run_cl
    from bench_stability_gap.harness.run.options import RunOptions
    from bench_stability_gap.harness.spec.protocol import Protocol
    from bench_stability_gap.methods.registry import build_method

    spec = reduced_tiny()
    spec.update(name="decode_jpeg_files", sessions=2)
    spec["pretrain_data"] = _imagenet_tree(tmp_path / "pre", 5, 24, 4, 1)
    spec["stream_data"] = [_imagenet_tree(tmp_path / "stream", 10, 12, 4, 2)]
    protocol = Protocol.model_validate(spec)
    opts = RunOptions(results_dir=tmp_path / "results", progress=False, log=False)
    monkeypatch.setenv("BENCH_TRUNK_CACHE", "stream")
    monkeypatch.setenv("BENCH_LOADER_WORKERS", "1")
    runs = []
    for batched in (False, True):
        if batched:  # the choice the harness makes on CUDA, made here for the CPU decoder
            monkeypatch.setattr(workbench, "gpu_decodable",
                                lambda catalog, pre, device: not pre.augment and all(s.all_jpeg() for s in catalog.splits))
        bench = workbench.prepare(protocol, 0, opts)
        assert bench.train_inputs.kind == "trunk-stream" and bench.train_inputs.gpu_decode == batched
        drawn: list[list[int]] = []
        get = bench.train_inputs.get
        monkeypatch.setattr(bench.train_inputs, "get", lambda ids, get=get: (drawn.append(list(ids)), get(ids))[1])
        _, method = build_method("vanilla", protocol.name)
        bench.train_inputs.prefetched = 0  # the first run also pre-trained the deployed model (cached after)
        curves, budget, _ = run_cl(bench, method, 0, opts)
        runs.append((drawn, [c.model_dump() for c in curves], budget.samples_trained, bench.train_inputs.prefetched))
    (drawn, curves, samples, prefetched), (drawn_b, curves_b, samples_b, prefetched_b) = runs
    assert drawn == drawn_b and len(drawn) > 0
    assert curves == curves_b and samples == samples_b
    assert prefetched == prefetched_b > 0  # both decoded the planned batches ahead, in workers
