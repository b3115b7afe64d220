"""Small helpers for the locations the data stage reads and writes: local paths and fsspec URIs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import fsspec


def protocol(uri: str) -> str | None:
    """The fsspec protocol of ``uri``, or None for a plain local path."""
    if "://" not in uri:
        return None
    return uri.split("://", 1)[0].lower()


def redact(uri: str) -> str:
    """``uri`` without any ``user:password@`` part, for messages, metadata and cache keys."""
    if "://" not in uri:
        return uri
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def endpoint_url(options: Mapping[str, Any] | None) -> str | None:
    """The S3-style endpoint named in fsspec storage options, if any (it names a store, unlike credentials)."""
    if not options:
        return None
    client_kwargs = options.get("client_kwargs") or {}
    return options.get("endpoint_url") or client_kwargs.get("endpoint_url")


def fs_and_path(path: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem for ``path`` (a local directory or a URI) and the path within it."""
    return fsspec.core.url_to_fs(path, **(storage_options or {}))
