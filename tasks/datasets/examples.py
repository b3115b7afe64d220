"""A few rows of a prepared dataset's test split, as the input example a registered model is stored with.

A project's ``model_fn(checkpoint)`` may return the trained module alone. MLflow then still wants an input
example (it infers the model's signature from it, and the pt2 format traces the graph on it), so the registry
looks for one in the data the model was trained for, in this order:

1. ``schema.json`` + ``test.csv`` / ``test.parquet`` (``data.format: csv | parquet``): the first rows' feature
   columns, as float32, in the schema's order (the columns the model was trained on);
2. ``test.npz`` holding ``x`` (the bundled data sets, and a ``prepare_fn`` that writes that layout): its first
   rows (floating point as float32);
3. ``test/<class>/<image>`` (``data.format: image_folder``): the first images of the test split, as float32
   ``(N, C, H, W)`` in [0, 1] (what torchvision's ``ToTensor`` gives), when they share one size.

The first candidate found is returned with a sentence saying where it came from; the caller keeps it only if
the module accepts it (``forward`` returns a tensor). Nothing found: None, and the model is registered without a
signature. Pure reading: no MLflow, no torch.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .uris import fs_and_path, join

__all__ = ["EXAMPLE_ROWS", "InputExample", "example_layout", "find_input_example"]

#: Rows of the example: more than 1, so that torch.export keeps the batch axis dynamic.
EXAMPLE_ROWS = 4
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass(frozen=True)
class InputExample:
    """A batch of inputs and the sentence saying where it came from (for the registration's log line)."""

    array: np.ndarray
    source: str


def find_input_example(
    data_path: str, storage_options: Mapping[str, Any] | None = None, *, rows: int = EXAMPLE_ROWS
) -> InputExample | None:
    """The first rows of ``data_path``'s test split in the first layout of the module's list that it has, or
    None when it has none of them (or that split is empty)."""
    fs, root = fs_and_path(data_path, storage_options)
    for find in (_from_table, _from_npz, _from_images):
        found = find(fs, root, rows)
        if found is not None and len(found.array):
            return found
    return None


def example_layout(data_path: str, storage_options: Mapping[str, Any] | None = None) -> str | None:
    """Which of the module's layouts ``data_path`` has (the files only: nothing is read), named as the log says
    it before the sweep; None when it has none (a module alone would register without a signature)."""
    fs, root = fs_and_path(data_path, storage_options)
    if fs.exists(join(root, "schema.json")):
        return "schema.json + test.csv/.parquet"
    if fs.exists(join(root, "test.npz")):
        return "test.npz"
    if fs.isdir(join(root, "test")):
        return "test/<class>/<image>"
    return None


def _from_table(fs: Any, root: str, rows: int) -> InputExample | None:
    schema_path = join(root, "schema.json")
    if not fs.exists(schema_path):
        return None
    with fs.open(schema_path, "r") as f:
        schema = json.load(f)
    features = schema.get("features")
    fmt = schema.get("format") or "csv"
    path = join(root, f"test.{fmt}")
    if not isinstance(features, list) or not features or fmt not in ("csv", "parquet") or not fs.exists(path):
        return None
    import pandas as pd

    with fs.open(path, "rb") as f:
        table = pd.read_csv(f, nrows=rows) if fmt == "csv" else pd.read_parquet(io.BytesIO(f.read()))
    missing = [c for c in features if c not in table.columns]
    if missing:
        return None
    try:
        array = table[features].head(rows).to_numpy(np.float32)
    except (TypeError, ValueError):  # a text or other non-numeric feature: the model's own encoding decides
        return None
    return InputExample(array, f"the first {len(array)} rows of the test split's features (test.{fmt}, schema.json)")


def _from_npz(fs: Any, root: str, rows: int) -> InputExample | None:
    path = join(root, "test.npz")
    if not fs.exists(path):
        return None
    with fs.open(path, "rb") as f, np.load(io.BytesIO(f.read()), allow_pickle=False) as npz:
        if "x" not in npz.files:
            return None
        array = np.ascontiguousarray(npz["x"][:rows])
    if np.issubdtype(array.dtype, np.floating):
        array = array.astype(np.float32)
    return InputExample(array, f"the first {len(array)} inputs of the test split (test.npz's x)")


def _from_images(fs: Any, root: str, rows: int) -> InputExample | None:
    test = join(root, "test")
    if not fs.isdir(test):
        return None
    paths = sorted(p for p in fs.find(test) if p.lower().endswith(_IMAGE_SUFFIXES))[:rows]
    if not paths:
        return None
    from PIL import Image

    images = []
    for path in paths:
        with fs.open(path, "rb") as f, Image.open(io.BytesIO(f.read())) as image:
            pixels = np.asarray(image.convert("L" if image.mode in ("L", "1", "I;16") else "RGB"), np.float32)
        images.append((pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)) / 255.0)
    if len({i.shape for i in images}) != 1:
        return None  # images of several sizes: the model's own transform decides, not us
    array = np.stack(images)
    return InputExample(array, f"the first {len(array)} images of the test split (test/<class>/<image>, in [0, 1])")
