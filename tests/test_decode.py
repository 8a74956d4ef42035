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
