"""Checkpoints: directories of files on local disk or any fsspec filesystem.

A checkpoint is committed by a marker file written last (``.sweepflow_checkpoint.json``, holding the metrics
it was reported with). Readers only list committed checkpoints, so a crash mid-upload never exposes a
half-written one. On local disk the directory is additionally staged under a temporary name and renamed.

Remote storage may be away for a while (an endpoint restarting, a network blip): each step of writing a
checkpoint (clearing a leftover, each file, the marker) is retried with backoff for up to
``DDP_RUNTIME_STORAGE_RETRY_S`` seconds (default 120; read by the process that writes, i.e. the Dask
worker), then ``StorageUnavailableError`` names the endpoint; the checkpoint is then not committed, so the
previous one stays the latest. Every step is a whole-object PUT or DELETE, so repeating one is harmless.
s3fs retries throttling and dropped reads itself, and botocore a refused connection for a few seconds (5
attempts), but neither waits out an endpoint that is down for longer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ddp_runtime.retry import Backoff, seconds_setting

MARKER = ".sweepflow_checkpoint.json"
#: The file holding a checkpoint's own metadata (``Checkpoint.set_metadata``), Ray's name for it.
METADATA_FILE = ".metadata.json"
_PREFIX = "checkpoint_"
_STAGING = ".tmp-"  # local staging directories: never listed as checkpoints

#: How long (seconds) remote storage may stay unreachable while a checkpoint is written (env overrides).
STORAGE_RETRY_ENV = "DDP_RUNTIME_STORAGE_RETRY_S"
DEFAULT_STORAGE_RETRY_S = 120.0
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")

log = logging.getLogger(__name__)


class StorageUnavailableError(OSError):
    """Remote checkpoint storage did not answer for longer than ``DDP_RUNTIME_STORAGE_RETRY_S``."""


def _storage_retry_s(value: float | None) -> float:
    return seconds_setting(
        value, env=STORAGE_RETRY_ENV, default=DEFAULT_STORAGE_RETRY_S, what="checkpoint storage"
    )


def _network_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean "the endpoint did not answer", not "it refused": worth another attempt."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]  # sockets; asyncio and fsspec timeouts
    with contextlib.suppress(ImportError):  # comes with s3fs: without it there is no S3 endpoint to wait for
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError

        found += [BotoConnectionError, HTTPClientError]  # refused/reset/closed connection, read timeout
    with contextlib.suppress(ImportError):  # s3fs's, gcsfs's and adlfs's HTTP client
        from aiohttp import ClientConnectionError, ClientPayloadError

        found += [ClientConnectionError, ClientPayloadError]
    return tuple(found)


def _is_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError):
        return False  # the endpoint answered: no such bucket, access denied
    return isinstance(exc, _network_errors())


def _redact(text: str) -> str:
    """``text`` with any ``user:password@`` of a URL in it replaced: messages never carry credentials."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


def _filesystem(path: str, storage_options: dict[str, Any] | None) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, _, (root,) = fsspec.get_fs_token_paths(path, storage_options=storage_options or {})
    return fs, root


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


class Checkpoint:
    """A directory of checkpoint files, local or remote (Ray: ``ray.train.Checkpoint``)."""

    def __init__(self, path: str, *, storage_options: dict[str, Any] | None = None) -> None:
        self.path = path
        self.storage_options = dict(storage_options or {})

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint of the files in ``path``, as Ray's ``Checkpoint.from_directory``: the directory is
        referenced, not copied.

        ``report(metrics, checkpoint=...)`` copies it into the run's storage; until then, leave it in place.

        Args:
            path: a local directory, or a URL an fsspec filesystem opens (``s3://bucket/dir``; not checked
                here).

        Raises:
            FileNotFoundError: a local ``path`` that is not a directory.
        """
        path = os.fspath(path)
        if "://" not in path and not os.path.isdir(path):
            raise FileNotFoundError(
                f"Checkpoint.from_directory: {path!r} is not a directory; save your files there first"
            )
        return cls(path)

    @property
    def filesystem(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem ``path`` is on (Ray gives a ``pyarrow.fs.FileSystem``; here it is fsspec's)."""
        return _filesystem(self.path, self.storage_options)[0]

    @property
    def is_local(self) -> bool:
        """Whether the checkpoint is on this machine's disk (no download needed to read it)."""
        return _is_local(self.filesystem)

    def to_directory(self, path: str | None = None) -> str:
        """Copy the checkpoint's files into a local directory (a new temporary one by default)."""
        target = path or tempfile.mkdtemp(prefix="sweepflow-ckpt-")
        fs, root = _filesystem(self.path, self.storage_options)
        os.makedirs(target, exist_ok=True)
        for src in fs.find(root):
            rel = os.path.relpath(src, root)
            if rel == MARKER:
                continue
            dst = os.path.join(target, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            fs.get_file(src, dst)
        return target

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """Yield a local directory with the checkpoint's files (the checkpoint itself when it is local)."""
        if self.is_local:
            yield _filesystem(self.path, self.storage_options)[1]
            return
        local = self.to_directory()
        try:
            yield local
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def _file(self, name: str) -> tuple[fsspec.AbstractFileSystem, str]:
        fs, root = _filesystem(self.path, self.storage_options)
        return fs, f"{root.rstrip('/')}/{name}"

    def get_metadata(self) -> dict[str, Any]:
        """The metadata stored with the checkpoint (``.metadata.json`` in it, as Ray's); ``{}`` when none."""
        fs, path = self._file(METADATA_FILE)
        try:
            with fs.open(path, "r") as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Store ``metadata`` (a JSON-able dict) with the checkpoint, replacing what was there (Ray's
        ``Checkpoint.set_metadata``). Set on a local directory before ``report``, it travels with the
        checkpoint's files; set on a stored checkpoint, it is written there."""
        if not isinstance(metadata, dict):
            raise TypeError(f"Checkpoint.set_metadata takes a dict, got {type(metadata).__name__}")
        fs, path = self._file(METADATA_FILE)
        fs.pipe_file(path, json.dumps(_jsonable(metadata), sort_keys=True).encode())

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into the checkpoint's stored metadata (Ray's ``Checkpoint.update_metadata``)."""
        merged = self.get_metadata()
        merged.update(metadata)
        self.set_metadata(merged)

    def _marker(self) -> dict[str, Any]:
        """The commit marker of a stored checkpoint: its index and the metrics it was reported with."""
        fs, path = self._file(MARKER)
        with fs.open(path, "r") as f:
            return json.load(f)

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)


def _jsonable(value: Any) -> Any:
    """Metrics often hold numpy or torch scalars; store them as plain JSON numbers."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | bool | int | float) or value is None:
        return value
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return str(value)


def default_dir_name(index: int) -> str:
    """The directory of checkpoint ``index`` when ``report`` names none."""
    return f"{_PREFIX}{index:06d}"


def checked_dir_name(name: Any) -> str:
    """``report(checkpoint_dir_name=...)`` checked: one plain directory name."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(
            f"report(checkpoint_dir_name={name!r}): give one directory name (no '/'), e.g. 'epoch_3'"
        )
    if name.startswith("."):
        raise ValueError(
            f"report(checkpoint_dir_name={name!r}): a name starting with '.' is hidden; drop the dot"
        )
    return name


def manifest(local_dir: str) -> dict[str, int]:
    """The files of a local checkpoint directory: relative path ("/"-separated) -> size in bytes. A commit
    marker copied along (a stored checkpoint reported again) is left out: the new commit writes its own."""
    found = {}
    for dirpath, _, filenames in os.walk(local_dir):
        for filename in filenames:
            path = os.path.join(dirpath, filename)
            rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
            if rel != MARKER:
                found[rel] = os.path.getsize(path)
    return found


def _relative(path: str, root: str) -> str:
    root = root.rstrip("/")
    return (
        path[len(root) + 1 :]
        if path.startswith(root + "/")
        else os.path.relpath(path, root).replace(os.sep, "/")
    )


@dataclass(frozen=True)
class StoredCheckpoint:
    """A committed checkpoint as the driver tracks it."""

    index: int
    checkpoint: Checkpoint
    metrics: dict[str, Any]


class RunStorage:
    """The run directory ``storage_path/name`` and the checkpoints in it."""

    def __init__(
        self,
        storage_path: str,
        name: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry_s: float | None = None,
    ) -> None:
        self.storage_options = dict(storage_options or {})
        self._retry_s = retry_s  # None: $DDP_RUNTIME_STORAGE_RETRY_S when a write needs it, else 120 s
        self.fs, root = _filesystem(storage_path, self.storage_options)
        self.root = f"{root.rstrip('/')}/{name}"
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.uri = self.root if _is_local(self.fs) else f"{protocol}://{self.root}"

    def _uri(self, path: str) -> str:
        return path if _is_local(self.fs) else f"{self.uri.split('://')[0]}://{path}"

    def persist(
        self, local_dir: str, index: int, metrics: dict[str, Any], *, name: str | None = None
    ) -> Checkpoint:
        """Copy ``local_dir`` into the run as checkpoint ``index`` (in directory ``name``, by default
        ``checkpoint_<index>``); returns once it is durably committed."""
        name = checked_dir_name(name) if name is not None else default_dir_name(index)
        target = self.begin(name, uuid.uuid4().hex[:8])
        try:
            files = manifest(local_dir)
            self.write_files(local_dir, target, sorted(files), what=f"writing checkpoint {index}")
            details = {"files": len(files), "bytes": sum(files.values())}
            return self.commit(target, name, index, metrics, files, details=details)
        except BaseException:
            self.abandon(target)
            raise

    def location(self, name: str) -> str:
        """Where the checkpoint named ``name`` lives once committed (a path on ``fs``)."""
        return f"{self.root}/{name}"

    def begin(self, name: str, token: str) -> str:
        """Make room for checkpoint ``name`` before any of its files is written; returns where they go. Local:
        a staging directory (``token`` makes it this write's own), renamed into place at the commit; remote: the
        checkpoint's own location, cleared of what an attempt that crashed before its commit left there.

        Raises:
            FileExistsError: a committed checkpoint of this run already has that name.
        """
        final = self.location(name)
        if self._has_marker(final):
            raise FileExistsError(
                f"report(checkpoint_dir_name={name!r}): the run already has a committed checkpoint of that name "
                f"({self._uri(final)}); give each report's checkpoint a name of its own (e.g. with the epoch in it)"
            )
        if _is_local(self.fs):
            staging = f"{self.root}/{_STAGING}{name}-{token}"
            os.makedirs(staging)
            return staging
        retry = self._retrying(f"clearing {self._uri(final)}")
        retry(lambda: self.fs.rm(final, recursive=True) if self.fs.exists(final) else None)
        return final

    def write_files(self, local_dir: str, target: str, files: list[str], *, what: str) -> None:
        """Copy the files ``files`` (paths relative to ``local_dir``, "/"-separated) to ``target`` (from
        ``begin``), each durably (local: fsync'ed; remote: one whole-object PUT, retried while the endpoint is
        away)."""
        if _is_local(self.fs):
            for rel in files:
                dst = os.path.join(target, *rel.split("/"))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(os.path.join(local_dir, *rel.split("/")), dst)
                with open(dst, "rb+") as f:
                    os.fsync(f.fileno())
            return
        retry = self._retrying(f"{what} to {self._uri(target)}")
        for rel in files:
            src = os.path.join(local_dir, *rel.split("/"))
            retry(lambda src=src, rel=rel: self.fs.put_file(src, f"{target}/{rel}"))

    def commit(
        self,
        target: str,
        name: str,
        index: int,
        metrics: dict[str, Any],
        expected: dict[str, int],
        *,
        details: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """Commit the checkpoint whose files were written to ``target``: check that every file of ``expected``
        (relative path -> size) is there with its size, then write the marker, last (local: then rename the
        staging directory into place). ``details`` (JSON-able: which ranks wrote it, ...) go into the marker.
        Returns the committed checkpoint.

        Raises:
            FileNotFoundError: a file is missing or short (e.g. ranks on hosts that do not share a local
                ``storage_path``); nothing is committed.
        """
        self.fs.invalidate_cache()
        found = {
            _relative(path, target): int(info.get("size") or 0)
            for path, info in self.fs.find(target, detail=True).items()
        }
        wrong = sorted(rel for rel, size in expected.items() if found.get(rel) != size)
        if wrong:
            raise FileNotFoundError(
                f"checkpoint {index} is not committed: {len(wrong)} of its {len(expected)} file(s) are missing or "
                f"incomplete in {self._uri(target)} (first: {wrong[0]!r}); every rank must write to the same "
                "storage: a storage_path that all the ranks' hosts share (NFS, S3), not each host's own disk"
            )
        marker = json.dumps(
            {"index": index, "metrics": _jsonable(metrics), "time": time.time(), **_jsonable(details or {})}
        )
        final = self.location(name)
        if _is_local(self.fs):
            with open(os.path.join(target, MARKER), "w") as f:
                f.write(marker)
                f.flush()
                os.fsync(f.fileno())
            if os.path.exists(final):  # left by an attempt that crashed before its marker was written
                shutil.rmtree(final)
            os.rename(target, final)
        else:
            # The commit point, written last and in one PUT: a checkpoint without it is never listed.
            retry = self._retrying(f"committing checkpoint {index} at {self._uri(final)}")
            retry(lambda: self.fs.pipe_file(f"{final}/{MARKER}", marker.encode()))
        return Checkpoint(self._uri(final), storage_options=self.storage_options)

    def abandon(self, target: str) -> None:
        """A write that will not be committed: remove its local staging directory (a remote leftover stays,
        uncommitted, never listed, and is cleared when its name is written again)."""
        if _is_local(self.fs):
            shutil.rmtree(target, ignore_errors=True)

    def _has_marker(self, path: str) -> bool:
        self.fs.invalidate_cache()
        return bool(self.fs.exists(f"{path}/{MARKER}"))

    def endpoint(self) -> str:
        """Where the storage is served from, for messages (credentials removed)."""
        protocol = self.uri.split("://")[0] if "://" in self.uri else "file"
        opts = self.storage_options
        url = (opts.get("client_kwargs") or {}).get("endpoint_url") or opts.get("endpoint_url")
        if not url and protocol in ("s3", "s3a"):  # botocore's own settings, as s3fs uses them
            url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return _redact(str(url)) if url else f"{protocol}:// (its default endpoint)"

    def _retrying(self, what: str) -> Callable[[Callable[[], Any]], Any]:
        """A runner for the steps of one write: each step is retried while the endpoint does not answer, all of
        them within one bound that starts at the write's first failure."""
        budget = _storage_retry_s(self._retry_s)
        backoff = Backoff(budget)  # one bound for all the steps of this write, from its first failure

        def run(step: Callable[[], Any]) -> Any:
            while True:
                try:
                    return step()
                except Exception as exc:
                    if not _is_unreachable(exc):
                        raise
                    waited = backoff.failed()
                    if backoff.failures == 1:
                        log.warning(
                            "%s: storage endpoint %s unreachable (%s); retrying for up to %.0f s",
                            what,
                            self.endpoint(),
                            _redact(f"{type(exc).__name__}: {exc}")[:200],
                            budget,
                        )
                    if waited >= budget:
                        raise StorageUnavailableError(
                            f"{what} failed: the storage endpoint {self.endpoint()} did not answer for "
                            f"{waited:.0f} s ({backoff.failures} failed attempt(s); last error: "
                            f"{_redact(f'{type(exc).__name__}: {exc}')[:300]}). The checkpoint is not committed: "
                            "the previous one stays the latest. Check that the endpoint is up and reachable from "
                            f"the Dask workers; to wait longer for it, raise {STORAGE_RETRY_ENV} (now {budget:g} s) "
                            "in the workers' environment"
                        ) from exc
                    self.fs.invalidate_cache()  # what a failed step listed may be stale
                    backoff.sleep()

        return run

    def list_committed(self) -> list[StoredCheckpoint]:
        """Committed checkpoints of the run, oldest first (uncommitted leftovers are ignored): every directory of
        the run with a commit marker, whatever its name (``report(checkpoint_dir_name=...)``)."""
        self.fs.invalidate_cache()
        if not self.fs.exists(self.root):
            return []
        found = []
        for info in self.fs.ls(self.root, detail=True):
            entry = info["name"]
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(".") or info.get("type") != "directory":
                continue  # staging directories, files
            try:
                with self.fs.open(f"{entry.rstrip('/')}/{MARKER}", "r") as f:
                    meta = json.load(f)
            except FileNotFoundError:
                continue  # not committed: its writer crashed before the marker
            ckpt = Checkpoint(self._uri(entry.rstrip("/")), storage_options=self.storage_options)
            found.append(StoredCheckpoint(index=int(meta["index"]), checkpoint=ckpt, metrics=meta["metrics"]))
        return sorted(found, key=lambda s: s.index)

    def is_committed(self, stored: StoredCheckpoint) -> bool:
        """Whether ``stored`` is still committed. Its deletion removes the marker first, so a copy of its files
        taken while this held, checked after the copy, is whole."""
        self.fs.invalidate_cache()
        return self.fs.exists(f"{_filesystem(stored.checkpoint.path, self.storage_options)[1]}/{MARKER}")

    def delete(self, stored: StoredCheckpoint) -> None:
        """Delete a stored checkpoint: its commit marker first, so a crash halfway leaves it uncommitted
        (ignored), never half-read.
        """
        path = _filesystem(stored.checkpoint.path, self.storage_options)[1]
        # Remove the marker first so a crash mid-delete leaves an uncommitted (ignored) directory.
        self.fs.rm_file(f"{path}/{MARKER}")
        self.fs.rm(path, recursive=True)


def select_kept(
    checkpoints: list[StoredCheckpoint],
    *,
    num_to_keep: int | None,
    score_attribute: str | None,
    score_order: str,
) -> tuple[list[StoredCheckpoint], list[StoredCheckpoint]]:
    """Split checkpoints into (kept, to_delete): the best ``num_to_keep`` by score plus always the latest."""
    if num_to_keep is None or len(checkpoints) <= num_to_keep:
        return list(checkpoints), []
    latest = max(checkpoints, key=lambda s: s.index)
    if score_attribute is None:
        ranked = sorted(checkpoints, key=lambda s: s.index, reverse=True)
    else:
        missing = [s.index for s in checkpoints if score_attribute not in s.metrics]
        if missing:
            raise KeyError(
                f"checkpoint_score_attribute {score_attribute!r} is missing from the metrics reported with "
                f"checkpoints {missing}; report it with every checkpoint or change CheckpointConfig"
            )
        sign = -1.0 if score_order == "max" else 1.0
        ranked = sorted(checkpoints, key=lambda s: (sign * float(s.metrics[score_attribute]), -s.index))
    kept = {s.index for s in ranked[:num_to_keep]} | {latest.index}
    return [s for s in checkpoints if s.index in kept], [s for s in checkpoints if s.index not in kept]
