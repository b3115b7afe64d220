"""Fetching raw files from a mirror or a ``source`` override, MD5-verified, into a local file atomically.

A file is streamed to a temporary file beside its destination, its MD5 checked against the expected one
(torchvision's list, or ``DataConfig.checksums``), and only then renamed into place: a cache never holds a
partial or corrupt file. Fetch failures are classified into permanent (``DatasetSourceError``) and
transient (``DatasetFetchError``, which the Prefect task retries).

A source that changes in place (``DataConfig.follow_source``) has no MD5 to check against; instead
``source_version`` reads each file's version cheaply (one HTTP ``HEAD``, an S3 ``HeadObject``, a ``stat``),
and a download is only kept if the file still has that version afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import fsspec
import fsspec.asyn

from .errors import ChecksumMismatchError, DatasetError, DatasetFetchError, DatasetSourceError
from .uris import join, protocol, redact

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
#: OSErrors about our own disk, not the source: retrying the download cannot help.
LOCAL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT})


def transient_error_types() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the source could not be reached right now" for the installed backends."""
    types: list[type[BaseException]] = [ConnectionError, TimeoutError, OSError]
    with contextlib.suppress(ImportError):
        import aiohttp  # fsspec's HTTP backend

        types.append(aiohttp.ClientError)
    with contextlib.suppress(ImportError):
        import botocore.exceptions  # s3fs's backend

        types.extend([botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError])
    return tuple(types)


def file_digests(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(md5, sha256) of a file in one pass: MD5 to verify against torchvision's list, sha256 for lineage."""
    md5, sha256 = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            md5.update(chunk)
            sha256.update(chunk)
    return md5.hexdigest(), sha256.hexdigest()


def combined_checksum(digests: Mapping[str, Mapping[str, str]]) -> str:
    """The "data checksum" of a set of raw inputs: sha256 over their sha256s, by name."""
    payload = json.dumps({name: d["sha256"] for name, d in sorted(digests.items())}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def _classify_fetch_error(exc: BaseException, filename: str, url: str) -> DatasetError:
    status = getattr(exc, "status", None)
    permanent = isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        permanent = True
    if permanent:
        return DatasetSourceError(
            f"{filename!r} could not be read from {redact(url)}: {redact(repr(exc))}. Check that `source` points at the "
            "directory holding the dataset's files (with the official file names) and that storage_options "
            "grant read access."
        )
    return DatasetFetchError(
        f"could not download {filename!r} from {redact(url)}: {redact(repr(exc))}. This looks transient (network, "
        "timeout or server error): retry, or use a mirror via DataConfig(source=...)."
    )


def into_verified(
    dest: Path, expected_md5: str | None, source_label: str, fetch: Callable[[str], None]
) -> None:
    """Run ``fetch(tmp)`` into a temp file next to ``dest``, verify its MD5, then atomically rename into place.

    On a mismatch (ChecksumMismatchError) or any fetch error, the temp file is removed and ``dest`` untouched.
    ``expected_md5=None`` (a followed source: no pinned MD5) skips the check but keeps the atomic rename.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(fd)
    try:
        fetch(tmp)
        if expected_md5 is not None:
            actual, _ = file_digests(tmp)
            if actual != expected_md5:
                raise ChecksumMismatchError(dest.name, expected_md5, actual, source_label)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _http_head(fs: Any, url: str) -> dict[str, Any]:
    """The headers of one ``HEAD`` on ``url``, through the fsspec HTTP filesystem's own session (so the
    source's storage_options and ``user:password@`` apply as for the download). Not ``fs.info``: it turns
    every failure, a refused connection included, into FileNotFoundError, and falls back to a GET."""

    async def head() -> dict[str, Any]:
        session = await fs.set_session()
        kwargs = dict(fs.kwargs)
        # identity: the size of the bytes a GET returns, not of a compressed transfer
        headers = {**kwargs.pop("headers", {}), "Accept-Encoding": "identity"}
        async with session.head(fs.encode_url(url), allow_redirects=True, headers=headers, **kwargs) as r:
            r.raise_for_status()
            return {"ETag": r.headers.get("ETag"), "modified": r.headers.get("Last-Modified"),
                    "size": r.headers.get("Content-Length")}  # fmt: skip

    return fsspec.asyn.sync(fs.loop, head)


def _version_of(fs: Any, rpath: str, url: str) -> dict[str, str]:
    """What identifies the current content of ``url`` without reading it: its ETag when the store gives one,
    else its modification time and size (HTTP Last-Modified has one-second resolution: the size catches most
    rewrites within that second), else its size alone."""
    filename = rpath.rstrip("/").rsplit("/", 1)[-1]
    try:
        if protocol(url) in ("http", "https"):
            info = _http_head(fs, url)
        else:
            fs.invalidate_cache(rpath)  # ask the store, not a listing cached earlier in this process
            info = fs.info(rpath)
    except transient_error_types() as exc:
        raise _classify_fetch_error(exc, filename, url) from exc
    return version_from_info(info, url)


def version_from_info(info: Mapping[str, Any], url: str) -> dict[str, str]:
    """A file's version (see ``_version_of``) from what its store says of it (``fs.info``, a listing's entry,
    HTTP headers)."""
    etag = info.get("ETag") or info.get("etag")
    if etag:
        return {"etag": str(etag)}
    modified_keys = ("modified", "LastModified", "mtime", "last_modified")  # HTTP, s3fs, local, others
    modified = next((info[k] for k in modified_keys if info.get(k) is not None), None)
    version = {"modified": str(modified)} if modified is not None else {}
    if info.get("size") is not None:
        version["size"] = str(info["size"])
    if not version:
        raise DatasetSourceError(
            f"{redact(url)} tells neither an ETag, a modification time nor a size, so DataConfig.follow_source "
            "cannot see when it changes; serve it with ETag or Last-Modified headers, or pin its files with "
            "checksums instead of follow_source"
        )
    if "modified" not in version:
        logger.warning(
            "%s has no ETag or modification time: a new file of the same size will not be noticed",
            redact(url),
        )
    return version


def source_version(url: str, storage_options: Mapping[str, Any]) -> dict[str, str]:
    """The current version of the file at ``url`` (see ``_version_of``), read without downloading it.

    Raises DatasetFetchError when the source cannot be reached (retryable: never taken as "unchanged") and
    DatasetSourceError when it answers that the file is not there or not readable.
    """
    fs, rpath = fsspec.core.url_to_fs(url, **storage_options)
    return _version_of(fs, rpath, url)


def _download_verified(
    url: str,
    dest: Path,
    expected_md5: str | None,
    storage_options: Mapping[str, Any],
    source_label: str,
    expected_version: Mapping[str, str] | None = None,
) -> None:
    """Fetch ``url`` from a source into ``dest``, MD5-verified and atomically (see ``into_verified``).

    With ``expected_version`` (a followed source), the file must still have that version once downloaded:
    otherwise it changed during the download, and the copy may mix both versions or not be what the cache
    key names, so it is dropped with a DatasetFetchError (the task's retry then reads the new version).
    """

    def fetch(tmp: str) -> None:
        try:
            fs, rpath = fsspec.core.url_to_fs(url, **storage_options)
            fs.get_file(rpath, tmp)
        except transient_error_types() as exc:
            if isinstance(exc, OSError) and exc.errno in LOCAL_DISK_ERRNOS:
                raise  # our disk, not the source: retrying the download cannot help
            raise _classify_fetch_error(exc, dest.name, url) from exc
        if expected_version is not None:
            now = _version_of(fs, rpath, url)
            if now != dict(expected_version):
                raise DatasetFetchError(
                    f"{dest.name!r} at {redact(url)} changed while it was being downloaded (version "
                    f"{dict(expected_version)} before, {now} after); the copy was dropped. Retry once the "
                    "source has finished publishing"
                )

    into_verified(dest, expected_md5, source_label, fetch)


def verified_local_copy(path: Path, expected_md5: str | None) -> bool:
    """True if ``path`` exists with the expected MD5. A copy with another MD5 is deleted (and False returned).

    ``expected_md5=None`` (a followed source) trusts any existing copy: it was renamed into place whole, and
    its path names the source version it was downloaded at (``prepare._materialise_raw``).
    """
    if not path.exists():
        return False
    if expected_md5 is None:
        return True
    cached_md5, _ = file_digests(path)
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


def fetch_from_source(
    filename: str,
    expected_md5: str | None,
    bases: tuple[str, ...],
    dest: Path,
    storage_options: Mapping[str, Any],
    expected_version: Mapping[str, str] | None = None,
) -> None:
    """Download ``filename`` into ``dest``, verified, trying ``bases`` (mirrors or the source) in order.

    ``expected_md5=None`` with ``expected_version``: a followed source (see ``_download_verified``)."""
    errors: list[DatasetError] = []
    for base in bases:
        url = join(base, filename)
        logger.info("downloading %s", redact(url))
        try:
            _download_verified(url, dest, expected_md5, storage_options, redact(base), expected_version)
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
