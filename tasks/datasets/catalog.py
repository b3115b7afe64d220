"""The registry of known datasets (``DATASETS``): where each lives officially, its files and checksums, and how
to read it; ``DatasetName``, their names as a type (the config's JSON schema and the Prefect UI form offer them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["DATASETS", "DatasetName", "DatasetSpec"]


_DIGIT_NAMES = tuple(str(i) for i in range(10))


@dataclass(frozen=True)
class DatasetSpec:
    """What we know about a named dataset: where it lives officially and how to read it.

    ``files`` are (filename, md5) pairs exactly as torchvision has them; ``mirrors`` are official base
    locations tried in order. Bundled datasets (``digits``, ``mnist_5k``) have neither.
    """

    name: str
    loader: Literal["digits", "mnist_5k", "idx", "cifar10"]
    num_classes: int
    class_names: tuple[str, ...]
    official_test: bool
    pixel_max: float = 255.0
    mirrors: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()

    @property
    def remote(self) -> bool:
        return bool(self.files)

    @property
    def filenames(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.files)


_MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)

DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="digits",
            loader="digits",
            num_classes=10,
            class_names=_DIGIT_NAMES,
            official_test=False,
            pixel_max=16.0,  # scikit-learn's 8x8 digits count pixels on in 4x4 blocks: values 0..16
        ),
        DatasetSpec(
            name="mnist_5k",
            loader="mnist_5k",
            num_classes=10,
            class_names=_DIGIT_NAMES,
            official_test=False,
        ),
        DatasetSpec(
            name="mnist",
            loader="idx",
            num_classes=10,
            class_names=_DIGIT_NAMES,
            official_test=True,
            mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
            files=tuple(
                zip(
                    _MNIST_FILES,
                    (
                        "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                        "d53e105ee54ea40749a09fcbcd1e9432",
                        "9fb629c4189551a2d022fa330f9573f3",
                        "ec29112dd5afa0611ce80d1b7f02629c",
                    ),
                    strict=True,
                )
            ),
        ),
        DatasetSpec(
            name="fashion_mnist",
            loader="idx",
            num_classes=10,
            class_names=(
                "T-shirt/top",
                "Trouser",
                "Pullover",
                "Dress",
                "Coat",
                "Sandal",
                "Shirt",
                "Sneaker",
                "Bag",
                "Ankle boot",
            ),
            official_test=True,
            mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
            files=tuple(
                zip(
                    _MNIST_FILES,
                    (
                        "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                        "25c81989df183df01b3e8a0aad5dffbe",
                        "bef4ecab320f06d8554ea6380940ec79",
                        "bb300cfdad3c16e7a12a480ee83cd310",
                    ),
                    strict=True,
                )
            ),
        ),
        DatasetSpec(
            name="cifar10",
            loader="cifar10",
            num_classes=10,
            class_names=(
                "airplane",
                "automobile",
                "bird",
                "cat",
                "deer",
                "dog",
                "frog",
                "horse",
                "ship",
                "truck",
            ),
            official_test=True,
            mirrors=("https://www.cs.toronto.edu/~kriz/",),
            files=(("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),),
        ),
    )
}

#: The names in ``DATASETS``, as a type: the config's JSON schema (and the Prefect UI form) offers them.
DatasetName = Literal["digits", "mnist_5k", "mnist", "fashion_mnist", "cifar10"]
if set(get_args(DatasetName)) != set(DATASETS):  # pragma: no cover - a registry edit must update both
    raise RuntimeError(f"DatasetName {get_args(DatasetName)} does not match DATASETS {sorted(DATASETS)}")
