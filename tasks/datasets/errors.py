"""The data stage's errors: each kind tells the caller (and a Prefect retry policy) whether trying again can help."""

from __future__ import annotations

__all__ = [
    "ChecksumMismatchError",
    "DatasetConfigError",
    "DatasetError",
    "DatasetFetchError",
    "DatasetFormatError",
    "DatasetSourceError",
]


class DatasetError(Exception):
    """Base class of every error raised by ``sweepflow.tasks.datasets``."""


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
