"""Trunk features on disk: raw rows in shards, memory-mapped one shard at a time.

A paper-size eval set's trunk outputs (57,300 x 96 x 28 x 28 float32 = 17 GB for cil_places_lt) do
not belong in RAM. They are written once, row by row in the order they are computed (so writing
needs one batch of memory), in the dtype the trunk produced them in (bf16 under CUDA autocast: half
the bytes, and the same numbers an uncached run feeds the body), and read back by memory-mapping
only the shard a row lives in. At most ``OPEN_SHARDS`` shards stay mapped, so the pages a read
touches leave the process's resident set when their shard is unmapped (they stay in the OS page
cache, which is what makes the next evaluation fast).

A folder is complete when its ``meta.json`` exists: it is written last, after the shards were
renamed into place, so an interrupted pass leaves no half cache that a later run would trust. It
records each shard's size and sha256 and the cache key the folder was made for; ``open_verified``
checks them before a run uses the folder, and a folder that fails is named, moved aside and rebuilt.
Concurrent runs build a folder once: the build holds a file lock and re-checks after taking it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..atomic import move_aside

SHARD_BYTES = 256 * 2**20
OPEN_SHARDS = 2
_NUMPY = {"float32": np.float32, "bfloat16": np.int16, "float16": np.float16}  # bf16 kept as its bits


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class FeatureShards:
    """Read side of a complete shard folder: ``rows`` rows of ``shape``, float32 on the way out."""

    def __init__(self, folder: Path) -> None:
        meta = json.loads((folder / "meta.json").read_text())
        self.folder = folder
        self.rows, self.shape, self.dtype = int(meta["rows"]), tuple(meta["shape"]), str(meta["dtype"])
        self.rows_per_shard = int(meta["rows_per_shard"])
        self.row_elems = int(np.prod(self.shape))
        self._open: OrderedDict[int, np.memmap] = OrderedDict()

    @staticmethod
    def complete(folder: Path) -> bool:
        return (folder / "meta.json").is_file()

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_elems * np.dtype(_NUMPY[self.dtype]).itemsize

    def _shard(self, k: int) -> np.memmap:
        if k in self._open:
            self._open.move_to_end(k)
            return self._open[k]
        while len(self._open) >= OPEN_SHARDS:
            self._open.popitem(last=False)  # unmapped when the last reference goes
        n = min(self.rows_per_shard, self.rows - k * self.rows_per_shard)
        mm = np.memmap(self.folder / f"shard_{k:05d}.bin", dtype=_NUMPY[self.dtype], mode="r",
                       shape=(n, self.row_elems))
        self._open[k] = mm
        return mm

    @property
    def stored_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def _as_stored(self, array: np.ndarray) -> Tensor:
        t = torch.from_numpy(np.array(array, copy=True))  # a private copy: the map may close
        return t.view(torch.bfloat16) if self.dtype == "bfloat16" else t

    def read(self, rows: np.ndarray, stored: bool = False) -> Tensor:
        """Rows by index (any order), shaped ``(len(rows), *shape)``: float32, or with ``stored`` in the
        dtype they are stored in (fewer bytes to copy to a device, which converts them there)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = torch.empty(len(rows), self.row_elems, dtype=self.stored_dtype if stored else torch.float32)
        shard_of = rows // self.rows_per_shard
        for k in np.unique(shard_of):
            pick = np.flatnonzero(shard_of == k)
            local = rows[pick] - k * self.rows_per_shard
            out[torch.from_numpy(pick)] = self._as_stored(self._shard(int(k))[local]).to(out.dtype)
        return out.view(len(rows), *self.shape)

    def load_all(self, stored: bool = False, device: torch.device | str = "cpu") -> Tensor:
        """The whole table in memory, float32 in RAM by default; with ``stored``, in the stored dtype
        on ``device`` (copied one shard at a time, so the host never holds the whole table)."""
        out = torch.empty(self.rows, self.row_elems, dtype=self.stored_dtype if stored else torch.float32,
                          device=device)
        for k in range(-(-self.rows // self.rows_per_shard)):
            start = k * self.rows_per_shard
            mm = self._shard(k)
            out[start : start + len(mm)] = self._as_stored(mm).to(out.dtype)
        self._open.clear()
        return out.view(self.rows, *self.shape)

    def close(self) -> None:
        self._open.clear()


def write_shards(folder: Path, rows: int, batches: Iterable[Tensor]) -> FeatureShards:
    """Write ``rows`` feature rows, arriving in order in batches, as a shard folder (atomic: built
    under a temporary name, renamed, ``meta.json`` last)."""
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    written, shard, fh, per_shard, shape, dtype = 0, 0, None, 0, None, None
    digests: list[str] = []
    digest = hashlib.sha256()
    try:
        for batch in batches:
            batch = batch.detach().cpu().contiguous()
            if shape is None:
                shape, dtype = tuple(batch.shape[1:]), dtype_name(batch.dtype)
                if dtype not in _NUMPY:
                    raise TypeError(f"trunk features of dtype {dtype} cannot be stored")
                row_bytes = int(np.prod(shape)) * batch.element_size()
                per_shard = max(1, SHARD_BYTES // row_bytes)
            raw = (batch.view(torch.int16) if dtype == "bfloat16" else batch).numpy().reshape(len(batch), -1)
            pos = 0
            while pos < len(raw):
                if fh is None:
                    fh = open(tmp / f"shard_{shard:05d}.bin", "wb")
                in_shard = written % per_shard
                take = min(len(raw) - pos, per_shard - in_shard)
                chunk = raw[pos : pos + take].tobytes()
                fh.write(chunk)
                digest.update(chunk)
                pos, written = pos + take, written + take
                if written % per_shard == 0:
                    fh.close()
                    fh, shard = None, shard + 1
                    digests.append(digest.hexdigest())
                    digest = hashlib.sha256()
        if fh is not None:
            fh.close()
            fh = None
            digests.append(digest.hexdigest())
        if written != rows:
            raise RuntimeError(f"feature pass wrote {written} rows, expected {rows}")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        meta = {"rows": rows, "shape": list(shape or ()), "dtype": dtype, "rows_per_shard": per_shard,
                "sha256": digests, "key": folder.name}
        (folder / "meta.json.tmp").write_text(json.dumps(meta))
        (folder / "meta.json.tmp").rename(folder / "meta.json")
    finally:
        if fh is not None:
            fh.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return FeatureShards(folder)


def problem(folder: Path) -> str | None:
    """Why a complete shard folder cannot be trusted (None: it can): an unreadable meta.json, a folder
    made for another key, a shard missing, of the wrong size, or whose bytes are not what was written."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        rows, per, digests = int(meta["rows"]), int(meta["rows_per_shard"]), list(meta["sha256"])
        row_bytes = int(np.prod(meta["shape"])) * np.dtype(_NUMPY[meta["dtype"]]).itemsize
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its meta.json is unreadable or from an older bench ({type(exc).__name__}: {exc})"
    if meta.get("key") != folder.name:
        return f"it was made for cache key {meta.get('key')!r}"
    if len(digests) != -(-rows // per):
        return f"meta.json lists {len(digests)} shard hashes for {-(-rows // per)} shards"
    for k, expected in enumerate(digests):
        path = folder / f"shard_{k:05d}.bin"
        size = min(per, rows - k * per) * row_bytes
        if not path.is_file() or path.stat().st_size != size:
            return f"{path.name} is missing or not {size} bytes"
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
        if h.hexdigest() != expected:
            return f"{path.name}'s content does not match its sha256"
    return None


def open_verified(folder: Path, rows: int, batches: Callable[[], Iterable[Tensor]],
                  warn: Callable[[str], None]) -> FeatureShards:
    """The shard folder, verified, built once under a file lock when missing or failing verification."""
    from filelock import FileLock

    with FileLock(str(folder) + ".lock"):
        if FeatureShards.complete(folder) and (why := problem(folder)) is not None:
            aside = move_aside(folder)
            warn(f"Trunk feature cache {folder} failed verification ({why}); moved to {aside} and rebuilt.")
        if not FeatureShards.complete(folder):
            for stale in folder.parent.glob(folder.name + ".tmp*"):  # a killed writer's; none is live under the lock
                warn(f"Removing {stale}, left by an interrupted trunk pass.")
                shutil.rmtree(stale, ignore_errors=True)
            write_shards(folder, rows, batches())
    return FeatureShards(folder)
