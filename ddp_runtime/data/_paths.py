"""The paths readers and writers take: local paths made absolute where they are called (ranks run in their
trial directories); URLs (``s3://``, ``http(s)://``, any fsspec URL) as given."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


def _absolute(paths: str | Sequence[str]) -> str | list[str]:
    """Local paths made absolute where the reader is called: ranks run in their trial directories."""

    def one(path: str) -> str:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"a path must be a string (local, s3://, http(s)://), got {type(path).__name__}")
        path = os.fspath(path)
        return path if "://" in path else os.path.abspath(os.path.expanduser(path))

    if isinstance(paths, str | os.PathLike):
        return one(paths)
    return [one(p) for p in paths]


def _reader_paths(paths: Any) -> str | list[str]:
    if isinstance(paths, str | os.PathLike):
        return _absolute(paths)
    if isinstance(paths, list | tuple) and paths:
        return _absolute(list(paths))
    raise TypeError(f"paths must be a path or a non-empty list of paths, got {paths!r}")


_ANONYMOUS_S3 = "s3://anonymous@"


def _reader_source(
    paths: Any, storage_options: dict[str, Any] | None
) -> tuple[str | list[str], dict[str, Any] | None]:
    """The paths as fsspec reads them, and its options. Ray's spelling of a public bucket read without
    credentials, ``s3://anonymous@bucket/key`` (pyarrow's), is s3fs's ``s3://bucket/key`` with ``anon=True``."""
    resolved = _reader_paths(paths)
    listed = [resolved] if isinstance(resolved, str) else resolved
    anonymous = [p.startswith(_ANONYMOUS_S3) for p in listed]
    if not any(anonymous):
        return resolved, storage_options
    if not all(anonymous):
        raise ValueError("paths mix s3://anonymous@... with other paths: read them as separate datasets")
    stripped = ["s3://" + p[len(_ANONYMOUS_S3) :] for p in listed]
    options = {**(storage_options or {}), "anon": True}
    return (stripped[0] if isinstance(resolved, str) else stripped), options
