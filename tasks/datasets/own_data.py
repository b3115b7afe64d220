"""A team's own data: any file or directory at any fsspec location, prepared once per version of it.

``DataConfig(source=..., prepare_fn=... | format=...)``. Each run:

1. **Lists the source** (one listing, or one HEAD for an HTTP file): every file's version is what its store
   reports (S3/HTTP ETag, else size and modification time), so new rows published under the same name are a
   new version, and an unchanged source downloads nothing.
2. **Copies that version** into the dataset cache, under ``raw/own/<label>-<key>/<version>/`` (the layout of the
   source kept: a file source becomes one file in that directory), and hashes it: the data checksum recorded on
   the parent run and the model version (``sweepflow.data_checksum``).
3. **Prepares it once**: ``prepared/<label>-<fingerprint>/`` (fingerprint: the checksum, the preparer, the split)
   is reused when it exists. Otherwise the preparer runs in this process (the flow's: before any trial, so a
   broken preparer costs no GPU time) into a fresh local directory, which is then published whole: renamed into
   a local cache, uploaded to a remote one with its marker ``_sweepflow.json`` last.

Preparers: the user's ``prepare_fn(raw_dir, out_dir)`` (anything it writes into ``out_dir``), or built in:
``csv``/``parquet`` with ``target`` (a seeded shuffle split by ``val_fraction``/``test_fraction`` into
``train``/``val``/``test`` files of the same format, plus ``schema.json`` naming the target and the features),
and ``image_folder`` (``<class>/<image>`` directories, split per class into ``train/``, ``val/``, ``test/``
with the same layout, for torchvision's ``ImageFolder``). Trials get ``config["data_path"]``: the prepared
directory (a local path, or a URI under a remote cache_dir that the ranks read with fsspec).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import fsspec

from .cache import LocalCache, RemoteCache, open_cache
from .config import PREPARED_FORMAT_VERSION, DataConfig
from .download import combined_checksum, fetch_from_source, file_digests, source_version, version_from_info
from .errors import DatasetConfigError, DatasetFormatError, DatasetSourceError
from .prepared import OWN_DATA_MARKER, PreparedDataset
from .uris import join, protocol, redact

logger = logging.getLogger(__name__)

__all__ = ["MARKER", "own_source_versions", "prepare_own_data", "read_header"]

#: Written last into a prepared directory of one's own data: it is complete. Its content: what was prepared.
MARKER = OWN_DATA_MARKER
TABLE_FORMATS = ("csv", "parquet")
SPLIT_NAMES = ("train", "val", "test")


# ------------------------------------------------------------------------------------------------ the source
def _fs(cfg: DataConfig) -> tuple[Any, str]:
    assert cfg.source is not None  # validated
    return fsspec.core.url_to_fs(cfg.source, **dict(cfg.storage_options or {}))


def own_source_versions(cfg: DataConfig) -> dict[str, dict[str, str]]:
    """Every file of the source (its path relative to the source, for a directory; its name, for a file) and
    its version, read without downloading. Raises DatasetSourceError when there is nothing there."""
    fs, root = _fs(cfg)
    if protocol(cfg.source or "") in ("http", "https"):
        name = root.rstrip("/").rsplit("/", 1)[-1]
        return {name: source_version(cfg.source or "", dict(cfg.storage_options or {}))}
    try:
        is_dir = fs.isdir(root)
        infos = fs.find(root, detail=True) if is_dir else {root: fs.info(root)}
    except FileNotFoundError:
        infos, is_dir = {}, False
    files: dict[str, dict[str, str]] = {}
    for path, info in infos.items():
        if info.get("type") == "directory":
            continue
        rel = os.path.relpath(path, root) if is_dir else path.rstrip("/").rsplit("/", 1)[-1]
        if any(part.startswith(".") for part in Path(rel).parts):
            continue  # .DS_Store, .ipynb_checkpoints: not data
        files[rel.replace(os.sep, "/")] = version_from_info(info, join(cfg.source or "", rel))
    if not files:
        raise DatasetSourceError(
            f"data.source={redact(cfg.source or '')!r} holds no files; point it at your data (a file, or a "
            "directory of files)"
        )
    return dict(sorted(files.items()))


def read_header(cfg: DataConfig, versions: Mapping[str, Any] | None = None) -> list[str]:
    """The column names of a csv/parquet source (its first table file), read without downloading it whole;
    ``versions``: the source's listing (``own_source_versions``), when the caller has it."""
    fs, root = _fs(cfg)
    versions = versions if versions is not None else own_source_versions(cfg)
    tables = [name for name in versions if name.lower().endswith(f".{cfg.format}")] or list(versions)
    first = tables[0]
    path = join(root, first) if fs.isdir(root) else root
    if cfg.format == "csv":
        with fs.open(path, "rb") as f:
            line = f.readline().decode("utf-8-sig", errors="replace")
        import csv

        return next(csv.reader([line]), [])
    import pyarrow.parquet as pq

    with fs.open(path, "rb") as f:
        return list(pq.ParquetFile(f).schema_arrow.names)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _copy_version(cfg: DataConfig, versions: dict[str, dict[str, str]], cache: Any) -> tuple[Path, dict]:
    """The source's files at ``versions``, in one local directory (the cache's, or its staging copy)."""
    version_dir = "v-" + _key(json.dumps(versions, sort_keys=True))
    base = f"raw/own/{cfg.label}-{_key(redact(cfg.source or ''))}/{version_dir}"
    source = cfg.source or ""
    fs, root = _fs(cfg)
    is_file = protocol(source) in ("http", "https") or not fs.isdir(root)
    source_base = source.rstrip("/").rsplit("/", 1)[0] if is_file else source
    options = dict(cfg.storage_options or {})
    digests: dict[str, dict[str, str]] = {}
    local_root: Path | None = None
    for rel, version in versions.items():
        relpath = f"{base}/{rel}"
        fetch = _fetcher(rel, source_base, options, version)
        path = cache.ensure_raw_file(relpath, None, fetch)
        md5, sha = file_digests(path)
        digests[rel] = {"md5": md5, "sha256": sha}
        local_root = Path(str(path)[: -len(rel)].rstrip("/"))
    assert local_root is not None
    return local_root, digests


def _fetcher(rel: str, source_base: str, options: dict, version: dict) -> Callable[[Path], None]:
    def fetch(dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fetch_from_source(rel, None, (source_base,), dest, storage_options=options, expected_version=version)

    return fetch


# ------------------------------------------------------------------------------------------------ preparing
def prepare_own_data(cfg: DataConfig, *, import_fn: Callable[[str], Callable[..., Any]]) -> PreparedDataset:
    """Copy the source's current version into the cache and prepare it, once per version (see the module doc).
    ``import_fn``: imports the user's ``prepare_fn`` (the caller's, with the project's directory importable)."""
    cfg = DataConfig.coerce(cfg)
    cache = open_cache(cfg)
    versions = own_source_versions(cfg)
    raw_dir, digests = _copy_version(cfg, versions, cache)
    checksum = combined_checksum(digests)
    preparer = cfg.prepare_fn or f"{cfg.format}:{cfg.target or ''}"
    fingerprint = _key(
        json.dumps(
            {
                "format_version": PREPARED_FORMAT_VERSION,
                "checksum": checksum,
                "preparer": preparer,
                "val_fraction": cfg.val_fraction,
                "test_fraction": cfg.test_fraction,
                "seed": cfg.seed,
            },
            sort_keys=True,
        )
    )
    relpath = f"prepared/{cfg.label}-{fingerprint}"
    marker = _read_marker(cache, relpath)
    if marker is not None:
        logger.info("reusing prepared %s at %s", cfg.label, cache.uri_of(relpath))
        return _prepared(cache.uri_of(relpath), marker)
    meta = {
        "format_version": PREPARED_FORMAT_VERSION,
        "name": cfg.label,
        "checksum": checksum,
        "source": redact(cfg.source or ""),
        "source_versions": versions,
        "raw_files": digests,
        "preparer": preparer,
        "split": {"seed": cfg.seed, "val_fraction": cfg.val_fraction, "test_fraction": cfg.test_fraction},
    }
    staging = Path(tempfile.mkdtemp(prefix=f".prepare-{cfg.label}-", dir=_scratch(cache)))
    try:
        out_dir = staging / "out"
        out_dir.mkdir()
        if cfg.prepare_fn:
            prepare = import_fn(cfg.prepare_fn)
            prepare(str(raw_dir), str(out_dir))
            if not any(out_dir.iterdir()):
                raise DatasetFormatError(
                    f"data.prepare_fn={cfg.prepare_fn!r} wrote nothing into out_dir: write the prepared data "
                    "(the files your train_fn reads from config['data_path']) there"
                )
        elif cfg.format in TABLE_FORMATS:
            meta.update(_split_table(raw_dir, out_dir, cfg))
        else:
            meta.update(_split_image_folder(raw_dir, out_dir, cfg))
        _publish(cache, relpath, out_dir, meta)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("prepared %s at %s", cfg.label, cache.uri_of(relpath))
    return _prepared(cache.uri_of(relpath), meta)


def _scratch(cache: Any) -> str:
    root = cache.root if isinstance(cache, LocalCache) else cache.staging
    Path(root).mkdir(parents=True, exist_ok=True)
    return str(root)


def _read_marker(cache: Any, relpath: str) -> dict[str, Any] | None:
    if isinstance(cache, LocalCache):
        path = cache.root / relpath / MARKER
        return json.loads(path.read_text()) if path.is_file() else None
    assert isinstance(cache, RemoteCache)
    cache.fs.invalidate_cache(cache._path(relpath))
    try:
        with cache.fs.open(cache._path(join(relpath, MARKER)), "r") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _publish(cache: Any, relpath: str, out_dir: Path, meta: dict[str, Any]) -> None:
    """``out_dir`` into the cache at ``relpath``, the marker last: readers never take a partial set for one."""
    if isinstance(cache, LocalCache):
        final = cache.root / relpath
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # a set without its marker: an interrupted publish
            shutil.rmtree(final)
        (out_dir / MARKER).write_text(json.dumps(meta, indent=2, sort_keys=True))
        tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        shutil.move(str(out_dir), tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MARKER).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # prepared concurrently by another process: use that one
        return
    for path in sorted(p for p in out_dir.rglob("*") if p.is_file()):
        cache.upload(path, join(relpath, path.relative_to(out_dir).as_posix()))
    marker = out_dir.parent / MARKER
    marker.write_text(json.dumps(meta, indent=2, sort_keys=True))
    cache.upload(marker, join(relpath, MARKER))


def _prepared(path: str, meta: Mapping[str, Any]) -> PreparedDataset:
    return PreparedDataset(
        name=str(meta["name"]),
        path=path,
        num_classes=int(meta.get("num_classes", 0)),
        input_shape=tuple(int(v) for v in meta.get("input_shape", ())),
        sizes={str(k): int(v) for k, v in (meta.get("sizes") or {}).items()},
        checksum=str(meta["checksum"]),
        source=str(meta["source"]),
    )


# ------------------------------------------------------------------------------------------ built-in preparers
def _split_sizes(n: int, cfg: DataConfig) -> tuple[int, int]:
    n_val, n_test = round(n * cfg.val_fraction), round(n * cfg.test_fraction)
    if n - n_val - n_test < 1 or n_val < 1 or n_test < 1:
        raise DatasetFormatError(
            f"data.source {cfg.label!r} has {n} rows/items: too few to split into train, val and test with "
            f"val_fraction={cfg.val_fraction} and test_fraction={cfg.test_fraction}"
        )
    return n_val, n_test


def _split_table(raw_dir: Path, out_dir: Path, cfg: DataConfig) -> dict[str, Any]:
    import numpy as np
    import pandas as pd

    suffix = f".{cfg.format}"
    files = sorted(p for p in raw_dir.rglob("*") if p.is_file() and p.name.lower().endswith(suffix))
    if not files:
        raise DatasetFormatError(f"data.source {cfg.label!r} has no *{suffix} file (format: {cfg.format})")
    read = pd.read_csv if cfg.format == "csv" else pd.read_parquet
    try:
        table = pd.concat([read(p) for p in files], ignore_index=True)
    except (ValueError, OSError) as exc:
        raise DatasetFormatError(f"data.source {cfg.label!r}: cannot read it as {cfg.format}: {exc}") from exc
    if cfg.target not in table.columns:
        raise DatasetConfigError(
            f"data.target={cfg.target!r} is not a column of {cfg.label!r}; its columns: {list(table.columns)[:20]}"
        )
    n_val, n_test = _split_sizes(len(table), cfg)
    order = np.random.default_rng(cfg.seed).permutation(len(table))
    parts = {
        "test": table.iloc[order[:n_test]],
        "val": table.iloc[order[n_test : n_test + n_val]],
        "train": table.iloc[order[n_test + n_val :]],
    }
    for split, part in parts.items():
        path = out_dir / f"{split}{suffix}"
        part.reset_index(drop=True).to_csv(path, index=False) if cfg.format == "csv" else part.reset_index(
            drop=True
        ).to_parquet(path, index=False)
    features = [c for c in table.columns if c != cfg.target]
    schema = {"target": cfg.target, "features": features, "format": cfg.format}
    (out_dir / "schema.json").write_text(json.dumps(schema, indent=2))
    return {"sizes": {split: len(parts[split]) for split in SPLIT_NAMES}, "target": cfg.target, "features": features}


def _split_image_folder(raw_dir: Path, out_dir: Path, cfg: DataConfig) -> dict[str, Any]:
    import numpy as np

    classes = sorted(p.name for p in raw_dir.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise DatasetFormatError(
            f"data.source {cfg.label!r} is not an image folder: it needs one directory per class "
            f"(<class>/<image>), found {classes or 'none'}"
        )
    rng = np.random.default_rng(cfg.seed)
    sizes = dict.fromkeys(SPLIT_NAMES, 0)
    for name in classes:
        images = sorted(p for p in (raw_dir / name).rglob("*") if p.is_file())
        n_val, n_test = _split_sizes(len(images), cfg)
        order = rng.permutation(len(images))
        chosen = {
            "test": order[:n_test],
            "val": order[n_test : n_test + n_val],
            "train": order[n_test + n_val :],
        }
        for split, indices in chosen.items():
            for i in indices:
                dest = out_dir / split / name / images[i].relative_to(raw_dir / name)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(images[i], dest)
            sizes[split] += len(indices)
    return {"sizes": sizes, "num_classes": len(classes), "class_names": classes}
