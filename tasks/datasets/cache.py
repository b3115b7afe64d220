"""The dataset cache: ``<cache_dir>/raw/<dataset>/<file>`` and ``<cache_dir>/prepared/<dataset>-<fp>/``.

``cache_dir`` is a local directory (``LocalCache``) or a writable fsspec URI such as ``s3://bucket/prefix``
(``RemoteCache``). Both offer the same operations to ``prepare_dataset``: a verified local copy of a raw
file, whether a prepared set exists, reading its ``meta.json``, publishing a new set. A local cache renames
a complete temporary directory into place; object stores have no rename, so a remote cache works in a
host-local staging directory and uploads ``meta.json`` last (see ``RemoteCache``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .config import DataConfig
from .download import LOCAL_DISK_ERRNOS, into_verified, transient_error_types, verified_local_copy
from .errors import ChecksumMismatchError, DatasetConfigError, DatasetError, DatasetFetchError
from .prepared import (
    PreparedDataset,
    load_meta,
    prepared_complete,
    prepared_dataset_exists,
    prepared_from_meta,
    write_prepared_files,
)
from .split import SPLITS
from .uris import fs_and_path, join

logger = logging.getLogger(__name__)

Arrays = dict[str, tuple[np.ndarray, np.ndarray]]
#: Fetches a raw file from its source into the given local path, MD5-verified (``download.fetch_from_source``).
#: Where ``expected_md5`` is None below, the file comes from a followed source (``DataConfig.follow_source``):
#: it has no pinned MD5, and its ``relpath`` names the source version it was fetched at.
Fetch = Callable[[Path], None]


class DatasetCache(Protocol):
    """What ``prepare_dataset`` needs from a cache; ``relpath`` is relative to ``cache_dir``."""

    def uri_of(self, relpath: str) -> str: ...

    def ensure_raw_file(self, relpath: str, expected_md5: str | None, fetch: Fetch) -> Path: ...

    def prepared_exists(self, relpath: str) -> bool: ...

    def load_prepared(self, relpath: str) -> PreparedDataset: ...

    def publish_prepared(self, relpath: str, arrays: Arrays, meta: dict[str, Any]) -> None: ...


def open_cache(cfg: DataConfig) -> DatasetCache:
    """The cache ``cfg.cache_dir`` names. The library picks no default location: a missing one is an error."""
    if cfg.cache_dir is None:
        raise DatasetConfigError(
            "DataConfig.cache_dir is not set: the data library reads no environment and picks no default "
            "location. Pass cache_dir=... (a local directory or s3://bucket/prefix); the pipeline's entry "
            "point (flows/settings.py: resolve_settings) sets it to <storage>/datasets or <state_dir>/data"
        )
    return RemoteCache.for_config(cfg) if cfg.cache_is_remote else LocalCache(Path(cfg.cache_dir))


# --------------------------------------------------------------------------------------------------------
# Local cache: a directory (a shared mount works for multi-node)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalCache:
    """A local ``cache_dir``: raw files verified in place, prepared sets renamed into place whole."""

    root: Path

    def uri_of(self, relpath: str) -> str:
        return str(self.root / relpath)

    def ensure_raw_file(self, relpath: str, expected_md5: str | None, fetch: Fetch) -> Path:
        """The verified cached copy of a raw file (``raw/<dataset>/<file>``), fetched first if needed."""
        dest = self.root / relpath
        if not verified_local_copy(dest, expected_md5):
            fetch(dest)
        return dest

    def prepared_exists(self, relpath: str) -> bool:
        """True if the set is complete; an incomplete one (files removed?) is deleted, to be prepared again."""
        final = self.root / relpath
        if prepared_dataset_exists(str(final)):
            return True
        if final.exists():
            logger.warning("%s is incomplete (files were removed?); preparing it again", final)
            shutil.rmtree(final)
        return False

    def load_prepared(self, relpath: str) -> PreparedDataset:
        path = self.uri_of(relpath)
        return prepared_from_meta(path, load_meta(path))

    def publish_prepared(self, relpath: str, arrays: Arrays, meta: dict[str, Any]) -> None:
        """Write splits + meta into a temp dir beside the target, then rename it: readers never see a partial set."""
        final = self.root / relpath
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            write_prepared_files(tmp, arrays, meta)
            try:
                os.rename(tmp, final)
            except OSError:
                if not prepared_dataset_exists(str(final)):
                    raise
                logger.info("%s was prepared concurrently by another process; using that copy", final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


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
    except transient_error_types() as exc:
        if isinstance(exc, OSError) and exc.errno in LOCAL_DISK_ERRNOS:
            raise  # the local staging disk, not the store: retrying cannot help
        raise DatasetFetchError(
            f"could not {action} {uri} in the dataset cache: {exc!r}. This looks transient (network, timeout "
            "or server error): retry"
        ) from exc


@dataclass(frozen=True)
class RemoteCache:
    """A remote ``cache_dir`` and this host's staging directory for it.

    Paths are relative to the cache (``raw/mnist/<file>``, ``prepared/<name>-<fp>/meta.json``). The staging
    directory is ``<DataConfig.staging_dir>/<sha of the URI>``: one per cache URI, kept between runs, so a
    host downloads each raw file at most once and verifies it again (MD5) before every reuse.
    """

    uri: str
    fs: Any
    root: str
    staging: Path

    @classmethod
    def for_config(cls, cfg: DataConfig) -> RemoteCache:
        assert cfg.cache_dir is not None
        if cfg.staging_dir is None:
            raise DatasetConfigError(
                f"DataConfig.staging_dir is not set, but the remote cache_dir {cfg.cache_dir} needs a local "
                "directory on this host for verified copies of its files. Pass staging_dir=... (e.g. "
                "~/.sweepflow/data/remote-staging); the pipeline's entry point (flows/settings.py: "
                "resolve_settings) sets it under the state dir"
            )
        fs, root = fs_and_path(cfg.cache_dir, cfg.cache_storage_options)
        digest = hashlib.sha256(cfg.cache_dir.encode()).hexdigest()[:16]
        return cls(cfg.cache_dir, fs, root.rstrip("/"), Path(cfg.staging_dir) / digest)

    def uri_of(self, relpath: str) -> str:
        return join(self.uri, relpath)

    def _path(self, relpath: str) -> str:
        return join(self.root, relpath)

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

    def download(self, relpath: str, dest: Path, expected_md5: str | None) -> bool:
        """Download ``relpath`` into ``dest``, MD5-verified; False (``dest`` untouched) if its MD5 is wrong."""
        uri = self.uri_of(relpath)

        def fetch(tmp: str) -> None:
            with _cache_io("download", uri):
                self.fs.get_file(self._path(relpath), tmp)

        try:
            into_verified(dest, expected_md5, uri, fetch)
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

    def ensure_raw_file(self, relpath: str, expected_md5: str | None, fetch: Fetch) -> Path:
        """The verified local (staged) copy of a raw file (``raw/<dataset>/<file>``), the remote cache holding it too.

        Staged copy with the right MD5: used as is, and uploaded if the remote copy is missing or has
        another size. Otherwise the remote copy is downloaded and verified; if it is missing or its MD5 is
        wrong, the file is fetched from the source, verified, and uploaded (replacing a wrong copy).
        """
        staged = self.staging / relpath
        if verified_local_copy(staged, expected_md5):
            if self.size(relpath) != staged.stat().st_size:
                logger.info(
                    "%s is missing or differs from the verified copy; uploading it", self.uri_of(relpath)
                )
                self.upload(staged, relpath)
            return staged
        if self.size(relpath) is not None and self.download(relpath, staged, expected_md5):
            logger.debug("using %s from the dataset cache", self.uri_of(relpath))
            return staged
        fetch(staged)
        logger.info("uploading %s", self.uri_of(relpath))
        self.upload(staged, relpath)
        return staged

    def prepared_exists(self, relpath: str) -> bool:
        with _cache_io("look up", self.uri_of(relpath)):
            return prepared_complete(self.fs, self._path(relpath))

    def load_prepared(self, relpath: str) -> PreparedDataset:
        with _cache_io("read", self.uri_of(relpath)):
            with self.fs.open(self._path(join(relpath, "meta.json")), "r") as f:
                meta = json.load(f)
        return prepared_from_meta(self.uri_of(relpath), meta)

    def publish_prepared(self, relpath: str, arrays: Arrays, meta: dict[str, Any]) -> None:
        """Write the prepared files locally, then upload the splits and ``meta.json`` last.

        S3 has no rename, so completeness is marked by order instead: ``prepared_dataset_exists`` requires
        ``meta.json``, which only appears once every split is in place. A stale ``meta.json`` (from a set
        whose splits were deleted) is removed first, so it cannot vouch for half-uploaded splits.
        """
        if self.size(join(relpath, "meta.json")) is not None:
            logger.warning("%s is incomplete (files were removed?); preparing it again", self.uri_of(relpath))
            self.remove(join(relpath, "meta.json"))
        self.staging.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.staging, prefix=".tmp-prepared-"))
        try:
            write_prepared_files(tmp, arrays, meta)
            for name in (*(f"{split}.npz" for split in SPLITS), "meta.json"):  # meta.json last
                self.upload(tmp / name, join(relpath, name))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
