"""Model inputs by sample id: preprocessed once, and through the frozen trunk once when cached.

Eval inputs never change and the trunk is frozen (BatchNorm in eval mode), so its outputs are an
exact function of the image: computing them once per run (and keeping them on disk across runs)
gives the same numbers as recomputing them at every eval point, at a fraction of the cost.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.transforms import v2 as T
from tqdm.auto import tqdm

from harness.atomic import atomic_write
from harness.protocol import Backbone
from harness.stream import Catalog

PREPROCESS_VERSION = 1


class Preprocess:
    """Images -> normalised float tensors at the protocol's input size (train augmentation optional)."""

    def __init__(self, spec: Backbone, augment: bool = False) -> None:
        self.size = spec.input_size
        self.mean = torch.tensor(spec.mean).view(1, 3, 1, 1)
        self.std = torch.tensor(spec.std).view(1, 3, 1, 1)
        self.augment = augment
        resize = [T.RandomResizedCrop(self.size), T.RandomHorizontalFlip()] if augment else [
            T.Resize(int(round(self.size / 0.875))),
            T.CenterCrop(self.size),
        ]
        self.pil = T.Compose([T.PILToTensor(), *resize])

    def arrays(self, batch: np.ndarray) -> Tensor:
        """Fast path for in-memory uint8 arrays (N×H×W or N×H×W×3): resize the whole batch at once."""
        x = torch.from_numpy(np.ascontiguousarray(batch)).float().div_(255.0)
        x = x.unsqueeze(1).expand(-1, 3, -1, -1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
        if x.shape[-1] != self.size or x.shape[-2] != self.size:
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return (x - self.mean) / self.std

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
        return torch.stack(out)  # type: ignore[arg-type]


class InputStore:
    """Inputs for the model by global id: trunk features (cached) or preprocessed images (uncached)."""

    def __init__(self, catalog: Catalog, preprocess: Preprocess, trunk: nn.Module | None,
                 device: torch.device, cache_key: str | None = None, cache_root: Path | None = None,
                 chunk: int = 512, desc: str = "trunk features") -> None:
        self.catalog, self.preprocess, self.device = catalog, preprocess, device
        self.cached = trunk is not None
        self.table: Tensor | None = None
        if trunk is not None:
            self.table = self._load_or_compute(trunk, cache_key, cache_root, chunk, desc)

    def _load_or_compute(self, trunk: nn.Module, key: str | None, root: Path | None, chunk: int, desc: str) -> Tensor:
        path = root / f"{key}.pt" if key and root else None
        if path is not None and path.is_file():
            return torch.load(path, map_location="cpu", weights_only=True)
        ids = np.flatnonzero(self.catalog.labels >= 0)
        table: Tensor | None = None
        trunk.eval()
        with torch.no_grad():
            for start in tqdm(range(0, len(ids), chunk), desc=desc, unit="batch", leave=False):
                part = ids[start : start + chunk]
                feats = trunk(self.preprocess.images(self.catalog, part).to(self.device)).float().cpu()
                if table is None:
                    table = torch.zeros(len(self.catalog), *feats.shape[1:])
                table[torch.from_numpy(part)] = feats
        assert table is not None, "catalog has no labelled samples"
        if path is not None:
            atomic_write(path, lambda fh: torch.save(table, fh))
        return table

    def get(self, ids: np.ndarray) -> Tensor:
        if self.table is not None:
            return self.table[torch.from_numpy(np.asarray(ids, dtype=np.int64))].to(self.device)
        return self.preprocess.images(self.catalog, np.asarray(ids)).to(self.device)


def feature_cache_key(spec: Backbone, sources: list, split: str) -> str:
    """Trunk outputs depend only on the backbone's trunk, the preprocessing and the data."""
    blob = json.dumps(
        {"backbone": spec.model_dump(mode="json"), "sources": [s.model_dump(mode="json") for s in sources],
         "split": split, "v": PREPROCESS_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]
