"""Decoded datasets kept in the bench cache, so a process opens them in milliseconds.

Parsing MNIST-5k's CSV (pandas included) and decompressing Fashion-MNIST's IDX files cost 1-3 s of CPU in
every process that opens them: every `bench run`, every sweep or Ray task, a cost larger than a reduced
protocol's whole training. The arrays are stored once as ``.npy`` files under ``<cache>/decoded/``, in a
folder named for the source files they came from (path, size and modification time: a changed or moved
file makes a new folder), and loaded from there.

A folder is complete when its ``meta.json`` exists: it is written last and records each array's sha256,
checked at every load (about 40 ms for Fashion-MNIST's 55 MB). A folder that fails is named, moved aside
and rebuilt; a cache that cannot be written (a read-only or full disk) costs the decoding time, never
the run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TypeVar, cast

import numpy as np

from ..atomic import StorageFault, atomic_write, atomic_write_text, move_aside
from ..paths import cache_dir_path

FORMAT = 1
Arrays = tuple[np.ndarray, ...]
T = TypeVar("T", bound=Arrays)


def _warn(message: str) -> None:
    print(f"Warning: {message}", file=sys.stderr)


def folder_for(name: str, files: Sequence[Path]) -> Path:
    """The cache folder of ``name`` decoded from ``files``: it changes when any of them is replaced."""
    stats = [(p.resolve(), p.stat()) for p in files]
    key = hashlib.sha256(json.dumps([FORMAT, name] + [[str(p), st.st_size, st.st_mtime_ns] for p, st in stats])
                         .encode()).hexdigest()
    return cache_dir_path() / "decoded" / f"{name}-{key[:16]}"


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).data).hexdigest()


def _load(folder: Path) -> Arrays:
    """The folder's arrays, each checked against the sha256 ``meta.json`` records (ValueError if any fails)."""
    meta = json.loads((folder / "meta.json").read_text())
    arrays = []
    for k, digest in enumerate(meta["sha256"]):
        array = np.load(folder / f"{k}.npy", allow_pickle=False)
        if _digest(array) != digest:
            raise ValueError(f"{k}.npy does not match its sha256")
        arrays.append(array)
    return tuple(arrays)


def _save(fh: IO[bytes], array: np.ndarray) -> None:
    np.save(fh, array, allow_pickle=False)


def _store(folder: Path, arrays: Arrays) -> None:
    for k, array in enumerate(arrays):
        atomic_write(folder / f"{k}.npy", functools.partial(_save, array=array), durable=False)
    atomic_write_text(folder / "meta.json", json.dumps({"format": FORMAT, "sha256": [_digest(a) for a in arrays]}))


def decoded(name: str, files: Sequence[Path], decode: Callable[[], T], warn: Callable[[str], None] = _warn) -> T:
    """``decode()``'s arrays, read from the cache when a verified copy of them is stored, else decoded
    and stored. The arrays come back read-only, as the sources hand them out."""
    folder = folder_for(name, files)
    arrays: T | None = None
    if (folder / "meta.json").is_file():
        try:
            arrays = cast(T, _load(folder))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            aside = move_aside(folder)
            warn(f"decoded-data cache {folder} failed verification ({exc}); moved to {aside} and rebuilt.")
    if arrays is None:
        arrays = decode()
        try:
            _store(folder, arrays)
        except (OSError, StorageFault) as exc:  # the run goes on from the decoded arrays; only the next one pays again
            warn(f"could not store decoded {name} under {folder} ({str(exc).splitlines()[0]}); the next run "
                 f"decodes it again.")
    for array in arrays:
        array.setflags(write=False)
    return arrays
