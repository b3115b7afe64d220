"""The per-partition functions ``Dataset`` transformations give Dask (``map_batches``, ``map``, ``filter``,
``add_column``, ``random_shuffle``'s key), pickled by reference to the workers that run them, and the probe of a
function's output columns for Dask's metadata."""

from __future__ import annotations

import builtins
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from ddp_runtime.data._batch import _format, _from_numpy_batch

_KEY = "__ddp_runtime_shuffle_key"  # the random key column random_shuffle sorts by (dropped after)


def _probe_meta(fn: Callable[[pd.DataFrame], pd.DataFrame], meta: pd.DataFrame) -> pd.DataFrame:
    """The empty frame ``fn`` returns for an empty input, for Dask's metadata; when ``fn`` cannot take an empty
    batch, the input's (Dask then does not check the output: columns come from the first rows computed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = fn(meta.copy())
        except Exception:  # noqa: BLE001 - a user function may reject an empty batch; its rows decide then
            return meta
    return out.iloc[:0] if isinstance(out, pd.DataFrame) else meta


class _BatchMapper:
    """A map_batches function as a Dask partition function (picklable, with its arguments)."""

    def __init__(
        self, fn: Callable[..., Any], batch_format: str, batch_size: int | None, args: tuple, kwargs: dict
    ):
        self.fn, self.batch_format, self.batch_size, self.args, self.kwargs = (
            fn,
            batch_format,
            batch_size,
            args,
            kwargs,
        )

    def _one(self, frame: pd.DataFrame) -> pd.DataFrame:
        out = self.fn(_format(frame, self.batch_format), *self.args, **self.kwargs)
        if self.batch_format == "numpy":
            return _from_numpy_batch(out)
        if not isinstance(out, pd.DataFrame):
            raise TypeError(
                f"a map_batches function with batch_format='pandas' must return a pandas.DataFrame, "
                f"got {type(out).__name__}"
            )
        return out

    def __call__(self, frame: pd.DataFrame) -> pd.DataFrame:
        if self.batch_size is None or len(frame) <= self.batch_size:
            return self._one(frame).reset_index(drop=True)
        outs = [
            self._one(frame.iloc[i : i + self.batch_size])
            for i in builtins.range(0, len(frame), self.batch_size)
        ]
        return pd.concat(outs, ignore_index=True)


class _RowMapper:
    def __init__(self, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.fn = fn

    def __call__(self, frame: pd.DataFrame) -> pd.DataFrame:
        rows = [self.fn(row) for row in frame.to_dict("records")]
        for row in rows[:1]:
            if not isinstance(row, dict):
                raise TypeError(f"a map function must return a dict (the new row), got {type(row).__name__}")
        return pd.DataFrame(rows) if rows else frame.iloc[:0]


class _RowFilter:
    def __init__(self, fn: Callable[[dict[str, Any]], bool]) -> None:
        self.fn = fn

    def __call__(self, frame: pd.DataFrame) -> pd.DataFrame:
        keep = [bool(self.fn(row)) for row in frame.to_dict("records")]
        return frame[np.asarray(keep, dtype=bool)] if len(frame) else frame


class _ColumnAdder:
    def __init__(self, col: str, fn: Callable[[Any], Any], batch_format: str) -> None:
        self.col, self.fn, self.batch_format = col, fn, batch_format

    def __call__(self, frame: pd.DataFrame) -> pd.DataFrame:
        values = self.fn(_format(frame, self.batch_format))
        return frame.assign(
            **{self.col: np.asarray(values) if not isinstance(values, pd.Series) else values.to_numpy()}
        )


def _add_key(frame: pd.DataFrame, seed: int, partition_info: dict[str, Any] | None = None) -> pd.DataFrame:
    number = partition_info["number"] if partition_info else 0
    rng = np.random.default_rng([seed, number])
    return frame.assign(**{_KEY: rng.integers(0, 2**62, size=len(frame), dtype=np.int64)})


def _drop_key(frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    return frame.sort_values(_KEY, kind="stable").drop(columns=[_KEY]).reset_index(drop=True)
