"""Tests for the data stage against real transports: an HTTP server, an S3 endpoint (moto) and a directory.

The remote datasets' real files cannot be downloaded here, so the tests generate small files in the real
formats (MNIST IDX gz, the CIFAR-10 python tarball) and serve them; the official checksums are replaced
through ``DataConfig.checksums`` exactly as a user with a private mirror would do.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import io
import json
import os
import pickle
import socket
import struct
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from sweepflow.tasks.datasets import (
    DATASETS,
    SPLITS,
    ChecksumMismatchError,
    DataConfig,
    DatasetConfigError,
    DatasetFetchError,
    DatasetFormatError,
    DatasetSourceError,
    PreparedDataset,
    load_meta,
    load_split,
    prepare_dataset,
    prepared_dataset_exists,
    read_cifar10_tarball,
    read_idx,
)

N_TRAIN, N_TEST = 60, 20
IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
CIFAR_FILE = "cifar-10-python.tar.gz"


# ------------------------------------------------------------------------------------------------------
# Generated raw files
# ------------------------------------------------------------------------------------------------------


def _balanced_labels(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(np.arange(n) % 10).astype(np.int64)


def _idx_bytes(array: np.ndarray) -> bytes:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes(), mtime=0)


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class Generated:
    """Small dataset files in the official formats, and the arrays they were made from."""

    root: Path  # holds mnist/ and cifar/
    mnist: dict[str, np.ndarray]  # train_x, train_y, test_x, test_y
    cifar: dict[str, np.ndarray]
    mnist_md5: dict[str, str]
    cifar_md5: dict[str, str]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    rng = np.random.default_rng(1234)
    root = tmp_path_factory.mktemp("raw-sources")

    mnist = {
        "train_x": rng.integers(0, 256, size=(N_TRAIN, 28, 28), dtype=np.uint8),
        "train_y": _balanced_labels(N_TRAIN, rng),
        "test_x": rng.integers(0, 256, size=(N_TEST, 28, 28), dtype=np.uint8),
        "test_y": _balanced_labels(N_TEST, rng),
    }
    (root / "mnist").mkdir()
    for name, key in zip(IDX_FILES, ("train_x", "train_y", "test_x", "test_y"), strict=True):
        (root / "mnist" / name).write_bytes(_idx_bytes(mnist[key]))

    cifar = {
        "train_x": rng.integers(0, 256, size=(N_TRAIN, 3, 32, 32), dtype=np.uint8),
        "train_y": _balanced_labels(N_TRAIN, rng),
        "test_x": rng.integers(0, 256, size=(N_TEST, 3, 32, 32), dtype=np.uint8),
        "test_y": _balanced_labels(N_TEST, rng),
    }
    (root / "cifar").mkdir()
    batches = {
        f"data_batch_{i + 1}": (
            cifar["train_x"][i * 12 : (i + 1) * 12],
            cifar["train_y"][i * 12 : (i + 1) * 12],
        )
        for i in range(5)
    }
    batches["test_batch"] = (cifar["test_x"], cifar["test_y"])
    with tarfile.open(root / "cifar" / CIFAR_FILE, "w:gz") as tar:
        for name, (x, y) in batches.items():
            # Same layout as the real files: bytes keys, (N, 3072) uint8 rows, labels as a list, protocol 2.
            payload = pickle.dumps(
                {
                    b"batch_label": name.encode(),
                    b"labels": [int(v) for v in y],
                    b"data": x.reshape(len(x), -1),
                },
                protocol=2,
            )
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))

    return Generated(
        root=root,
        mnist=mnist,
        cifar=cifar,
        mnist_md5={name: _md5(root / "mnist" / name) for name in IDX_FILES},
        cifar_md5={CIFAR_FILE: _md5(root / "cifar" / CIFAR_FILE)},
    )


# ------------------------------------------------------------------------------------------------------
# Servers
# ------------------------------------------------------------------------------------------------------


@dataclass
class HttpServer:
    url: str
    requests: list[str]  # "GET /path" for every request served, in order


class _RecordingHandler(SimpleHTTPRequestHandler):
    requests: list[str]

    def do_GET(self) -> None:
        self.requests.append(f"GET {self.path}")
        super().do_GET()

    def do_HEAD(self) -> None:
        self.requests.append(f"HEAD {self.path}")
        super().do_HEAD()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature of the base class
        """Keep test output quiet; the request list is the log."""


@contextlib.contextmanager
def serving_directory(
    directory: Path, handler_base: type[_RecordingHandler] = _RecordingHandler
) -> Iterator[HttpServer]:
    """``directory`` over HTTP on a free loopback port (Last-Modified and Content-Length, no ETag, like many
    plain file servers), every request recorded."""
    requests: list[str] = []
    handler = type("Handler", (handler_base,), {"requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, name="test-http-server", daemon=True)
    thread.start()
    try:
        yield HttpServer(url=f"http://127.0.0.1:{server.server_address[1]}", requests=requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def http_server(generated: Generated) -> Iterator[HttpServer]:
    with serving_directory(generated.root) as server:
        yield server


def write_mnist_files(
    directory: Path, seed: int, n_train: int = N_TRAIN, n_test: int = N_TEST
) -> dict[str, Any]:
    """Random MNIST-format files (IDX gz, 28x28) into ``directory``, replacing what is there; their arrays."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train_x": rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
        "train_y": _balanced_labels(n_train, rng),
        "test_x": rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
        "test_y": _balanced_labels(n_test, rng),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, key in zip(IDX_FILES, ("train_x", "train_y", "test_x", "test_y"), strict=True):
        tmp = directory / f".{name}.tmp"
        tmp.write_bytes(_idx_bytes(arrays[key]))
        os.replace(tmp, directory / name)  # as a publisher should: readers never see half a file
    return arrays


@dataclass(frozen=True)
class S3:
    endpoint: str
    bucket: str
    storage_options: dict[str, Any]


@pytest.fixture(scope="module")
def s3(generated: Generated) -> Iterator[S3]:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **creds)
        client.create_bucket(Bucket="datasets")
        for sub in ("mnist", "cifar"):
            for path in sorted((generated.root / sub).iterdir()):
                client.upload_file(str(path), "datasets", f"mirror/{sub}/{path.name}")
        options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}
        yield S3(endpoint=endpoint, bucket="datasets", storage_options=options)
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------------


def _denormalise(path: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Load a split and undo the standardisation, back to the uint8 pixels it was made from."""
    meta = load_meta(path)
    x, y = load_split(path, split)
    mean = np.asarray(meta["mean"], dtype=np.float32)[None, :, None, None]
    std = np.asarray(meta["std"], dtype=np.float32)[None, :, None, None]
    pixels = np.rint((x.numpy() * std + mean) * meta["pixel_max"])
    return pixels.astype(np.uint8), y.numpy()


def _rows(images: np.ndarray) -> set[bytes]:
    return {img.tobytes() for img in images}


def _cache_files(cache_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(cache_dir)) for p in cache_dir.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------------------
# Parsers
# ------------------------------------------------------------------------------------------------------


def test_read_idx_returns_generated_arrays(generated: Generated) -> None:
    images = read_idx(generated.root / "mnist" / "train-images-idx3-ubyte.gz")
    labels = read_idx(generated.root / "mnist" / "train-labels-idx1-ubyte.gz")
    assert images.dtype == np.uint8 and images.shape == (N_TRAIN, 28, 28)
    np.testing.assert_array_equal(images, generated.mnist["train_x"])
    np.testing.assert_array_equal(labels, generated.mnist["train_y"])


def test_read_idx_rejects_truncated_file(tmp_path: Path) -> None:
    data = gzip.decompress(_idx_bytes(np.zeros((3, 4, 4), dtype=np.uint8)))
    bad = tmp_path / "bad-idx3-ubyte"
    bad.write_bytes(data[:-5])
    with pytest.raises(DatasetFormatError, match="truncated or corrupt"):
        read_idx(bad)


def test_read_cifar10_tarball_returns_generated_arrays(generated: Generated) -> None:
    train_x, train_y, test_x, test_y = read_cifar10_tarball(generated.root / "cifar" / CIFAR_FILE)
    assert train_x.shape == (N_TRAIN, 3, 32, 32) and test_x.shape == (N_TEST, 3, 32, 32)
    assert train_y.dtype == np.int64
    for got, key in ((train_x, "train_x"), (train_y, "train_y"), (test_x, "test_x"), (test_y, "test_y")):
        np.testing.assert_array_equal(got, generated.cifar[key])


def test_cifar_parser_refuses_pickles_that_run_code(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("echo pwned",))

    payload = pickle.dumps({b"data": Evil(), b"labels": []}, protocol=2)
    tarball = tmp_path / CIFAR_FILE
    with tarfile.open(tarball, "w:gz") as tar:
        info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(DatasetFormatError, match="refusing to unpickle"):
        read_cifar10_tarball(tarball)


# ------------------------------------------------------------------------------------------------------
# Remote datasets over real transports
# ------------------------------------------------------------------------------------------------------


def test_mnist_over_http_parses_splits_and_records_meta(
    generated: Generated, http_server: HttpServer, tmp_path: Path
) -> None:
    cfg = DataConfig(
        name="mnist",
        source=f"{http_server.url}/mnist",
        cache_dir=str(tmp_path),
        checksums=generated.mnist_md5,
    )
    prepared = prepare_dataset(cfg)

    n_val = int(np.ceil(0.15 * N_TRAIN))
    assert prepared.sizes == {"train": N_TRAIN - n_val, "val": n_val, "test": N_TEST}
    assert prepared.input_shape == (1, 28, 28) and prepared.num_classes == 10
    assert Path(prepared.path).parent == tmp_path / "prepared"
    assert Path(prepared.path).name.startswith("mnist-")
    assert sorted(os.listdir(prepared.path)) == ["meta.json", "test.npz", "train.npz", "val.npz"]

    x, y = load_split(prepared.path, "train")
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.shape == (N_TRAIN - n_val, 1, 28, 28)
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-2  # standardised with train stats

    # The official test set is the test split, in order; train + val are exactly the official train set.
    test_x, test_y = _denormalise(prepared.path, "test")
    np.testing.assert_array_equal(test_x[:, 0], generated.mnist["test_x"])
    np.testing.assert_array_equal(test_y, generated.mnist["test_y"])
    train_x, train_y = _denormalise(prepared.path, "train")
    val_x, val_y = _denormalise(prepared.path, "val")
    assert _rows(train_x).isdisjoint(_rows(val_x)) and _rows(train_x).isdisjoint(_rows(test_x))
    assert _rows(np.concatenate([train_x, val_x])[:, 0]) == _rows(generated.mnist["train_x"])
    pairs = {
        (img.tobytes(), int(lbl))
        for img, lbl in zip(np.concatenate([train_x, val_x])[:, 0], [*train_y, *val_y], strict=True)
    }
    assert pairs == {
        (img.tobytes(), int(lbl))
        for img, lbl in zip(generated.mnist["train_x"], generated.mnist["train_y"], strict=True)
    }

    meta = load_meta(prepared.path)
    assert meta["name"] == "mnist" and meta["input_shape"] == [1, 28, 28]
    assert meta["class_names"] == list(DATASETS["mnist"].class_names)
    assert meta["sizes"] == prepared.sizes and meta["checksum"] == prepared.checksum
    assert meta["source"] == f"{http_server.url}/mnist" == prepared.source
    assert set(meta["raw_files"]) == set(IDX_FILES) and len(meta["mean"]) == len(meta["std"]) == 1
    assert {name: d["md5"] for name, d in meta["raw_files"].items()} == generated.mnist_md5

    assert PreparedDataset.from_dict(json.loads(json.dumps(prepared.to_dict()))) == prepared


def test_second_prepare_downloads_nothing(
    generated: Generated, http_server: HttpServer, tmp_path: Path
) -> None:
    cfg = DataConfig(
        name="mnist",
        source=f"{http_server.url}/mnist",
        cache_dir=str(tmp_path),
        checksums=generated.mnist_md5,
    )
    before = len(http_server.requests)
    first = prepare_dataset(cfg)
    fetched = http_server.requests[before:]
    assert sorted(fetched) == sorted(f"GET /mnist/{name}" for name in IDX_FILES)

    assert prepare_dataset(cfg) == first
    assert len(http_server.requests) == before + len(fetched), "second prepare must not touch the network"

    # Prepared dir gone but raw files cached: rebuilt identically from the cache, still no request.
    train_before = load_split(first.path, "train")[0]
    for path in Path(first.path).iterdir():
        path.unlink()
    Path(first.path).rmdir()
    assert prepare_dataset(cfg) == first
    assert len(http_server.requests) == before + len(fetched)
    assert torch.equal(load_split(first.path, "train")[0], train_before)

    # A corrupt cached file (wrong checksum) is replaced; only that one is fetched again.
    (tmp_path / "raw" / "mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    assert prepare_dataset(cfg) == first
    assert http_server.requests[before + len(fetched) :] == ["GET /mnist/t10k-labels-idx1-ubyte.gz"]


def test_split_is_reproducible_for_a_seed(
    generated: Generated, http_server: HttpServer, tmp_path: Path
) -> None:
    def prepare(seed: int, sub: str) -> PreparedDataset:
        return prepare_dataset(
            DataConfig(
                name="mnist",
                source=f"{http_server.url}/mnist",
                cache_dir=str(tmp_path / sub),
                checksums=generated.mnist_md5,
                seed=seed,
                val_fraction=0.2,  # 12 of 60: enough for every class, so the split is stratified
            )
        )

    a, b, c = prepare(7, "a"), prepare(7, "b"), prepare(8, "c")
    assert Path(a.path).name == Path(b.path).name != Path(c.path).name
    for split in ("train", "val", "test"):
        xa, ya = load_split(a.path, split)
        xb, yb = load_split(b.path, split)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    val_a, val_c = load_split(a.path, "val")[0].numpy(), load_split(c.path, "val")[0].numpy()
    assert _rows(val_a) != _rows(val_c), "another seed must give another split"
    assert load_meta(a.path)["split"]["stratified"] is True
    assert np.bincount(load_split(a.path, "val")[1].numpy(), minlength=10).min() >= 1


def test_checksum_mismatch_is_clear_and_leaves_cache_clean(
    generated: Generated, http_server: HttpServer, tmp_path: Path
) -> None:
    wrong = dict(generated.mnist_md5, **{"t10k-images-idx3-ubyte.gz": "0" * 32})
    cfg = DataConfig(
        name="mnist", source=f"{http_server.url}/mnist", cache_dir=str(tmp_path), checksums=wrong
    )
    with pytest.raises(ChecksumMismatchError) as info:
        prepare_dataset(cfg)
    message = str(info.value)
    assert "t10k-images-idx3-ubyte.gz" in message
    assert "0" * 32 in message and generated.mnist_md5["t10k-images-idx3-ubyte.gz"] in message
    assert f"{http_server.url}/mnist" in message
    files = _cache_files(tmp_path)
    assert "raw/mnist/t10k-images-idx3-ubyte.gz" not in files
    assert not any(name.endswith(".part") or "/.tmp-" in name for name in files), files
    assert not (tmp_path / "prepared").exists()


def test_cifar10_from_s3(generated: Generated, s3: S3, tmp_path: Path) -> None:
    cfg = DataConfig(
        name="cifar10",
        source=f"s3://{s3.bucket}/mirror/cifar",
        storage_options=s3.storage_options,
        cache_dir=str(tmp_path),
        checksums=generated.cifar_md5,
    )
    assert "testing" not in repr(cfg), "credentials must not show up in logs"
    prepared = prepare_dataset(cfg)
    assert prepared.input_shape == (3, 32, 32) and prepared.num_classes == 10
    assert prepared.sizes == {"train": N_TRAIN - 9, "val": 9, "test": N_TEST}
    assert prepared.source == f"s3://{s3.bucket}/mirror/cifar"
    test_x, test_y = _denormalise(prepared.path, "test")
    np.testing.assert_array_equal(test_x, generated.cifar["test_x"])
    np.testing.assert_array_equal(test_y, generated.cifar["test_y"])
    assert len(load_meta(prepared.path)["mean"]) == 3
    assert (tmp_path / "raw" / "cifar10" / CIFAR_FILE).read_bytes() == (
        generated.root / "cifar" / CIFAR_FILE
    ).read_bytes()


def test_mnist_from_s3_prefix(generated: Generated, s3: S3, tmp_path: Path) -> None:
    cfg = DataConfig(
        name="mnist",
        source=f"s3://{s3.bucket}/mirror/mnist/",
        storage_options=s3.storage_options,
        cache_dir=str(tmp_path),
        checksums=generated.mnist_md5,
    )
    prepared = prepare_dataset(cfg)
    _, test_y = _denormalise(prepared.path, "test")
    np.testing.assert_array_equal(test_y, generated.mnist["test_y"])


def test_fashion_mnist_from_local_directory(generated: Generated, tmp_path: Path) -> None:
    cfg = DataConfig(
        name="fashion_mnist",
        source=str(generated.root / "mnist"),
        cache_dir=str(tmp_path / "cache"),
        checksums=generated.mnist_md5,
    )
    prepared = prepare_dataset(cfg)
    assert prepared.name == "fashion_mnist" and prepared.input_shape == (1, 28, 28)
    assert load_meta(prepared.path)["class_names"][0] == "T-shirt/top"
    test_x, _ = _denormalise(prepared.path, "test")
    np.testing.assert_array_equal(test_x[:, 0], generated.mnist["test_x"])


def test_missing_file_at_source_is_a_permanent_error(http_server: HttpServer, tmp_path: Path) -> None:
    cfg = DataConfig(name="mnist", source=f"{http_server.url}/nowhere", cache_dir=str(tmp_path))
    with pytest.raises(DatasetSourceError, match="could not be read from") as info:
        prepare_dataset(cfg)
    assert not isinstance(info.value, DatasetFetchError)
    assert not any(name.endswith(".part") for name in _cache_files(tmp_path))


def test_unreachable_source_is_a_transient_error(tmp_path: Path) -> None:
    cfg = DataConfig(name="mnist", source=f"http://127.0.0.1:{_free_port()}/mnist", cache_dir=str(tmp_path))
    with pytest.raises(DatasetFetchError, match="transient"):
        prepare_dataset(cfg)
    assert not any(name.endswith(".part") for name in _cache_files(tmp_path))


# ------------------------------------------------------------------------------------------------------
# Remote cache: cache_dir on S3
# ------------------------------------------------------------------------------------------------------


def _s3_client(s3: S3) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _objects(s3: S3, bucket: str) -> dict[str, bytes]:
    """Every object in ``bucket`` (read with boto3, so no s3fs listing cache is involved)."""
    client = _s3_client(s3)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return {key: client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}


def _key(uri: str, bucket: str) -> str:
    assert uri.startswith(f"s3://{bucket}/"), uri
    return uri[len(f"s3://{bucket}/") :]


PREPARED_FILES = ("meta.json", "train.npz", "val.npz", "test.npz")


@pytest.fixture
def cache_bucket(s3: S3) -> str:
    """A fresh, empty bucket for one test's remote cache."""
    name = f"cache-{uuid.uuid4().hex[:12]}"
    _s3_client(s3).create_bucket(Bucket=name)
    return name


@pytest.fixture
def host(tmp_path: Path) -> Callable[[str], Path]:
    """The staging directory of a simulated host: each host keeps its own verified copies of a remote cache."""

    def staging(name: str) -> Path:
        return tmp_path / name

    return staging


def _on_host(cfg: DataConfig, staging: Path) -> DataConfig:
    """``cfg`` as another host runs it: the same cache (and cache identity), that host's staging directory."""
    other = DataConfig.from_dict({**cfg.to_dict(), "staging_dir": str(staging)})
    assert other.cache_identity() == cfg.cache_identity()
    return other


def _mnist_s3_cache(
    generated: Generated, http_server: HttpServer, s3: S3, bucket: str, **kwargs: Any
) -> DataConfig:
    return DataConfig(
        name="mnist",
        source=f"{http_server.url}/mnist",
        cache_dir=f"s3://{bucket}/cache/",
        cache_storage_options=s3.storage_options,
        checksums=kwargs.pop("checksums", generated.mnist_md5),
        staging_dir=str(kwargs.pop("staging_dir")),
        **kwargs,
    )


def test_s3_cache_end_to_end_with_mnist_source(
    generated: Generated,
    http_server: HttpServer,
    s3: S3,
    cache_bucket: str,
    host: Callable[[str], Path],
) -> None:
    cfg = _mnist_s3_cache(generated, http_server, s3, cache_bucket, staging_dir=host("host-a"))
    assert cfg.cache_dir == f"s3://{cache_bucket}/cache" and cfg.cache_is_remote
    assert "testing" not in repr(cfg) and "testing" not in json.dumps(cfg.cache_identity())
    before = len(http_server.requests)
    prepared = prepare_dataset(cfg)
    fetched = len(http_server.requests)
    assert sorted(http_server.requests[before:]) == sorted(f"GET /mnist/{name}" for name in IDX_FILES)

    # Raw files and the prepared set live in the bucket; the result names the S3 location, no credentials.
    assert prepared.path.startswith(f"s3://{cache_bucket}/cache/prepared/mnist-")
    assert "testing" not in json.dumps(prepared.to_dict())
    prefix = _key(prepared.path, cache_bucket)
    objects = _objects(s3, cache_bucket)
    assert sorted(objects) == sorted(
        [*(f"cache/raw/mnist/{name}" for name in IDX_FILES), *(f"{prefix}/{name}" for name in PREPARED_FILES)]
    )
    for name in IDX_FILES:
        assert objects[f"cache/raw/mnist/{name}"] == (generated.root / "mnist" / name).read_bytes()

    # Trainers on any host read the splits straight from S3.
    options = s3.storage_options
    assert prepared_dataset_exists(prepared.path, options)
    shapes = {split: tuple(load_split(prepared.path, split, options)[0].shape) for split in SPLITS}
    assert shapes == {"train": (N_TRAIN - 9, 1, 28, 28), "val": (9, 1, 28, 28), "test": (N_TEST, 1, 28, 28)}
    np.testing.assert_array_equal(load_split(prepared.path, "test", options)[1], generated.mnist["test_y"])
    meta = load_meta(prepared.path, options)
    assert meta["sizes"] == prepared.sizes and meta["source"] == f"{http_server.url}/mnist"

    # Same host again: the staged raw copies are re-verified and reused; the source is not contacted.
    assert prepare_dataset(cfg) == prepared
    assert len(http_server.requests) == fetched

    # Another host (empty staging): the raw files come from the S3 cache, not from the source.
    home_b = host("host-b")
    cfg = _on_host(cfg, home_b)
    assert prepare_dataset(cfg) == prepared
    assert len(http_server.requests) == fetched
    assert sorted(p.name for p in home_b.rglob("raw/mnist/*")) == sorted(IDX_FILES)

    # Prepared set deleted from S3: rebuilt from the verified raw files, identical, without the source.
    train_before = load_split(prepared.path, "train", options)[0]
    _s3_client(s3).delete_objects(
        Bucket=cache_bucket, Delete={"Objects": [{"Key": f"{prefix}/{name}"} for name in PREPARED_FILES]}
    )
    assert not prepared_dataset_exists(prepared.path, options)
    assert prepare_dataset(cfg) == prepared
    assert torch.equal(load_split(prepared.path, "train", options)[0], train_before)
    assert len(http_server.requests) == fetched

    # A corrupt staged copy on this host is replaced from the S3 cache, still without the source.
    next(home_b.rglob("raw/mnist/t10k-labels-idx1-ubyte.gz")).write_bytes(b"garbage")
    assert prepare_dataset(cfg) == prepared
    assert len(http_server.requests) == fetched


def test_s3_cache_replaces_a_corrupt_raw_object(
    generated: Generated,
    http_server: HttpServer,
    s3: S3,
    cache_bucket: str,
    host: Callable[[str], Path],
) -> None:
    cfg = _mnist_s3_cache(generated, http_server, s3, cache_bucket, staging_dir=host("host-a"))
    prepared = prepare_dataset(cfg)
    key = "cache/raw/mnist/t10k-labels-idx1-ubyte.gz"
    original = (generated.root / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes()
    client = _s3_client(s3)

    # Same host: its verified staged copy shows the remote object is wrong, and re-uploads it.
    client.put_object(Bucket=cache_bucket, Key=key, Body=b"garbage")
    before = len(http_server.requests)
    assert prepare_dataset(cfg) == prepared
    assert len(http_server.requests) == before
    assert _objects(s3, cache_bucket)[key] == original

    # Another host: downloads the corrupt object, finds the MD5 wrong, fetches that one file from the
    # source and overwrites the object.
    client.put_object(Bucket=cache_bucket, Key=key, Body=b"garbage")
    cfg = _on_host(cfg, host("host-b"))
    assert prepare_dataset(cfg) == prepared
    assert http_server.requests[before:] == ["GET /mnist/t10k-labels-idx1-ubyte.gz"]
    assert _objects(s3, cache_bucket)[key] == original


def test_s3_cache_checksum_mismatch_uploads_nothing_corrupt(
    generated: Generated,
    http_server: HttpServer,
    s3: S3,
    cache_bucket: str,
    host: Callable[[str], Path],
) -> None:
    bad = "t10k-images-idx3-ubyte.gz"
    cfg = _mnist_s3_cache(
        generated,
        http_server,
        s3,
        cache_bucket,
        checksums=dict(generated.mnist_md5, **{bad: "0" * 32}),
        staging_dir=host("host-a"),
    )
    with pytest.raises(ChecksumMismatchError, match=bad):
        prepare_dataset(cfg)
    objects = _objects(s3, cache_bucket)
    assert f"cache/raw/mnist/{bad}" not in objects
    assert not any(key.startswith("cache/prepared/") for key in objects), sorted(objects)
    for key, body in objects.items():  # files verified before the bad one are cached, and intact
        assert body == (generated.root / "mnist" / key.rsplit("/", 1)[1]).read_bytes()
    staged = _cache_files(host("host-a"))
    assert not any(name.endswith((bad, ".part")) for name in staged), staged


@contextlib.contextmanager
def _s3_uploads_fail_on(name: str, uploads: list[str]) -> Iterator[None]:
    """Record the file name of every s3fs upload, and fail the upload of ``name`` like a dropped connection."""
    import s3fs

    real_put_file = s3fs.S3FileSystem._put_file

    async def put_file(self: Any, lpath: str, rpath: str, **kwargs: Any) -> Any:
        uploads.append(rpath.rsplit("/", 1)[1])
        if rpath.endswith(f"/{name}"):
            raise ConnectionResetError(f"simulated connection reset while uploading {name}")
        return await real_put_file(self, lpath, rpath, **kwargs)

    # s3fs instances bind their sync methods when created, and fsspec caches instances: start afresh on
    # entry (so the patch is picked up) and on exit (so later tests get the real method).
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(s3fs.S3FileSystem, "_put_file", put_file)
            yield
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_s3_cache_uploads_meta_json_last_and_recovers(
    s3: S3, cache_bucket: str, host: Callable[[str], Path]
) -> None:
    cfg = DataConfig(
        name="digits",
        cache_dir=f"s3://{cache_bucket}/cache",
        cache_storage_options=s3.storage_options,
        staging_dir=str(host("host-a")),
    )
    uploads: list[str] = []

    # The connection drops when only meta.json is left: the splits are there, but the set is not complete.
    with _s3_uploads_fail_on("meta.json", uploads), pytest.raises(DatasetFetchError, match="transient"):
        prepare_dataset(cfg)  # a transient error: the Prefect task retries it
    assert uploads == ["train.npz", "val.npz", "test.npz", "meta.json"]
    keys = sorted(_objects(s3, cache_bucket))
    assert len(keys) == 3 and all(key.endswith(".npz") for key in keys), keys
    path = f"s3://{cache_bucket}/{keys[0].rsplit('/', 1)[0]}"
    assert not prepared_dataset_exists(path, s3.storage_options)
    with pytest.raises(DatasetSourceError, match="no prepared dataset"):
        load_meta(path, s3.storage_options)

    # A retry completes the set.
    prepared = prepare_dataset(cfg)
    assert prepared.path == path and prepared_dataset_exists(path, s3.storage_options)
    assert sum(prepared.sizes.values()) == 1797

    # A split deleted later: the stale meta.json is removed before anything is uploaded, so it cannot vouch
    # for a half-uploaded set if this attempt fails too.
    _s3_client(s3).delete_object(Bucket=cache_bucket, Key=f"{_key(path, cache_bucket)}/train.npz")
    uploads.clear()
    with _s3_uploads_fail_on("val.npz", uploads), pytest.raises(DatasetFetchError):
        prepare_dataset(cfg)
    assert uploads == ["train.npz", "val.npz"]
    assert not any(key.endswith("meta.json") for key in _objects(s3, cache_bucket))
    assert not prepared_dataset_exists(path, s3.storage_options)
    assert prepare_dataset(cfg) == prepared
    assert sorted(_objects(s3, cache_bucket)) == sorted(
        f"{_key(path, cache_bucket)}/{n}" for n in PREPARED_FILES
    )


@pytest.fixture
def aws_environment(s3: S3, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """S3 credentials and endpoint only in the standard AWS environment variables, as on a worker host."""
    import s3fs

    for name, value in {
        "AWS_ENDPOINT_URL_S3": s3.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    s3fs.S3FileSystem.clear_instance_cache()  # an instance made under another environment must not be reused
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def test_s3_cache_with_credentials_from_the_aws_environment(
    aws_environment: None, s3: S3, cache_bucket: str, host: Callable[[str], Path]
) -> None:
    cfg = DataConfig(
        name="digits", cache_dir=f"s3://{cache_bucket}/env-cache", staging_dir=str(host("host-a"))
    )
    assert cfg.cache_storage_options is None
    prepared = prepare_dataset(cfg)
    assert prepared.path.startswith(f"s3://{cache_bucket}/env-cache/prepared/digits-")
    assert sorted(_objects(s3, cache_bucket)) == sorted(
        f"{_key(prepared.path, cache_bucket)}/{name}" for name in PREPARED_FILES
    ), "digits is bundled: nothing under raw/"
    assert prepared_dataset_exists(prepared.path)
    x, y = load_split(prepared.path, "train")
    assert x.shape == (prepared.sizes["train"], 1, 8, 8) and x.dtype == torch.float32 and len(y) == len(x)
    assert load_meta(prepared.path)["input_shape"] == [1, 8, 8]
    assert prepare_dataset(cfg) == prepared


def test_s3_cache_in_a_missing_bucket_is_a_clear_config_error(s3: S3, host: Callable[[str], Path]) -> None:
    cfg = DataConfig(
        name="digits",
        cache_dir="s3://no-such-bucket/cache",
        cache_storage_options=s3.storage_options,
        staging_dir=str(host("host-a")),
    )
    with pytest.raises(DatasetConfigError, match="names an existing bucket") as info:
        prepare_dataset(cfg)
    assert "s3://no-such-bucket/cache/prepared/digits-" in str(info.value)
    assert "testing" not in str(info.value)


# ------------------------------------------------------------------------------------------------------
# Bundled (offline) datasets
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "total", "shape"),
    [("digits", 1797, (1, 8, 8)), ("mnist_5k", 5000, (1, 28, 28))],
)
def test_bundled_datasets_work_offline(
    name: str, total: int, shape: tuple[int, int, int], tmp_path: Path
) -> None:
    prepared = prepare_dataset(DataConfig(name=name, cache_dir=str(tmp_path)))
    assert prepared.num_classes == 10 and prepared.input_shape == shape
    assert sum(prepared.sizes.values()) == total
    assert prepared.sizes["test"] == int(np.ceil(0.15 * total))
    assert not (tmp_path / "raw").exists(), "bundled datasets download nothing"
    labels = {split: load_split(prepared.path, split)[1] for split in ("train", "val", "test")}
    for split, y in labels.items():
        assert set(y.unique().tolist()) == set(range(10)), f"{split} misses classes"
    x, _ = load_split(prepared.path, "train")
    assert x.shape[1:] == shape and x.dtype == torch.float32
    assert load_meta(prepared.path)["split"]["stratified"] is True


# ------------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"name": "imagenet"},
            "DataConfig.name: unknown dataset 'imagenet'; use one of: cifar10, digits, fashion_mnist",
        ),
        ({"val_fraction": 1.5}, "DataConfig.val_fraction must be a number strictly between 0 and 1"),
        ({"test_fraction": True}, "DataConfig.test_fraction"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "val_fraction + test_fraction must be < 1"),
        ({"seed": -1}, "DataConfig.seed"),
        ({"source": "https://example.org/digits"}, "drop source="),
        ({"name": "mnist", "source": "ftpx://host/x"}, "unsupported scheme 'ftpx'"),
        # fsspec has an FTP filesystem, the download does not: refused at once (it retried for ~78 s before)
        ({"name": "mnist", "source": "ftp://host/x"}, "unsupported scheme 'ftp'"),
        ({"name": "mnist", "storage_options": {"key": "k"}}, "storage_options only apply to a `source`"),
        ({"name": "mnist", "checksums": {"train.gz": "0" * 32}}, "its files are: train-images-idx3-ubyte.gz"),
        ({"name": "mnist", "checksums": {"t10k-images-idx3-ubyte.gz": "abc"}}, "32-character hex MD5"),
        ({"cache_dir": "https://example.org/cache"}, "DataConfig.cache_dir: https:// is read-only"),
        ({"cache_dir": "nosuch://bucket/cache"}, "DataConfig.cache_dir: unsupported scheme 'nosuch'"),
        ({"cache_dir": "s3://"}, "names no location; give a bucket"),
        ({"cache_dir": "s3://key:secret@bucket/c"}, "must not contain credentials (got 's3://***@bucket/c')"),
        ({"cache_storage_options": {"key": "k"}}, "cache_storage_options only apply to a remote cache_dir"),
        ({"name": "mnist", "follow_source": True}, "DataConfig.follow_source needs a `source`"),
        (
            {"name": "mnist", "source": "https://e.org/m", "follow_source": True, "checksums": {}},
            "follow_source and checksums exclude each other",
        ),
        (
            {"name": "mnist", "source": "https://e.org/m", "follow_source": "yes"},
            "follow_source must be true",
        ),
        (
            {"cache_dir": "s3://bucket/c", "cache_storage_options": {"key": object()}},
            "DataConfig.cache_storage_options must be JSON-serialisable",
        ),
    ],
)
def test_data_config_errors_name_the_field_and_fix(
    kwargs: dict[str, Any], expected: str, tmp_path: Path
) -> None:
    kwargs.setdefault("cache_dir", str(tmp_path))
    with pytest.raises(DatasetConfigError) as info:
        DataConfig(**kwargs)
    assert expected in str(info.value)
    assert "secret" not in str(info.value), "credentials in a URI must not be echoed"


def test_data_config_round_trips_and_rejects_unknown_keys(tmp_path: Path) -> None:
    cfg = DataConfig(name="mnist", source="relative/dir", cache_dir=str(tmp_path), seed=3)
    assert os.path.isabs(cfg.source or "")
    assert DataConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    remote = DataConfig(
        name="mnist", cache_dir="s3://bucket/cache/", cache_storage_options={"key": "k", "secret": "s"}
    )
    assert remote.cache_dir == "s3://bucket/cache" and remote.cache_is_remote and not cfg.cache_is_remote
    assert DataConfig.from_dict(json.loads(json.dumps(remote.to_dict()))) == remote
    assert "'s'" not in repr(remote) and "secret" not in json.dumps(remote.cache_identity())
    with pytest.raises(DatasetConfigError, match="unknown field\\(s\\) 'val_frac'"):
        DataConfig.from_dict({"name": "digits", "val_frac": 0.1})


def test_cache_dir_follows_sweepflow_home_at_the_entry_point(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sweepflow.flows.config import PipelineConfig
    from sweepflow.flows.settings import resolve_settings

    # The library reads no environment: without a cache_dir, prepare_dataset says what to pass.
    monkeypatch.setenv("SWEEPFLOW_HOME", str(tmp_path / "home"))
    assert DataConfig().cache_dir is None
    with pytest.raises(DatasetConfigError, match="DataConfig.cache_dir is not set"):
        prepare_dataset(DataConfig())

    # The entry point resolves it from SWEEPFLOW_HOME, into the same DataConfig the flow passes on.
    data = resolve_settings(PipelineConfig(), env={"SWEEPFLOW_HOME": str(tmp_path / "home")}).data
    assert isinstance(data, DataConfig)
    assert data.cache_dir == str(tmp_path / "home" / "data")
    assert DataConfig.coerce(data) == data
    default = resolve_settings(PipelineConfig(), env={}).data.cache_dir
    assert default == os.path.expanduser(os.path.join("~", ".sweepflow", "data"))


def test_remote_cache_needs_a_staging_dir_outside_the_identity(tmp_path: Path) -> None:
    cfg = DataConfig(name="digits", cache_dir="s3://bucket/cache")
    with pytest.raises(DatasetConfigError, match="DataConfig.staging_dir is not set"):
        prepare_dataset(cfg)
    staged = DataConfig(name="digits", cache_dir="s3://bucket/cache", staging_dir=str(tmp_path / "staging"))
    assert staged.staging_dir == str(tmp_path / "staging")
    assert staged.cache_identity() == cfg.cache_identity(), "host-local staging must not change the cache key"
    with pytest.raises(DatasetConfigError, match="DataConfig.staging_dir must be a local directory"):
        DataConfig(name="digits", cache_dir="s3://bucket/cache", staging_dir="s3://bucket/staging")


def test_data_config_is_the_pipeline_data_section(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from sweepflow.flows.config import PipelineConfig

    config = PipelineConfig.model_validate({"data": {"name": "mnist", "seed": 3}})
    assert isinstance(config.data, DataConfig) and config.data.name == "mnist" and config.data.seed == 3
    filled = config.data.model_copy(update={"cache_dir": str(tmp_path)})
    assert DataConfig.coerce(filled) == DataConfig(name="mnist", seed=3, cache_dir=str(tmp_path))
    assert pickle.loads(pickle.dumps(filled)) == filled
    with pytest.raises(ValidationError, match="DataConfig.val_fraction must be a number strictly between"):
        PipelineConfig.model_validate({"data": {"val_fraction": 2}})
    with pytest.raises(ValidationError, match="unknown field\\(s\\) 'val_frac'"):
        PipelineConfig.model_validate({"data": {"val_frac": 0.1}})


# ------------------------------------------------------------------------------------------------------
# Prefect task
# ------------------------------------------------------------------------------------------------------


@pytest.fixture
def task_harness(prefect_harness: None) -> Iterator[None]:
    """The session's Prefect API (conftest), with the download task allowed to run outside a flow."""
    from prefect.settings import PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW, temporary_settings

    with temporary_settings({PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW: "ignore"}):  # called outside a flow
        yield


def test_download_task_second_call_is_cached_and_revalidated(
    task_harness: None, generated: Generated, http_server: HttpServer, tmp_path: Path
) -> None:
    from sweepflow.tasks.download import dataset_cache_key, download_dataset

    config = DataConfig(
        name="mnist",
        source=f"{http_server.url}/mnist",
        cache_dir=str(tmp_path),
        checksums=generated.mnist_md5,
    ).to_dict()
    assert dataset_cache_key(config) == dataset_cache_key(DataConfig.from_dict(config))

    start = time.perf_counter()
    first = download_dataset(config, return_state=True)
    assert first.is_completed() and first.name == "Completed"
    result = first.result()
    assert PreparedDataset.from_dict(result).sizes["test"] == N_TEST
    requests_after_first = len(http_server.requests)

    second = download_dataset(DataConfig.from_dict(config), return_state=True)  # model form: same key
    assert second.name == "Cached"
    assert second.result() == result
    assert len(http_server.requests) == requests_after_first

    # The cache hit is refused once the prepared directory is gone: the task runs and rebuilds it.
    for path in Path(result["path"]).iterdir():
        path.unlink()
    Path(result["path"]).rmdir()
    third = download_dataset(config, return_state=True)
    assert third.name == "Completed"
    assert third.result() == result and Path(result["path"], "meta.json").is_file()
    assert len(http_server.requests) == requests_after_first  # rebuilt from the verified raw cache
    assert download_dataset(config, return_state=True).name == "Cached"
    print(f"prefect task calls took {time.perf_counter() - start:.1f}s")


def test_download_task_with_s3_cache_is_cached_and_revalidated(
    task_harness: None, s3: S3, cache_bucket: str, host: Callable[[str], Path]
) -> None:
    from sweepflow.tasks.download import download_dataset

    config = DataConfig(
        name="digits",
        cache_dir=f"s3://{cache_bucket}/cache",
        cache_storage_options=s3.storage_options,
        staging_dir=str(host("host-a")),
    ).to_dict()
    first = download_dataset(config, return_state=True)
    assert first.name == "Completed"
    result = first.result()
    assert result["path"].startswith(f"s3://{cache_bucket}/cache/prepared/digits-")
    assert "testing" not in json.dumps(result), "the Prefect result must not hold credentials"

    second = download_dataset(config, return_state=True)
    assert second.name == "Cached" and second.result() == result

    # The cache hit is refused once the prepared objects are gone from S3: the task runs and re-uploads.
    prefix = _key(result["path"], cache_bucket)
    _s3_client(s3).delete_objects(
        Bucket=cache_bucket, Delete={"Objects": [{"Key": f"{prefix}/{name}"} for name in PREPARED_FILES]}
    )
    third = download_dataset(config, return_state=True)
    assert third.name == "Completed" and third.result() == result
    assert prepared_dataset_exists(result["path"], s3.storage_options)
    assert download_dataset(config, return_state=True).name == "Cached"


# ------------------------------------------------------------------------------------------------------
# A source that publishes new data under the same file names (DataConfig.follow_source)
# ------------------------------------------------------------------------------------------------------


def _publish_later(directory: Path, seed: int, *, seconds: float) -> dict[str, Any]:
    """New files under the same names, modified ``seconds`` from now: HTTP Last-Modified has one-second
    resolution, and a real publisher's next export comes hours later, not within the same second."""
    arrays = write_mnist_files(directory, seed)
    stamp = time.time() + seconds
    for name in IDX_FILES:
        os.utime(directory / name, (stamp, stamp))
    return arrays


def test_download_task_follows_new_data_published_at_the_same_url(task_harness: None, tmp_path: Path) -> None:
    from sweepflow.tasks.download import download_dataset

    published = tmp_path / "published"
    write_mnist_files(published, seed=1)
    with serving_directory(published) as server:
        config = DataConfig(
            name="mnist", source=server.url, cache_dir=str(tmp_path / "cache"), follow_source=True
        ).to_dict()

        def gets(since: int) -> list[str]:
            return sorted(r for r in server.requests[since:] if r.startswith("GET"))

        first = download_dataset(config, return_state=True)
        assert first.name == "Completed"
        result = first.result()
        assert gets(0) == sorted(f"GET /{name}" for name in IDX_FILES)

        # Unchanged: Cached after one HEAD per file; nothing downloaded.
        seen = len(server.requests)
        second = download_dataset(config, return_state=True)
        assert second.name == "Cached" and second.result() == result
        assert sorted(server.requests[seen:]) == sorted(f"HEAD /{name}" for name in IDX_FILES)

        # New data at the same URLs: the task runs again, downloads it and returns its checksum.
        seen = len(server.requests)
        new = _publish_later(published, seed=2, seconds=10)
        third = download_dataset(config, return_state=True)
        assert third.name == "Completed"
        renewed = third.result()
        assert renewed["checksum"] != result["checksum"] and renewed["path"] != result["path"]
        assert gets(seen) == sorted(f"GET /{name}" for name in IDX_FILES)
        test_x, test_y = _denormalise(renewed["path"], "test")
        np.testing.assert_array_equal(test_x[:, 0], new["test_x"])
        np.testing.assert_array_equal(test_y, new["test_y"])
        assert set(load_meta(renewed["path"])["source_versions"]) == set(IDX_FILES)
        # Each raw copy is kept under the version it was fetched at, so the old copies are never reused for it.
        raw = [p for p in _cache_files(tmp_path / "cache") if p.startswith("raw/")]
        assert len(raw) == 2 * len(IDX_FILES), raw

        seen = len(server.requests)
        assert download_dataset(config, return_state=True).name == "Cached"
        assert gets(seen) == []


def test_follow_source_unreachable_is_never_taken_for_unchanged(tmp_path: Path) -> None:
    from sweepflow.tasks.datasets import source_versions
    from sweepflow.tasks.download import PreparedDatasetCachePolicy

    cfg = DataConfig(
        name="mnist", source=f"http://127.0.0.1:{_free_port()}/m", cache_dir=str(tmp_path), follow_source=True
    )
    with pytest.raises(DatasetFetchError, match="transient"):
        source_versions(cfg)
    # No key: the task runs uncached and meets the same error in its body, where it is retried.
    policy = PreparedDatasetCachePolicy()
    assert policy.compute_key(None, {"config": cfg.to_dict()}, {}) is None  # type: ignore[arg-type]
    with pytest.raises(DatasetFetchError, match="transient"):
        prepare_dataset(cfg)


def test_follow_source_drops_a_file_that_changed_while_downloading(tmp_path: Path) -> None:
    published = tmp_path / "published"
    write_mnist_files(published, seed=3)

    class Republishing(_RecordingHandler):
        def do_GET(self) -> None:
            super().do_GET()
            stamp = time.time() + 100  # the next export lands while this one is being downloaded
            os.utime(published / self.path.lstrip("/"), (stamp, stamp))

    with serving_directory(published, Republishing) as server:
        cfg = DataConfig(
            name="mnist", source=server.url, cache_dir=str(tmp_path / "cache"), follow_source=True
        )
        with pytest.raises(DatasetFetchError, match="changed while it was being downloaded"):
            prepare_dataset(cfg)
    assert not [p for p in _cache_files(tmp_path / "cache") if p.startswith("raw/")]


def test_follow_source_on_s3_sees_a_replaced_object(s3: S3, tmp_path: Path) -> None:
    from sweepflow.tasks.datasets import source_versions

    write_mnist_files(tmp_path / "v1", seed=4)
    client = _s3_client(s3)
    prefix = f"follow-{uuid.uuid4().hex[:8]}"
    for name in IDX_FILES:
        client.upload_file(str(tmp_path / "v1" / name), s3.bucket, f"{prefix}/{name}")
    cfg = DataConfig(
        name="mnist",
        source=f"s3://{s3.bucket}/{prefix}",
        storage_options=s3.storage_options,
        cache_dir=str(tmp_path / "cache"),
        follow_source=True,
    )
    before = source_versions(cfg)
    assert before is not None and all("etag" in v for v in before.values())
    first = prepare_dataset(cfg)
    assert source_versions(cfg) == before  # reading it changed nothing

    new = write_mnist_files(tmp_path / "v2", seed=5)
    for name in IDX_FILES:
        client.upload_file(str(tmp_path / "v2" / name), s3.bucket, f"{prefix}/{name}")
    after = source_versions(cfg)
    assert after is not None and all(after[n] != before[n] for n in IDX_FILES)
    second = prepare_dataset(cfg)
    assert second.checksum != first.checksum
    test_x, _ = _denormalise(second.path, "test")
    np.testing.assert_array_equal(test_x[:, 0], new["test_x"])
    assert "testing" not in json.dumps(load_meta(second.path)), "no credentials in the recorded versions"


def test_download_task_retries_only_network_errors() -> None:
    from prefect.states import Failed

    from sweepflow.tasks.download import _retry_on_network_error, download_dataset

    assert download_dataset.retries == 3
    assert _retry_on_network_error(download_dataset, None, Failed(data=DatasetFetchError("timeout")))  # type: ignore[arg-type]
    for exc in (
        DatasetSourceError("404"),
        ChecksumMismatchError("f", "0" * 32, "1" * 32, "here"),
        DatasetConfigError("bad"),
    ):
        assert not _retry_on_network_error(download_dataset, None, Failed(data=exc))  # type: ignore[arg-type]
