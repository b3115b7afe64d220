"""Small helpers for the locations the data stage reads and writes: local paths and fsspec URIs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import fsspec


def protocol(uri: str) -> str | None:
    """The fsspec protocol of ``uri``, or None for a plain local path."""
    if "://" not in uri:
        return None
    return uri.split("://", 1)[0].lower()


#: The ``user:password@`` of a URI (anywhere in a text): everything between ``scheme://`` and the last ``@``
#: before the path.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")


def redact(text: str) -> str:
    """``text`` (a URI, or a message that contains URIs) with every ``user:password@`` replaced by ``***@``, for
    messages, metadata and cache keys. The one redaction: everything shown or stored goes through it."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


def split_userinfo(uri: str) -> tuple[str, str | None, str | None]:
    """``uri`` without its ``user:password@`` part, and the (percent-decoded) user and password, or Nones: to
    carry the credentials apart from the location (e.g. as MLFLOW_TRACKING_USERNAME / _PASSWORD)."""
    if "://" not in uri:
        return uri, None, None
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri, None, None
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return bare, user, password


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
