"""Checkpoints: directories of files on local disk or any fsspec filesystem.

A checkpoint is committed by a marker file written last (``.sweepflow_checkpoint.json``, holding the metrics
it was reported with). Readers only list committed checkpoints, so a crash mid-upload never exposes a
half-written one. On local disk the directory is additionally staged under a temporary name and renamed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

MARKER = ".sweepflow_checkpoint.json"
_PREFIX = "checkpoint_"


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
        path = os.fspath(path)
        if "://" not in path and not os.path.isdir(path):
            raise FileNotFoundError(
                f"Checkpoint.from_directory: {path!r} is not a directory; save your files there first"
            )
        return cls(path)

    @property
    def filesystem(self) -> fsspec.AbstractFileSystem:
        return _filesystem(self.path, self.storage_options)[0]

    @property
    def is_local(self) -> bool:
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

    def get_metadata(self) -> dict[str, Any]:
        """The marker of a committed checkpoint: its index and the metrics it was reported with."""
        fs, root = _filesystem(self.path, self.storage_options)
        with fs.open(f"{root.rstrip('/')}/{MARKER}", "r") as f:
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


@dataclass(frozen=True)
class StoredCheckpoint:
    """A committed checkpoint as the driver tracks it."""

    index: int
    checkpoint: Checkpoint
    metrics: dict[str, Any]


class RunStorage:
    """The run directory ``storage_path/name`` and the checkpoints in it."""

    def __init__(self, storage_path: str, name: str, storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = dict(storage_options or {})
        self.fs, root = _filesystem(storage_path, self.storage_options)
        self.root = f"{root.rstrip('/')}/{name}"
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.uri = self.root if _is_local(self.fs) else f"{protocol}://{self.root}"

    def _uri(self, path: str) -> str:
        return path if _is_local(self.fs) else f"{self.uri.split('://')[0]}://{path}"

    def persist(self, local_dir: str, index: int, metrics: dict[str, Any]) -> Checkpoint:
        """Copy ``local_dir`` into the run as checkpoint ``index``; returns once it is durably committed."""
        final = f"{self.root}/{_PREFIX}{index:06d}"
        marker = json.dumps({"index": index, "metrics": _jsonable(metrics), "time": time.time()})
        if _is_local(self.fs):
            os.makedirs(self.root, exist_ok=True)
            staging = f"{self.root}/.tmp-{_PREFIX}{index:06d}-{uuid.uuid4().hex[:8]}"
            shutil.copytree(local_dir, staging)
            with open(os.path.join(staging, MARKER), "w") as f:
                f.write(marker)
                f.flush()
                os.fsync(f.fileno())
            if os.path.exists(final):  # left by an attempt that crashed before its marker was read back
                shutil.rmtree(final)
            os.rename(staging, final)
        else:
            if self.fs.exists(final):
                self.fs.rm(final, recursive=True)
            for dirpath, _, filenames in os.walk(local_dir):
                for filename in filenames:
                    src = os.path.join(dirpath, filename)
                    rel = os.path.relpath(src, local_dir).replace(os.sep, "/")
                    self.fs.put_file(src, f"{final}/{rel}")
            with self.fs.open(f"{final}/{MARKER}", "w") as f:  # the commit point: written last
                f.write(marker)
        return Checkpoint(self._uri(final), storage_options=self.storage_options)

    def list_committed(self) -> list[StoredCheckpoint]:
        """Committed checkpoints of the run, oldest first (uncommitted leftovers are ignored)."""
        self.fs.invalidate_cache()
        if not self.fs.exists(self.root):
            return []
        found = []
        for entry in self.fs.ls(self.root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if not name.startswith(_PREFIX):
                continue
            try:
                with self.fs.open(f"{entry.rstrip('/')}/{MARKER}", "r") as f:
                    meta = json.load(f)
            except FileNotFoundError:
                continue  # not committed: its writer crashed before the marker
            ckpt = Checkpoint(self._uri(entry.rstrip("/")), storage_options=self.storage_options)
            found.append(StoredCheckpoint(index=int(meta["index"]), checkpoint=ckpt, metrics=meta["metrics"]))
        return sorted(found, key=lambda s: s.index)

    def delete(self, stored: StoredCheckpoint) -> None:
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
