"""The prepared directory: ``train.npz``, ``val.npz``, ``test.npz`` (keys ``x``, ``y``) and ``meta.json``.

``PreparedDataset`` describes one (what a model needs to know, and where it is); ``load_split`` and
``load_meta`` read it on any host, from a local directory or an fsspec URI. ``meta.json`` marks a complete
set: it is written (or uploaded) last. torch is imported lazily, only in ``load_split``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DatasetSourceError
from .split import SPLITS
from .uris import fs_and_path, join

if TYPE_CHECKING:
    import torch

__all__ = ["PreparedDataset", "load_meta", "load_split", "prepared_dataset_exists"]


#: The last file written into a prepared directory of one's own data (``own_data.MARKER``).
OWN_DATA_MARKER = "_sweepflow.json"


def _split_order(item: tuple[str, Any]) -> tuple[int, str]:
    return (SPLITS.index(item[0]) if item[0] in SPLITS else len(SPLITS), item[0])


@dataclass(frozen=True)
class PreparedDataset:
    """A prepared dataset on disk: where it is and what a model needs to know about it.

    ``checksum`` is the sha256 of the raw inputs ("data checksum", for lineage in MLflow); ``path`` is
    the prepared directory that ``load_split``/``load_meta`` read. Passed between tasks as ``to_dict()``.
    """

    name: str
    path: str
    num_classes: int  # 0: not a classification set (one's own data, unless an image folder)
    input_shape: tuple[int, ...]  # [C, H, W] of a bundled set's images; () for one's own data
    sizes: dict[str, int]
    checksum: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
            "sizes": dict(self.sizes),
            "checksum": self.checksum,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreparedDataset:
        try:
            shape = tuple(int(v) for v in data["input_shape"])
            if len(shape) not in (0, 3):
                raise ValueError(f"input_shape must have 3 entries [C, H, W] (or none), got {list(shape)}")
            return cls(
                name=str(data["name"]),
                path=str(data["path"]),
                num_classes=int(data["num_classes"]),
                input_shape=shape,
                sizes={str(k): int(v) for k, v in sorted(data["sizes"].items(), key=_split_order)},
                checksum=str(data["checksum"]),
                source=str(data["source"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"not a PreparedDataset dict ({exc!r}); expected the output of PreparedDataset.to_dict()"
            ) from exc


def prepared_complete(fs: Any, root: str) -> bool:
    """True if ``root`` on ``fs`` holds ``meta.json`` and all three splits (asking the store, not a cache)."""
    fs.invalidate_cache(root)  # ask the store itself: another host may have added or deleted files
    if fs.exists(join(root, OWN_DATA_MARKER)):  # one's own data, published whole (own_data.py)
        return True
    return all(fs.exists(join(root, name)) for name in ("meta.json", *(f"{s}.npz" for s in SPLITS)))


def prepared_dataset_exists(path: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """True if ``path`` holds a complete prepared dataset (meta.json and all three split files).

    ``path`` is a local directory or any fsspec URI (``s3://...``); ``storage_options`` are fsspec options
    for it (without them, s3fs uses the standard AWS chain: AWS_* environment variables, profiles, roles).
    """
    fs, root = fs_and_path(path, storage_options)
    return prepared_complete(fs, root)


def load_meta(path: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The prepared dataset's ``meta.json`` (name, num_classes, input_shape, sizes, mean, std, ...).

    ``path`` and ``storage_options`` as for ``prepared_dataset_exists``.
    """
    fs, root = fs_and_path(path, storage_options)
    meta_path = join(root, "meta.json")
    try:
        with fs.open(meta_path, "r") as f:
            return json.load(f)
    except FileNotFoundError as exc:
        raise DatasetSourceError(
            f"no prepared dataset at {path!r} (missing meta.json); run prepare_dataset (or the "
            "download_dataset task) first and pass the path it returns"
        ) from exc


def load_split(
    path: str, split: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one prepared split as (x float32 (N, C, H, W), y int64 (N,)) tensors.

    Called by training ranks on Dask workers; reads only the requested split. ``path`` is a local directory
    or an fsspec URI such as ``s3://bucket/prefix/prepared/<name>-<fp>``; ``storage_options`` as for
    ``prepared_dataset_exists`` (on workers, prefer the AWS environment so no credentials travel in configs).
    """
    import torch

    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)} (got {split!r})")
    fs, root = fs_and_path(path, storage_options)
    split_path = join(root, f"{split}.npz")
    try:
        with fs.open(split_path, "rb") as f, np.load(f, allow_pickle=False) as npz:
            x, y = npz["x"], npz["y"]
    except FileNotFoundError as exc:
        raise DatasetSourceError(
            f"no {split!r} split at {path!r}; run prepare_dataset (or the download_dataset task) first "
            "and pass the path it returns"
        ) from exc
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(y.astype(np.int64))


def prepared_from_meta(path: str, meta: Mapping[str, Any]) -> PreparedDataset:
    return PreparedDataset.from_dict({**meta, "path": path})


def write_prepared_files(
    directory: Path, arrays: dict[str, tuple[np.ndarray, np.ndarray]], meta: dict[str, Any]
) -> None:
    """Write the splits, then ``meta.json``, into a local ``directory``."""
    for split, (x, y) in arrays.items():
        with open(directory / f"{split}.npz", "wb") as f:
            np.savez(f, x=x, y=y)
    with open(directory / "meta.json", "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
