"""What a batch is: Ray's batch formats (``"pandas"``, ``"numpy"``), the checks of ``batch_format`` and
``batch_size``, and a partition's rows as a pandas or numpy batch (and a numpy batch back as a DataFrame)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pandas as pd

BatchFormat = Literal["pandas", "numpy"]
_BATCH_FORMATS = ("pandas", "numpy")
_DEFAULT_BATCH_SIZE = 256  # Ray's default for iter_batches / iter_torch_batches


def _check_batch_format(batch_format: str) -> None:
    if batch_format not in _BATCH_FORMATS:
        raise ValueError(
            f"batch_format must be 'pandas' or 'numpy' (a dict of column -> ndarray), got {batch_format!r}"
        )


def _check_batch_size(batch_size: Any, *, allow_none: bool) -> None:
    if batch_size is None and allow_none:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        none = " or None (a whole partition)" if allow_none else ""
        raise ValueError(f"batch_size must be an int >= 1{none}, got {batch_size!r}")


def _to_numpy(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """A pandas batch as Ray's numpy batch: column -> ndarray (a column of arrays stacked into one array)."""
    batch: dict[str, np.ndarray] = {}
    for column in frame.columns:
        values = frame[column].to_numpy()
        if values.dtype == object and len(values) and isinstance(values[0], np.ndarray | list | tuple):
            values = np.stack([np.asarray(v) for v in values])
        batch[str(column)] = values
    return batch


def _from_numpy_batch(batch: Any) -> pd.DataFrame:
    """What a numpy-format ``map_batches`` function returned, back as a DataFrame."""
    if isinstance(batch, pd.DataFrame):
        return batch
    if not isinstance(batch, dict):
        raise TypeError(
            f"a map_batches function with batch_format='numpy' must return a dict of column -> array, "
            f"got {type(batch).__name__}"
        )
    columns = {}
    for name, values in batch.items():
        array = np.asarray(values)
        columns[name] = (
            list(array) if array.ndim > 1 else array
        )  # one array per row, as from_numpy keeps them
    return pd.DataFrame(columns)


def _format(frame: pd.DataFrame, batch_format: str) -> Any:
    return _to_numpy(frame) if batch_format == "numpy" else frame.reset_index(drop=True)
