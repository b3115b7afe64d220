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
