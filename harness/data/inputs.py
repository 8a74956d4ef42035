"""Model inputs by sample id: preprocessed once, and through the frozen trunk once when cached.

Eval inputs never change and the trunk is frozen (BatchNorm in eval mode), so its outputs are an
exact function of the image: computing them once per run (and keeping them on disk across runs)
gives the same numbers as recomputing them at every eval point, at a fraction of the cost.

Without the trunk cache (``--no-trunk-cache``) a store without augmentation still decodes and
preprocesses every image once per run and keeps the float tensors in memory when they fit
(``BENCH_IMAGE_CACHE_GB``, default 4): same numbers, no repeated decoding. Bulk decoding of image
files (real datasets) goes through a torch DataLoader with worker processes
(``BENCH_LOADER_WORKERS``) and pinned memory on CUDA; the embedded in-memory arrays keep their
vectorised path in the main process. Images decoded per batch (augmentation, or too many to keep)
are decoded in a thread pool when no augmentation draws random numbers, else in order in the main
process (reproducible augmentation).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.transforms import v2 as T
from tqdm.auto import tqdm

from ..environment import IMAGE_CACHE_GB, LOADER_WORKERS
from ..model.cpu import LIBC, TRUNK_PASS_CHUNK, in_cpu_chunks
from ..model.device import to_device
from ..model.module_copy import deepcopy_with_modules
from ..progress_bar import progress_bar
from ..spec.protocol import Backbone
from .features import FeatureShards, open_verified
from .resident import RowsAhead, placement
from .stream import Catalog

PREPROCESS_VERSION = 1
DEVICE_TABLE_BYTES = 1 << 30  # on CUDA, a cached table up to this size lives on the device
# Images per trunk-pass batch: at 224 px a ConvNeXt stage-0 block holds 2.4 MB of activations per
# image (4x expansion of 96x56x56, float32), so 512 images peak at ~3.4 GB resident; 128 at < 1 GB.
TRUNK_CHUNK = 128


def workers_from(loader: torch.utils.data.DataLoader) -> Iterator:
    """``iter(loader)``, which forks its workers, set up so that they copy little of this process: the
    allocator's free heap pages are handed back to the OS first (glibc ``malloc_trim``), and the
    objects alive now are out of the garbage collector's reach while forking (``gc.freeze``; a child's
    collection would otherwise write to every one of them, copying their pages). At paper scale a
    worker had otherwise copied ~1.2 GB of this process's heap."""
    if not loader.num_workers:
        return iter(loader)
    trim = getattr(LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)
    gc.freeze()
    try:
        return iter(loader)
    finally:
        gc.unfreeze()  # this process collects as before; the workers keep their frozen copies


def image_cache_bytes() -> int:
    """How many bytes of preprocessed images an uncached store may keep in memory."""
    given = IMAGE_CACHE_GB.read()
    return int((4.0 if given is None else given) * 2**30)


def loader_workers() -> int:
    """DataLoader worker processes for decoding image files ($BENCH_LOADER_WORKERS, else cores - 1, <= 8)."""
    given = LOADER_WORKERS.read()
    if given is not None:
        return int(given)
    return max(0, min(8, (os.cpu_count() or 1) - 1))


class Preprocess:
    """Images -> normalised float tensors at the protocol's input size (train augmentation optional)."""

    def __init__(self, spec: Backbone, augment: bool = False) -> None:
        self.size = spec.input_size
        self.mean = torch.tensor(spec.mean).view(1, 3, 1, 1)
        self.std = torch.tensor(spec.std).view(1, 3, 1, 1)
        self.augment = augment
        self.resize = T.Compose([T.RandomResizedCrop(self.size), T.RandomHorizontalFlip()] if augment else [
            T.Resize(int(round(self.size / 0.875))),
            T.CenterCrop(self.size),
        ])
        self.pil = T.Compose([T.PILToTensor(), self.resize])

    def decoded(self, images: Sequence[Tensor]) -> Tensor:
        """Decoded uint8 C×H×W images (any device, e.g. from the GPU JPEG decoder) -> a normalised
        batch on that device: the steps ``one`` takes after decoding, in the same order."""
        x = torch.stack([self.resize(img) for img in images]).float().div_(255.0)
        return (x - self.mean.to(x.device)) / self.std.to(x.device)

    def arrays(self, batch: np.ndarray) -> Tensor:
        """Fast path for in-memory uint8 arrays (N×H×W or N×H×W×3): resize the whole batch at once."""
        x = torch.from_numpy(np.ascontiguousarray(batch)).float().div_(255.0)
        x = x.unsqueeze(1).expand(-1, 3, -1, -1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
        if x.shape[-1] != self.size or x.shape[-2] != self.size:
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return (x - self.mean) / self.std

    def one(self, split, local: int) -> Tensor:
        """One sample of one split, exactly as ``images`` preprocesses it (array path where it applies)."""
        array = getattr(split, "array", None)
        if array is not None and not self.augment:
            return self.arrays(array[local : local + 1])[0]
        img = self.pil(split.image(int(local))).float().div_(255.0).unsqueeze(0)
        return ((img - self.mean) / self.std)[0]

    def vectorised(self, catalog: Catalog, ids: np.ndarray) -> bool:
        """True when every id lies in an in-memory array split and no augmentation applies."""
        if self.augment:
            return False
        ks = np.unique(np.searchsorted(catalog.offsets, ids, side="right") - 1)
        return all(getattr(catalog.splits[k], "array", None) is not None for k in ks)

    def images(self, catalog: Catalog, ids: np.ndarray) -> Tensor:
        """Decode and preprocess the given global ids (array fast path where the split allows it)."""
        out: list[Tensor | None] = [None] * len(ids)
        by_split: dict[int, list[tuple[int, int]]] = {}
        for pos, gid in enumerate(ids):
            k = int(np.searchsorted(catalog.offsets, gid, side="right") - 1)
            by_split.setdefault(k, []).append((pos, int(gid - catalog.offsets[k])))
        for k, items in by_split.items():
            split = catalog.splits[k]
            positions = [p for p, _ in items]
            locals_ = np.array([i for _, i in items])
            array = getattr(split, "array", None)
            if array is not None and not self.augment:
                batch = self.arrays(array[locals_])
                for p, row in zip(positions, batch):
                    out[p] = row
            else:
                for p, i in zip(positions, locals_):
                    img = self.pil(split.image(int(i))).float().div_(255.0).unsqueeze(0)
                    out[p] = ((img - self.mean) / self.std)[0]
        return torch.stack(out)  # type: ignore[arg-type]  # every position was filled above


class CatalogImages(torch.utils.data.Dataset):
    """Preprocessed images of a catalog by position in ``ids`` (what DataLoader workers map over)."""

    def __init__(self, catalog: Catalog, preprocess: Preprocess, ids: np.ndarray) -> None:
        self.catalog, self.preprocess, self.ids = catalog, preprocess, np.asarray(ids, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Tensor:
        split, local = self.catalog.locate(int(self.ids[i]))
        return self.preprocess.one(split, local)


class EncodedImages(torch.utils.data.Dataset):
    """Undecoded file bytes of a catalog by position in ``ids``: DataLoader workers read, the GPU decodes."""

    def __init__(self, catalog: Catalog, ids: np.ndarray) -> None:
        self.catalog, self.ids = catalog, np.asarray(ids, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Tensor:
        split, local = self.catalog.locate(int(self.ids[i]))
        return torch.from_numpy(split.encoded(local))


def gpu_decodable(catalog: Catalog, preprocess: Preprocess, device: torch.device) -> bool:
    """JPEG decoding on the GPU (nvJPEG through torchvision) applies on CUDA to image files that are all
    JPEGs, without augmentation (whose random draws stay in the main process, in order)."""
    return device.type == "cuda" and not preprocess.augment and all(s.all_jpeg() for s in catalog.splits)


def decode_on(device: torch.device, preprocess: Preprocess, encoded: Sequence[Tensor]) -> Tensor:
    """JPEG bytes -> a normalised batch, decoded on ``device`` (nvJPEG on CUDA, libjpeg on the CPU)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    images = decode_jpeg(list(encoded), mode=ImageReadMode.RGB, device=device)
    return preprocess.decoded(images)


def _as_list(batch: list[Tensor]) -> list[Tensor]:
    """DataLoader collate for undecoded files (lengths differ, so no stacking)."""
    return batch


class InputStore:
    """Inputs for the model by global id, held the way ``mode`` says (``harness.data.datapath`` decides):

    - ``trunk-ram``: trunk features computed once (kept on disk across runs), loaded into RAM;
    - ``trunk-disk``: the same features, memory-mapped from disk one shard at a time;
    - ``trunk-stream``: images decoded and put through the (frozen) trunk at every fetch: the
      features an on-disk cache would hold, for a split too big to store or not worth storing;
    - ``images``: preprocessed images kept in RAM for the run (no trunk cache);
    - ``decode``: images decoded at every fetch (augmentation, or too many images to keep).

    ``cached`` says whether ``get`` returns trunk features. ``seen`` marks the ids fetched since
    ``reset_seen`` (FLOP accounting charges a stored trunk once per distinct image; a streaming
    one runs at every fetch).

    When the harness knows its next training batches (``plan``), a store that decodes image files
    at every fetch has DataLoader workers decode them ahead, while the model computes; ``get`` of
    exactly the next planned ids takes the decoded batch, any other ``get`` decodes as before.
    """

    def __init__(self, catalog: Catalog, preprocess: Preprocess, trunk: nn.Module | None,
                 device: torch.device, cache_key: str | None = None, cache_root: Path | None = None,
                 chunk: int = TRUNK_CHUNK, desc: str = "trunk features", keep_images: bool = True,
                 amp: bool = False, progress: bool = True, mode: str | None = None, gpu_decode: bool = False) -> None:
        self.catalog, self.preprocess, self.device = catalog, preprocess, torch.device(device)
        self.gpu_decode = gpu_decode  # JPEG files read by workers, decoded on the device (``gpu_decodable``)
        self.amp = amp and self.device.type == "cuda"  # bf16 autocast for the trunk pass on CUDA
        self.channels_last = self.device.type == "cuda"
        self.table: Tensor | None = None
        self.shards: FeatureShards | None = None
        self.trunk: nn.Module | None = None
        self.row_of: np.ndarray | None = None  # global id -> table row, when the table holds labelled ids only
        self._rows_ahead: RowsAhead | None = None  # announced reads of streamed shards (``read_ahead``)
        self.seen = np.zeros(len(catalog), dtype=bool)
        self.fetched = 0
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: deque[np.ndarray] = deque()  # planned batches not taken yet, in order
        self._ahead_images: Iterator[Tensor] | None = None
        self.prefetched = 0  # batches taken from the workers (what tests and the progress line read)
        self.progress = progress
        if mode is None:  # no plan: trunk features in RAM when a trunk is given, else images if they fit
            fits = int((catalog.labels >= 0).sum()) * 4 * 3 * preprocess.size**2 <= image_cache_bytes()
            mode = "trunk-ram" if trunk is not None else (
                "images" if keep_images and not preprocess.augment and fits else "decode")
        if mode.startswith("trunk") and trunk is None:
            raise ValueError(f"input mode {mode!r} needs the trunk")
        self.kind = mode
        self.cached = mode.startswith("trunk")
        if mode in ("trunk-ram", "trunk-disk") and trunk is not None:  # (without a trunk: refused above)
            self._index_labelled()
            folder = cache_root / key_folder(cache_key, catalog) if cache_key and cache_root else None
            if folder is None:  # nowhere to keep them: computed for this store only, in RAM
                self.kind = "trunk-ram"
                self.table = torch.cat([f.float() for f in self._trunk_pass(trunk, chunk, desc)])
            else:
                self.shards = open_verified(folder, len(self._labelled()),
                                            lambda: self._trunk_pass(trunk, chunk, desc), tqdm.write)
                if placement(self.shards.nbytes, self.device) == "resident":  # on the device, stored dtype
                    self.table, self.shards = self.shards.load_all(stored=True, device=self.device), None
                elif mode == "trunk-ram":
                    self.table, self.shards = self.shards.load_all(), None
        elif mode == "trunk-stream" and trunk is not None:
            self.trunk = deepcopy_with_modules(trunk).eval()  # its own copy: a run's FLOP hooks never see it
            for p in self.trunk.parameters():
                p.requires_grad_(False)
        elif mode == "images":
            self.table = self._preprocessed(chunk)
        elif mode != "decode":
            raise ValueError(f"unknown input mode {mode!r}")
        # CUDA: a table small enough lives on the GPU (no copy per batch)
        if self.table is not None and self.device.type == "cuda":
            if self.table.numel() * self.table.element_size() <= DEVICE_TABLE_BYTES:
                self.table = self.table.to(self.device)

    def _labelled(self) -> np.ndarray:
        return np.flatnonzero(self.catalog.labels >= 0)

    def _index_labelled(self) -> np.ndarray:
        ids = self._labelled()
        self.row_of = np.full(len(self.catalog), -1, dtype=np.int64)
        self.row_of[ids] = np.arange(len(ids))
        return ids

    def _batches(self, ids: np.ndarray, chunk: int) -> Iterator[tuple[np.ndarray, Tensor]]:
        """Preprocessed images of ``ids`` in chunks, in order: vectorised for in-memory arrays, a
        DataLoader with worker processes (pinned memory on CUDA) for image files."""
        if self.preprocess.vectorised(self.catalog, ids):
            for start in range(0, len(ids), chunk):
                part = ids[start : start + chunk]
                yield part, self.preprocess.images(self.catalog, part)
            return
        workers = loader_workers()
        loader = torch.utils.data.DataLoader(
            self._dataset(ids), batch_size=chunk, shuffle=False, num_workers=workers,
            pin_memory=self.device.type == "cuda" and not self.gpu_decode, persistent_workers=False,
            prefetch_factor=4 if workers else None, collate_fn=_as_list if self.gpu_decode else None,
        )
        for start, batch in zip(range(0, len(ids), chunk), workers_from(loader)):
            yield ids[start : start + chunk], self._finish(batch)

    def _dataset(self, ids: np.ndarray) -> torch.utils.data.Dataset:
        """What DataLoader workers produce for ``ids``: file bytes for the GPU decoder, else images."""
        return (EncodedImages(self.catalog, ids) if self.gpu_decode
                else CatalogImages(self.catalog, self.preprocess, ids))

    def _finish(self, batch: Tensor | list[Tensor]) -> Tensor:
        """A worker's batch as preprocessed images (decoded on the device when it holds file bytes)."""
        return decode_on(self.device, self.preprocess, batch) if isinstance(batch, list) else batch

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        """The table's (or the shards') rows of global ``ids``: the ids themselves when it holds every id."""
        return ids if self.row_of is None else self.row_of[ids]

    def _preprocessed(self, chunk: int) -> Tensor:
        """Every labelled image, preprocessed once, one row each (``row_of`` maps ids to rows)."""
        ids = self._index_labelled()
        table = torch.empty(len(ids), 3, self.preprocess.size, self.preprocess.size)
        for part, images in self._batches(ids, chunk):
            table[torch.from_numpy(self._rows(part))] = images.cpu()
        return table

    def _features(self, trunk: nn.Module, images: Tensor) -> Tensor:
        """The trunk's output for a batch of images, in the dtype it produces (bf16 under autocast)."""
        x = images.to(self.device, non_blocking=True)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else nullcontext()
        with torch.no_grad(), autocast:
            return in_cpu_chunks(trunk, x, TRUNK_PASS_CHUNK)

    def _trunk_pass(self, trunk: nn.Module, chunk: int, desc: str) -> Iterator[Tensor]:
        """Trunk features of every labelled sample, in id order, one batch at a time (CPU)."""
        ids = self._labelled()
        if len(ids) == 0:
            raise ValueError("catalog has no labelled samples")
        trunk.eval()
        batches = self._batches(ids, chunk)
        for _, images in progress_bar(self.progress, lines=False, iterable=batches, total=-(-len(ids) // chunk),
                                      desc=desc, unit="batch", leave=False):
            yield self._features(trunk, images).cpu()

    def reset_seen(self) -> None:
        self.seen[:] = False
        self.fetched = 0

    def distinct_seen(self) -> int:
        """Trunk passes the fetches since ``reset_seen`` cost: one per distinct image when the
        features are stored, one per fetch when they stream."""
        return self.fetched if self.kind == "trunk-stream" else int(self.seen.sum())

    def _decode(self, ids: np.ndarray) -> Tensor:
        if self.gpu_decode:  # every image the same way: file bytes, decoded on the device
            encoded = [torch.from_numpy(split.encoded(local)) for split, local in map(self.catalog.locate, ids)]
            return decode_on(self.device, self.preprocess, encoded)
        if self.preprocess.augment or self.preprocess.vectorised(self.catalog, ids) or len(ids) < 4:
            return self.preprocess.images(self.catalog, ids)  # in order: augmentation draws stay reproducible
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max(1, loader_workers()), thread_name_prefix="bench-decode")
        located = [self.catalog.locate(int(g)) for g in ids]
        return torch.stack(list(self._pool.map(lambda sl: self.preprocess.one(*sl), located)))

    def plan(self, batches: Sequence[np.ndarray]) -> None:
        """The harness's next training batches, in the order it will ``get`` them: decoded ahead by
        DataLoader workers when this store decodes image files (without augmentation, whose draws must
        stay in order) at every fetch; otherwise nothing to do. A new plan replaces the old one."""
        self.end_plan()
        workers = loader_workers()
        if self.kind not in ("trunk-stream", "decode") or self.preprocess.augment or not batches or not workers:
            return
        ids = np.concatenate(batches).astype(np.int64)
        if self.preprocess.vectorised(self.catalog, ids):  # in-memory arrays: decoding is a vectorised copy
            return
        bounds = np.cumsum([0] + [len(b) for b in batches])
        loader = torch.utils.data.DataLoader(
            self._dataset(ids), batch_sampler=[list(range(int(a), int(b))) for a, b in zip(bounds[:-1], bounds[1:])],
            num_workers=workers, pin_memory=self.device.type == "cuda" and not self.gpu_decode, prefetch_factor=2,
            collate_fn=_as_list if self.gpu_decode else None,
        )
        self._ahead, self._ahead_images = deque(np.asarray(b, dtype=np.int64) for b in batches), workers_from(loader)

    def read_ahead(self, batches: Sequence[np.ndarray], on_cpu: bool = False) -> None:
        """The next ``get``s, in order (an evaluation's batches): when this store streams its trunk
        features from shards to CUDA (or ``on_cpu``), they are read and copied ahead (``RowsAhead``)."""
        self.end_read_ahead()
        if self.shards is not None and batches and (self.device.type == "cuda" or on_cpu):
            self._rows_ahead = RowsAhead(self.shards, [self._rows(np.asarray(b, dtype=np.int64)) for b in batches],
                                         self.device)

    def end_read_ahead(self) -> None:
        if self._rows_ahead is not None:
            self._rows_ahead.close()
            self._rows_ahead = None

    def end_plan(self) -> None:
        """Drop what is left of the plan (its workers stop)."""
        self._ahead, self._ahead_images = deque(), None

    def _images(self, ids: np.ndarray) -> Tensor:
        """Preprocessed images of ``ids``: the workers' batch when ``ids`` is the next planned one."""
        if self._ahead and len(self._ahead[0]) == len(ids) and np.array_equal(self._ahead[0], ids):
            self._ahead.popleft()
            images = self._finish(next(self._ahead_images))  # type: ignore[arg-type]  # set with _ahead
            self.prefetched += 1
            if not self._ahead:
                self.end_plan()
            return images
        return self._decode(ids)

    def get(self, ids: np.ndarray) -> Tensor:
        ids = np.asarray(ids, dtype=np.int64)
        self.seen[ids] = True
        self.fetched += len(ids)
        if self.trunk is not None:  # streaming trunk: features computed now, already on the device
            rows = self._features(self.trunk, self._images(ids)).float()
            return rows.contiguous(memory_format=torch.channels_last) if self.channels_last and rows.ndim == 4 else rows
        if self.table is not None:
            index = torch.from_numpy(self._rows(ids))
            rows = self.table.index_select(0, to_device(index, self.table.device))
            if self.cached:  # a resident table keeps the stored dtype; the model gets float32
                rows = rows.float()
        elif self.shards is not None:
            ahead = self._rows_ahead.take(self._rows(ids)) if self._rows_ahead is not None else None
            rows = ahead if ahead is not None else self.shards.read(self._rows(ids))
        else:
            rows = self._images(ids)
        rows = to_device(rows, self.device)
        if self.device.type != "cuda":
            return rows
        return rows.contiguous(memory_format=torch.channels_last) if rows.ndim == 4 else rows


def key_folder(key: str, catalog: Catalog) -> str:
    """The shard folder of a feature cache key for ``catalog``: the shards hold its labelled samples
    only, whose set depends on the protocol (classes that never enter the stream are unlabelled),
    so it is part of the name (``v2``: sharded raw rows; ``v1`` was one .pt file per key)."""
    labelled = np.flatnonzero(catalog.labels >= 0).astype(np.int64)
    return f"{key}-{hashlib.sha256(labelled.tobytes()).hexdigest()[:12]}.v2"


def feature_cache_key(spec: Backbone, sources: list, split: str, variant: str = "", weights: str = "") -> str:
    """Trunk outputs depend only on the backbone's trunk, the weights' content (``weights``: the
    digest ``backbone.weights_digest`` gives; a path alone would survive the file being replaced),
    the preprocessing, the data and the precision they were computed in (``variant``: "" for
    float32, e.g. "cuda-bf16" under autocast)."""
    content = {"backbone": spec.model_dump(mode="json"), "sources": [s.model_dump(mode="json") for s in sources],
               "split": split, "v": PREPROCESS_VERSION, "weights": weights}
    if variant:
        content["variant"] = variant
    blob = json.dumps(content, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]
