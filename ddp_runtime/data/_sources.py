"""Where datasets come from (Ray's ``ray.data.read_*`` and ``from_*``): the readers of CSV, Parquet and JSON
files (local or any fsspec URL), and datasets of pandas frames, numpy arrays, Python objects, a range of
integers or a Dask DataFrame."""

from __future__ import annotations

import builtins
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd

from ddp_runtime.data._batch import _check_batch_size
from ddp_runtime.data._dataset import Dataset
from ddp_runtime.data._paths import _reader_source


def read_csv(
    paths: str | list[str],
    *,
    storage_options: dict[str, Any] | None = None,
    blocksize: int | str | None = "default",
    **read_csv_args: Any,
) -> Dataset:
    """CSV files as a lazy ``Dataset`` (Ray's ``ray.data.read_csv``): a path, a glob or a list of them, local,
    ``s3://`` (``s3://anonymous@bucket/...``: a public bucket, as Ray spells it) or ``http(s)://`` (any fsspec
    URL); ``storage_options`` go to fsspec (s3fs: ``key``, ``secret``,
    ``client_kwargs={"endpoint_url": ...}``). Files are split into partitions of ``blocksize`` bytes; the
    other arguments go to ``pandas.read_csv``."""
    paths, storage_options = _reader_source(paths, storage_options)
    return Dataset(dd.read_csv(paths, storage_options=storage_options, blocksize=blocksize, **read_csv_args))


def read_parquet(
    paths: str | list[str],
    *,
    columns: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    **read_parquet_args: Any,
) -> Dataset:
    """Parquet files (or directories of them) as a lazy ``Dataset`` (Ray's ``ray.data.read_parquet``); paths and
    ``storage_options`` as ``read_csv``; ``columns`` reads only those."""
    paths, storage_options = _reader_source(paths, storage_options)
    return Dataset(
        dd.read_parquet(paths, columns=columns, storage_options=storage_options, **read_parquet_args)
    )


def read_json(
    paths: str | list[str],
    *,
    lines: bool = True,
    storage_options: dict[str, Any] | None = None,
    blocksize: int | None = None,
    **read_json_args: Any,
) -> Dataset:
    """JSON files as a lazy ``Dataset`` (Ray's ``ray.data.read_json``): JSON lines (one object per line, as Ray
    reads) by default, or ``lines=False`` for files holding one array of objects. Paths and
    ``storage_options`` as ``read_csv``; ``blocksize`` (JSON lines only) splits files into partitions."""
    paths, storage_options = _reader_source(paths, storage_options)
    return Dataset(
        dd.read_json(
            paths,
            orient="records",
            lines=lines,
            storage_options=storage_options,
            blocksize=blocksize if lines else None,
            **read_json_args,
        )
    )


def _partitions(n_rows: int, override: int | None) -> int:
    if override is not None:
        _check_batch_size(override, allow_none=False)
        return override
    return max(1, min(n_rows // 1024 or 1, 200))


def from_pandas(dfs: pd.DataFrame | list[pd.DataFrame], *, override_num_blocks: int | None = None) -> Dataset:
    """A ``Dataset`` of a DataFrame, or of several, one block each (Ray's ``ray.data.from_pandas``)."""
    with dask.config.set({"dataframe.convert-string": False}):  # a column of arrays stays arrays
        return _from_pandas(dfs, override_num_blocks)


def _from_pandas(dfs: Any, override_num_blocks: int | None) -> Dataset:
    if isinstance(dfs, pd.DataFrame):
        n = _partitions(len(dfs), override_num_blocks)
        return Dataset(dd.from_pandas(dfs.reset_index(drop=True), npartitions=n, sort=False))
    if isinstance(dfs, list | tuple) and dfs and all(isinstance(d, pd.DataFrame) for d in dfs):
        parts = [dd.from_pandas(d.reset_index(drop=True), npartitions=1, sort=False) for d in dfs]
        return Dataset(dd.concat(parts) if len(parts) > 1 else parts[0], [len(d) for d in dfs])
    raise TypeError(f"from_pandas takes a pandas.DataFrame or a list of them, got {type(dfs).__name__}")


def from_numpy(ndarrays: np.ndarray | list[np.ndarray], *, override_num_blocks: int | None = None) -> Dataset:
    """A ``Dataset`` with one column ``"data"`` of an array's rows (Ray's ``ray.data.from_numpy``); a row of a
    2-D array is a scalar, of a higher-dimensional one an ndarray (stacked again in numpy batches)."""
    arrays = [ndarrays] if isinstance(ndarrays, np.ndarray) else list(ndarrays)
    if not arrays or not all(isinstance(a, np.ndarray) and a.ndim >= 1 for a in arrays):
        raise TypeError("from_numpy takes a numpy array (at least 1-D) or a list of them")
    frames = [pd.DataFrame({"data": list(a) if a.ndim > 1 else a}) for a in arrays]
    if len(frames) == 1:
        return from_pandas(frames[0], override_num_blocks=override_num_blocks)
    return from_pandas(frames)


def from_items(items: list[Any], *, override_num_blocks: int | None = None) -> Dataset:
    """A ``Dataset`` of Python objects (Ray's ``ray.data.from_items``): dicts are rows; any other item becomes
    the row ``{"item": item}``."""
    if not isinstance(items, list | tuple):
        raise TypeError(f"from_items takes a list, got {type(items).__name__}")
    rows = [item if isinstance(item, dict) else {"item": item} for item in items]
    return from_pandas(pd.DataFrame(rows), override_num_blocks=override_num_blocks)


def range(n: int, *, override_num_blocks: int | None = None) -> Dataset:  # noqa: A001 - Ray's name
    """A ``Dataset`` of the integers 0..n-1 in column ``"id"`` (Ray's ``ray.data.range``), made on the workers
    partition by partition (nothing of it is held by the caller)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"range takes an int >= 0, got {n!r}")
    blocks = _partitions(n, override_num_blocks)
    bounds = [i * n // blocks for i in builtins.range(blocks + 1)]
    meta = pd.DataFrame({"id": pd.Series([], dtype="int64")})
    ddf = dd.from_map(
        _range_block, list(zip(bounds[:-1], bounds[1:], strict=True)), meta=meta, enforce_metadata=False
    )
    return Dataset(ddf, [hi - lo for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)])


def _range_block(bounds: tuple[int, int]) -> pd.DataFrame:
    lo, hi = bounds
    return pd.DataFrame({"id": np.arange(lo, hi, dtype=np.int64)})


def from_dask(df: dd.DataFrame) -> Dataset:
    """A ``Dataset`` of a ``dask.dataframe.DataFrame``, its partitions as blocks (Ray's ``ray.data.from_dask``)."""
    return Dataset(df)
