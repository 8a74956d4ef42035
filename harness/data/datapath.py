"""Where a run's inputs live: decided per protocol, before any compute, from the catalog's size, the
trunk's output size and the free RAM and disk.

At paper size the frozen trunk's outputs do not fit in RAM (cil_places_lt's training set: 1.34 M x
192 x 14 x 14 float32 = 202 GB; its eval set 8.6 GB). The rules, one per split:

* **eval set** (evaluated at every eval point): trunk features computed once and kept on disk when
  they fit there (``trunk-disk``, memory-mapped), loaded into RAM when they also fit a quarter of the
  RAM budget (``trunk-ram``); else decoded and put through the trunk at every eval (``trunk-stream``).
* **training set**: the same, except that features too big for RAM are stored on disk only when
  the trunk pass pays for itself within one run (the protocol's training fetches, a CL run plus its
  joint reference and pre-training, reach the number of training images); otherwise, and with
  augmentation, the trunk runs on every fetch (``trunk-stream``).
* ``--no-trunk-cache``: preprocessed images in RAM when they fit ``BENCH_IMAGE_CACHE_GB`` (``images``),
  else decoded at every fetch (``decode``).

``BENCH_RAM_GB`` (default: half the memory available now) and ``BENCH_DISK_GB`` (default: free space
of the cache folder, less ``DISK_RESERVE``) set the budgets; ``BENCH_TRUNK_CACHE`` = ram | disk |
stream pins the mode of both splits (auto by default). A pinned mode that does not fit, or a run
whose bookkeeping alone exceeds the RAM budget, is a BenchError naming the numbers and the setting
that would fit, raised before any trunk pass.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..environment import DISK_GB, RAM_GB, trunk_cache_setting
from ..errors import BenchError
from ..spec.protocol import Protocol
from .features import FeatureShards, dtype_name
from .inputs import TRUNK_CHUNK, image_cache_bytes, key_folder, loader_workers
from .old_mix import SessionMix, describe_old_mix
from .stream import Stream

GB = 2**30
DISK_RESERVE = 2 * GB          # left free on the cache's disk whatever the plan
RAM_TABLE_SHARE = 4            # a split's features go to RAM only when they fit 1/4 of the RAM budget
BOOKKEEPING_PER_SAMPLE = 64    # labels, seen flags, row maps, memory ids: bytes per catalog sample
ACTIVATION_FACTOR = 8          # body working set per batch sample, in units of one trunk-feature row
TRUNK_LIVE_TENSORS = 3         # trunk pass: the largest activation, its successor and the input, alive at once
MODES = {
    "trunk-ram": "trunk features on disk, loaded into RAM",
    "trunk-disk": "trunk features on disk, memory-mapped per batch",
    "trunk-stream": "decoded and put through the trunk at every fetch",
    "images": "preprocessed images kept in RAM (no trunk cache)",
    "decode": "decoded at every fetch (no trunk cache)",
}


def ram_budget_bytes() -> int:
    """$BENCH_RAM_GB, else half the memory the system has available now."""
    given = RAM_GB.read()
    if given is not None:
        return int(given * GB)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")) // 2


def disk_budget_bytes(root: Path) -> int:
    """$BENCH_DISK_GB, else the free space under ``root`` less ``DISK_RESERVE``."""
    given = DISK_GB.read()
    if given is not None:
        return int(given * GB)
    return max(0, shutil.disk_usage(root).free - DISK_RESERVE)


def pinned_mode() -> str | None:
    value = trunk_cache_setting()
    return None if value == "auto" else f"trunk-{value}"


@dataclass(frozen=True)
class SplitPlan:
    """How one split's inputs are held. ``disk_bytes``: written to the cache by this run (0 when
    already there); ``ram_bytes``: kept resident."""

    mode: str
    samples: int
    disk_bytes: int
    ram_bytes: int
    why: str


@dataclass(frozen=True)
class DataPathPlan:
    test: SplitPlan
    train: SplitPlan
    feature_shape: tuple[int, ...]
    feature_dtype: str
    ram_budget: int
    disk_budget: int
    resident_bytes: int
    cache_root: str
    gpu_decode: tuple[str, ...] = ()  # splits whose JPEG files are decoded on the GPU ("eval", "train")
    old_mix: tuple[SessionMix, ...] = ()  # each session's batch by source (``old_mix.plan_old_mix``)

    def describe(self) -> str:
        """The plan as the run prints it: one line per split, then the budgets."""
        lines = [f"data path (trunk output {'x'.join(map(str, self.feature_shape))} {self.feature_dtype}):"]
        for name, s in (("eval", self.test), ("train", self.train)):
            lines.append(f"  {name:<5} {s.samples:>9,} images: {s.mode} ({MODES[s.mode]}); "
                         f"disk {s.disk_bytes / GB:.2f} GB new, RAM {s.ram_bytes / GB:.2f} GB. {s.why}")
        lines.append("  decode: " + (f"JPEG on the GPU (nvJPEG) for {', '.join(self.gpu_decode)}; " if self.gpu_decode
                                     else "") + f"{loader_workers()} DataLoader worker(s)")
        if self.old_mix:
            lines.extend("  " + line for line in describe_old_mix(list(self.old_mix)).splitlines())
        lines.append(f"  budgets: RAM {self.ram_budget / GB:.1f} GB (resident estimate "
                     f"{self.resident_bytes / GB:.2f} GB), disk {self.disk_budget / GB:.1f} GB free for "
                     f"caches under {self.cache_root}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        """For ``RunResult.options['data_path']``."""
        return asdict(self)


def trunk_output(trunk: nn.Module, input_size: int, in_chans: int, device: torch.device,
                 amp: bool) -> tuple[tuple[int, ...], torch.dtype, int]:
    """Shape (per sample) and dtype of the trunk's output, and the bytes of its largest activation
    per sample (float32), from one forward of one blank image."""
    x = torch.zeros(1, in_chans, input_size, input_size, device=device)
    largest = [x.numel()]

    def hook(_m, _args, out) -> None:
        if isinstance(out, torch.Tensor):
            largest[0] = max(largest[0], out.numel())

    handles = [m.register_forward_hook(hook) for m in trunk.modules() if not list(m.children())]
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if amp and device.type == "cuda" else torch.no_grad()
    try:
        with torch.no_grad(), ctx:
            out = trunk.eval()(x)
    finally:
        for h in handles:
            h.remove()
    return tuple(out.shape[1:]), out.dtype, 4 * largest[0]


def expected_train_fetches(protocol: Protocol, stream: Stream) -> int | None:
    """Training samples one run fetches: the CL run, its joint reference and pre-training; None under a
    FLOP budget (the update count is known only as the run goes)."""
    t = protocol.training
    per_session = [t.session_updates(len(s.train_ids)) for s in stream.sessions]
    if None in per_session:
        return None
    cl = sum(n for n in per_session if n is not None) * t.batch.size
    models = len(stream.sessions) if protocol.joint.mode == "per_session" else 1
    joint = models * protocol.joint.updates * protocol.joint.batch_size
    pretrain = protocol.pretrain.updates * protocol.pretrain.batch_size if protocol.pretrain.mode == "train" else 0
    return cl + joint + pretrain


def _trunk_split(name: str, samples: int, row_disk: int, row_ram: int, stored: bool, disk_left: int,
                 ram_left: int, worth: bool, pinned: str | None, stream_reason: str) -> SplitPlan:
    disk_need = 0 if stored else samples * row_disk
    ram_need = samples * row_ram
    fits_disk, fits_ram = disk_need <= disk_left, ram_need <= ram_left // RAM_TABLE_SHARE
    if pinned == "trunk-stream":
        return SplitPlan("trunk-stream", samples, 0, 0, "pinned by BENCH_TRUNK_CACHE")
    if pinned is not None and (not fits_disk or (pinned == "trunk-ram" and not fits_ram)):
        short = (f"{disk_need / GB:.2f} GB of disk ({disk_left / GB:.2f} GB free for caches)" if not fits_disk
                 else f"{ram_need / GB:.2f} GB of RAM (a quarter of the {ram_left / GB:.2f} GB budget allowed)")
        fit = "BENCH_TRUNK_CACHE=disk" if fits_disk else "BENCH_TRUNK_CACHE=stream (or free disk space)"
        raise BenchError(
            f"BENCH_TRUNK_CACHE pins {pinned}, but the {name} split's trunk features ({samples:,} images x "
            f"{row_ram / 2**10:.0f} KiB) need {short}. Nothing was computed. What would fit: {fit}, or unset "
            f"BENCH_TRUNK_CACHE to let the harness choose."
        )
    if pinned is not None:
        return SplitPlan(pinned, samples, disk_need, ram_need if pinned == "trunk-ram" else 0,
                         "pinned by BENCH_TRUNK_CACHE")
    if not fits_disk:
        return SplitPlan("trunk-stream", samples, 0, 0,
                         f"features ({disk_need / GB:.1f} GB) exceed the disk budget ({disk_left / GB:.1f} GB)")
    if fits_ram:  # small: computed once, reused by every later run of the protocol
        return SplitPlan("trunk-ram", samples, disk_need, ram_need, "features fit a quarter of the RAM budget")
    if not worth:
        return SplitPlan("trunk-stream", samples, 0, 0, stream_reason)
    return SplitPlan("trunk-disk", samples, disk_need, 0,
                     f"features ({ram_need / GB:.1f} GB) exceed a quarter of the RAM budget")


def _image_split(samples: int, size: int, augment: bool, keep: bool) -> SplitPlan:
    need = samples * 4 * 3 * size * size
    if augment:
        return SplitPlan("decode", samples, 0, 0, "augmentation draws new crops at every fetch")
    if keep and need <= image_cache_bytes():
        return SplitPlan("images", samples, 0, need, "fit BENCH_IMAGE_CACHE_GB")
    return SplitPlan("decode", samples, 0, 0, f"images ({need / GB:.1f} GB) exceed BENCH_IMAGE_CACHE_GB "
                                              f"({image_cache_bytes() / GB:.1f} GB)")


def plan_data_path(protocol: Protocol, stream: Stream, trunk: nn.Module | None, device: torch.device,
                   amp: bool, cache_root: Path, keys: dict[str, str]) -> DataPathPlan:
    """Decide, before any compute, how the eval and training splits are held (see the module doc).
    ``trunk`` None means ``--no-trunk-cache``; ``keys`` are the feature cache keys by split."""
    b = protocol.backbone
    n_test = int((stream.test.labels >= 0).sum())
    n_train = int((stream.train.labels >= 0).sum())
    ram, disk = ram_budget_bytes(), disk_budget_bytes(cache_root)
    augment = protocol.training.augment
    shape: tuple[int, ...]
    if trunk is None:
        shape, dtype, activation = (b.in_chans, b.input_size, b.input_size), torch.float32, 0
        test = _image_split(n_test, b.input_size, False, True)
        train = _image_split(n_train, b.input_size, augment, True)
    else:
        shape, dtype, activation = trunk_output(trunk, b.input_size, b.in_chans, device, amp)
        elems = int(np.prod(shape))
        row_disk, row_ram = elems * torch.empty((), dtype=dtype).element_size(), elems * 4
        pinned = pinned_mode()
        catalogs = {"test": stream.test, "train": stream.train}
        stored = {k: FeatureShards.complete(cache_root / key_folder(v, catalogs[k])) for k, v in keys.items()}
        test = _trunk_split("eval", n_test, row_disk, row_ram, stored.get("test", False), disk, ram, True,
                            pinned, "")
        fetches = expected_train_fetches(protocol, stream)
        why = f"a run fetches ~{fetches or 0:,} training images, fewer than the {n_train:,} a trunk pass covers"
        train = (SplitPlan("trunk-stream", n_train, 0, 0, "augmentation: every fetch is a new crop") if augment else
                 _trunk_split("train", n_train, row_disk, row_ram, stored.get("train", False),
                              disk - test.disk_bytes, ram - test.ram_bytes, fetches is None or fetches >= n_train,
                              pinned, why))
    batch = protocol.training.batch.size + protocol.eval.batch_size
    row = int(np.prod(shape)) * 4
    trunk_pass = TRUNK_LIVE_TENSORS * TRUNK_CHUNK * activation if "trunk-stream" not in (test.mode, train.mode) \
        else TRUNK_LIVE_TENSORS * max(TRUNK_CHUNK, protocol.training.batch.size, protocol.eval.batch_size) * activation
    resident = (BOOKKEEPING_PER_SAMPLE * (len(stream.train) + len(stream.test)) + test.ram_bytes + train.ram_bytes
                + max(ACTIVATION_FACTOR * batch * row, trunk_pass))
    if resident > ram:
        raise BenchError(
            f"Protocol {protocol.name} does not fit the RAM budget: it needs about {resident / GB:.2f} GB resident "
            f"({len(stream.train):,} training + {len(stream.test):,} eval samples of bookkeeping, "
            f"{(test.ram_bytes + train.ram_bytes) / GB:.2f} GB of cached inputs, working memory for batches of "
            f"{batch}), the budget is {ram / GB:.2f} GB (BENCH_RAM_GB, default half the available memory). "
            f"Nothing was computed. What would fit: BENCH_TRUNK_CACHE=disk or stream (inputs off RAM), a "
            f"smaller eval.batch_size, or BENCH_RAM_GB >= {resident / GB:.1f} on a machine with that much memory."
        )
    return DataPathPlan(test, train, tuple(int(d) for d in shape), dtype_name(dtype), ram, disk, resident,
                        str(cache_root))
