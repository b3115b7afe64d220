"""Fetching raw files from a mirror or a ``source`` override, MD5-verified, into a local file atomically.

A file is streamed to a temporary file beside its destination, its MD5 checked against the expected one
(torchvision's list, or ``DataConfig.checksums``), and only then renamed into place: a cache never holds a
partial or corrupt file. Fetch failures are classified into permanent (``DatasetSourceError``) and
transient (``DatasetFetchError``, which the Prefect task retries).
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

from .errors import ChecksumMismatchError, DatasetError, DatasetFetchError, DatasetSourceError
from .uris import join, redact

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


def into_verified(dest: Path, expected_md5: str, source_label: str, fetch: Callable[[str], None]) -> None:
    """Run ``fetch(tmp)`` into a temp file next to ``dest``, verify its MD5, then atomically rename into place.

    On a mismatch (ChecksumMismatchError) or any fetch error, the temp file is removed and ``dest`` untouched.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(fd)
    try:
        fetch(tmp)
        actual, _ = file_digests(tmp)
        if actual != expected_md5:
            raise ChecksumMismatchError(dest.name, expected_md5, actual, source_label)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _download_verified(
    url: str, dest: Path, expected_md5: str, storage_options: Mapping[str, Any], source_label: str
) -> None:
    """Fetch ``url`` from a source into ``dest``, MD5-verified and atomically (see ``into_verified``)."""

    def fetch(tmp: str) -> None:
        try:
            fs, rpath = fsspec.core.url_to_fs(url, **storage_options)
            fs.get_file(rpath, tmp)
        except transient_error_types() as exc:
            if isinstance(exc, OSError) and exc.errno in LOCAL_DISK_ERRNOS:
                raise  # our disk, not the source: retrying the download cannot help
            raise _classify_fetch_error(exc, dest.name, url) from exc

    into_verified(dest, expected_md5, source_label, fetch)


def verified_local_copy(path: Path, expected_md5: str) -> bool:
    """True if ``path`` exists with the expected MD5. A copy with another MD5 is deleted (and False returned)."""
    if not path.exists():
        return False
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
    expected_md5: str,
    bases: tuple[str, ...],
    dest: Path,
    storage_options: Mapping[str, Any],
) -> None:
    """Download ``filename`` into ``dest``, verified, trying ``bases`` (mirrors or the source) in order."""
    errors: list[DatasetError] = []
    for base in bases:
        url = join(base, filename)
        logger.info("downloading %s", redact(url))
        try:
            _download_verified(url, dest, expected_md5, storage_options, redact(base))
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
