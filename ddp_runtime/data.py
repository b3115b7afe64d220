"""``ddp_runtime.data``: a subset of Ray Data (``ray.data``) on Dask DataFrames.

    import ddp_runtime.data                                  # was: import ray.data
    ds = ddp_runtime.data.read_csv("s3://bucket/houses.csv", storage_options={...})
    ds = ds.map_batches(normalise, batch_format="pandas")
    train_ds, val_ds = ds.train_test_split(test_size=0.2)
    trainer = TorchTrainer(loop, datasets={"train": train_ds, "validation": val_ds}, ...)
    # in the training function:
    for batch in ddp_runtime.get_dataset_shard("train").iter_torch_batches(batch_size=64):
        ...

A ``Dataset`` is lazy: a ``dask.dataframe`` collection whose partitions are the blocks (Ray's). Nothing is read
until a method needs rows (``count``, ``take``, ``to_pandas``, iterating); then it is computed partition by
partition on the current Dask client (or Dask's local scheduler without one). Inside a ``TorchTrainer`` rank,
``get_dataset_shard(name)`` streams that rank's partitions from the Dask workers through the worker's client,
one partition ahead of the training loop, so no process holds more than a couple of partitions.

Rows are dicts of column -> value; a ``"numpy"`` batch is a dict of column -> ``numpy.ndarray`` (a column of
arrays is stacked into one array), a ``"pandas"`` batch a ``pandas.DataFrame``. Ray Data names that are not
built here raise ``NotBuiltError`` (module names) or ``NotImplementedError`` (``Dataset`` methods), saying what
to use instead.
"""

from __future__ import annotations

import builtins
import collections
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd

from ddp_runtime.config import DataConfig

if TYPE_CHECKING:  # torch is imported where batches become tensors (ranks), not by drivers
    import torch

__all__ = [
    "DataConfig",
    "DataIterator",
    "Dataset",
    "NotBuiltError",
    "Schema",
    "from_dask",
    "from_items",
    "from_numpy",
    "from_pandas",
    "range",
    "read_csv",
    "read_json",
    "read_parquet",
]

BatchFormat = Literal["pandas", "numpy"]
_BATCH_FORMATS = ("pandas", "numpy")
_DEFAULT_BATCH_SIZE = 256  # Ray's default for iter_batches / iter_torch_batches
_KEY = "__ddp_runtime_shuffle_key"  # the random key column random_shuffle sorts by (dropped after)


class NotBuiltError(ImportError):
    """A Ray Data name ``ddp_runtime.data`` does not have; the message says what to use instead."""


# ------------------------------------------------------------------------------------------------- helpers


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


def _slice_rows(frame: pd.DataFrame, start: int, stop: int) -> pd.DataFrame:
    return frame.iloc[start:stop]


def _row_ranges(lengths: Sequence[int], start: int, stop: int) -> list[tuple[int, int, int]]:
    """The pieces ``(partition, first row, end row)`` holding global rows ``[start, stop)``."""
    pieces = []
    offset = 0
    for index, length in enumerate(lengths):
        lo, hi = max(start, offset), min(stop, offset + length)
        if lo < hi:
            pieces.append((index, lo - offset, hi - offset))
        offset += length
    return pieces


def _piece(
    ddf: dd.DataFrame, piece: tuple[int, int, int | None], lengths: Sequence[int] | None
) -> dd.DataFrame:
    index, start, stop = piece
    part = ddf.partitions[index]
    if stop is None or (lengths is not None and start == 0 and stop == lengths[index]):
        return part  # the whole partition
    return part.map_partitions(_slice_rows, start, stop, meta=ddf._meta)


def _rebatch(
    frames: Iterable[pd.DataFrame], batch_size: int | None, drop_last: bool
) -> Iterator[pd.DataFrame]:
    """Batches of exactly ``batch_size`` rows across partition boundaries (the last may be shorter, unless
    ``drop_last``); ``batch_size=None``: one batch per non-empty partition."""
    if batch_size is None:
        for frame in frames:
            if len(frame):
                yield frame
        return
    held: list[pd.DataFrame] = []
    count = 0
    for frame in frames:
        while len(frame):
            take = min(batch_size - count, len(frame))
            held.append(frame.iloc[:take])
            count += take
            frame = frame.iloc[take:]
            if count == batch_size:
                yield pd.concat(held) if len(held) > 1 else held[0]
                held, count = [], 0
    if count and not drop_last:
        yield pd.concat(held) if len(held) > 1 else held[0]


# ------------------------------------------------------------------------------- computing on the cluster

_local = threading.local()


def _task_key() -> Any:
    """The key of the Dask task this thread runs, or None outside a worker's task thread."""
    from distributed import get_worker

    try:
        return get_worker().get_current_task()
    except (ValueError, KeyError):  # not in a worker / a worker thread that runs no task
        return None


def _worker_client() -> Any:
    """Inside a Dask task (a rank): the worker's client, the task seceded from its worker's thread pool first.

    A rank holds its worker's only thread for the whole group, so partitions it asks for could otherwise never
    be computed on its own worker, nor on its peers' (held alike): seceding gives the worker a thread for them.
    The rank never rejoins (a rank that rejoined would queue partition tasks of its peers behind its own
    collectives). The group's gang reservation, not the thread count, keeps other ranks off the worker.
    Outside a task: None (compute with Dask's default scheduler).
    """
    key = _task_key()
    if key is None:
        return None
    from distributed import get_client, secede

    if getattr(_local, "seceded", None) != key:
        secede()
        _local.seceded = key
    return get_client()


def _frames(
    ddf: dd.DataFrame, pieces: Sequence[tuple[int, int, int | None]], lengths: Sequence[int] | None
) -> Iterator[pd.DataFrame]:
    """The pieces' rows, computed one at a time with the next one already under way (on the worker's client
    inside a rank, else with Dask's default scheduler)."""
    client = _worker_client()
    if client is None:
        for piece in pieces:
            yield _piece(ddf, piece, lengths).compute()
        return
    pending: collections.deque[Any] = collections.deque()
    todo = iter(pieces)

    def submit() -> None:
        piece = next(todo, None)
        if piece is not None:
            pending.append(client.compute(_piece(ddf, piece, lengths)))

    submit()
    try:
        while pending:
            future = pending.popleft()
            submit()  # the next partition is computed while this one is consumed
            frame = future.result()
            future.release()
            yield frame
    finally:
        for future in pending:
            future.cancel()


def _compute_lengths(ddf: dd.DataFrame, client: Any = None) -> list[int]:
    lengths = ddf.map_partitions(len, meta=(None, "int64"))
    if client is not None:
        series = client.compute(lengths).result()
    else:
        series = lengths.compute()
    return [int(n) for n in series]


# ---------------------------------------------------------------------------------------------- the Dataset


_NOT_BUILT_METHODS: dict[str, str] = {
    "groupby": "use to_pandas().groupby(...) on a small dataset, or map_batches for per-batch aggregates",
    "sort": "sort inside map_batches (per partition), or to_pandas().sort_values(...) on a small dataset",
    "zip": "join the columns in one map_batches over a dataset that holds both",
    "streaming_split": "use TorchTrainer(datasets=...) and ddp_runtime.get_dataset_shard(name) in each rank",
    "materialize": "iterate the dataset (it is recomputed from its source each time) or call to_pandas() on a "
    "small one",
    "write_images": "use write_parquet or write_csv",
    "write_numpy": "use write_parquet",
    "write_tfrecords": "use write_parquet",
    "write_webdataset": "use write_parquet",
    "write_mongo": "use write_parquet",
    "write_datasource": "use write_parquet or write_csv",
    "iter_tf_batches": "use iter_torch_batches or iter_batches(batch_format='numpy')",
    "to_tf": "use iter_torch_batches or iter_batches(batch_format='numpy')",
    "to_torch": "use iter_torch_batches",
    "to_arrow_refs": "use to_dask() (its partitions) or to_pandas()",
    "to_pandas_refs": "use to_dask() (its partitions) or to_pandas()",
    "to_numpy_refs": "use to_dask() (its partitions) or iter_batches(batch_format='numpy')",
    "to_spark": "use to_dask() or write_parquet",
    "to_modin": "use to_dask() or to_pandas()",
    "to_mars": "use to_dask() or to_pandas()",
    "flat_map": "use map_batches, returning more rows than it was given",
    "unique": "use to_pandas()[column].unique() on a small dataset",
    "aggregate": "use sum, min, max, mean or std (one column each)",
    "split_at_indices": "use split(n, equal=...) or train_test_split",
    "split_proportionately": "use train_test_split or split(n)",
    "random_sample": "use filter(lambda row: random.random() < fraction)",
    "stats": "the Dask dashboard shows every partition task",
}


class Schema:
    """A dataset's columns and their types (Ray's ``ray.data.Schema``): ``names`` and ``types`` (numpy/pandas
    dtypes), in column order."""

    def __init__(self, names: list[str], types: list[Any]) -> None:
        self.names = names
        self.types = types

    def __repr__(self) -> str:
        width = max([len("Column"), *(len(n) for n in self.names)])
        lines = [f"{'Column':<{width}}  Type", f"{'------':<{width}}  ----"]
        lines += [f"{name:<{width}}  {dtype}" for name, dtype in zip(self.names, self.types, strict=True)]
        return "\n".join(lines)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and (self.names, self.types) == (other.names, other.types)

    __hash__ = None  # type: ignore[assignment]


class Dataset:
    """A lazy table of rows whose blocks are the partitions of a ``dask.dataframe`` (Ray: ``ray.data.Dataset``).

    Build one with a reader (``read_csv``, ``read_parquet``, ``read_json``) or ``from_pandas``, ``from_numpy``,
    ``from_items``, ``range``, ``from_dask``; transformations (``map_batches``, ``map``, ``filter``,
    ``random_shuffle``, ...) return new lazy datasets; ``count``, ``take``, ``to_pandas`` and the iterators
    compute rows, partition by partition.

    Args:
        ddf: The Dask DataFrame holding the rows (one partition per block).
        lengths: Its partitions' row counts, when known (saves computing them).
    """

    def __init__(self, ddf: dd.DataFrame, lengths: Sequence[int] | None = None) -> None:
        if not isinstance(ddf, dd.DataFrame):
            raise TypeError(f"Dataset wraps a dask.dataframe.DataFrame, got {type(ddf).__name__}")
        self._ddf = ddf
        self._lengths = list(lengths) if lengths is not None else None

    def __repr__(self) -> str:
        rows = sum(self._lengths) if self._lengths is not None else "?"
        return (
            f"Dataset(num_blocks={self._ddf.npartitions}, num_rows={rows}, columns={list(self._ddf.columns)})"
        )

    def __getattr__(self, name: str) -> Any:
        if name in _NOT_BUILT_METHODS:
            raise NotImplementedError(
                f"Dataset.{name} (Ray Data) is not built here: {_NOT_BUILT_METHODS[name]}"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------------------------------- internals

    def _partition_lengths(self, client: Any = None) -> list[int]:
        if self._lengths is None:
            self._lengths = _compute_lengths(self._ddf, client)
        return self._lengths

    def _rows(self, start: int, stop: int) -> Dataset:
        """Global rows ``[start, stop)`` as a new dataset (partition lengths known)."""
        lengths = self._partition_lengths()
        pieces = _row_ranges(lengths, start, stop)
        if not pieces:
            return Dataset(
                self._ddf.partitions[0].map_partitions(_slice_rows, 0, 0, meta=self._ddf._meta), [0]
            )
        parts = [_piece(self._ddf, piece, lengths) for piece in pieces]
        ddf = parts[0] if len(parts) == 1 else dd.concat(parts)
        return Dataset(ddf, [stop_ - start_ for _, start_, stop_ in pieces])

    def _map_frames(self, fn: Callable[[pd.DataFrame], pd.DataFrame], meta: Any = None) -> Dataset:
        if meta is None:
            meta = _probe_meta(fn, self._ddf._meta)
        return Dataset(self._ddf.map_partitions(fn, meta=meta, enforce_metadata=False))

    # ---------------------------------------------------------------------------------------- transforms

    def map_batches(
        self,
        fn: Callable[..., Any],
        *,
        batch_format: BatchFormat = "pandas",
        batch_size: int | None = None,
        fn_args: Iterable[Any] | None = None,
        fn_kwargs: dict[str, Any] | None = None,
        **ray_options: Any,
    ) -> Dataset:
        """Apply ``fn`` to batches of rows (Ray's ``Dataset.map_batches``), lazily.

        ``fn(batch, *fn_args, **fn_kwargs)`` gets a ``pandas.DataFrame`` (``batch_format="pandas"``) or a dict
        of column -> ndarray (``"numpy"``) and returns the same kind (with any rows and columns). ``batch_size``:
        rows per call within a partition (None, the default: the whole partition at once). Ray's hints
        ``num_cpus``, ``concurrency`` and ``memory`` change nothing here (Dask places the partition tasks);
        ``compute``/``num_gpus`` and callable classes (actor pools) are refused: pass a function.
        """
        if not callable(fn) or isinstance(fn, type):
            raise TypeError(
                "map_batches takes a function of a batch; callable classes (Ray's actor pools) are not built: "
                f"build the state once at module level and pass a function, got {fn!r}"
            )
        _check_batch_format(batch_format)
        _check_batch_size(batch_size, allow_none=True)
        _check_options("map_batches", ray_options)
        args, kwargs = tuple(fn_args or ()), dict(fn_kwargs or {})
        return self._map_frames(_BatchMapper(fn, batch_format, batch_size, args, kwargs))

    def map(self, fn: Callable[[dict[str, Any]], dict[str, Any]], **ray_options: Any) -> Dataset:
        """Apply ``fn`` to each row (a dict of column -> value; it returns a dict), lazily (Ray's ``Dataset.map``).

        Slower than ``map_batches``: prefer that for vectorised work."""
        if not callable(fn):
            raise TypeError(f"map takes a function of a row (a dict), got {fn!r}")
        _check_options("map", ray_options)
        return self._map_frames(_RowMapper(fn))

    def filter(self, fn: Callable[[dict[str, Any]], bool], **ray_options: Any) -> Dataset:
        """Keep the rows for which ``fn(row)`` is true, lazily (Ray's ``Dataset.filter``)."""
        if not callable(fn):
            raise TypeError(f"filter takes a function of a row (a dict) returning a bool, got {fn!r}")
        _check_options("filter", ray_options)
        return Dataset(self._ddf.map_partitions(_RowFilter(fn), meta=self._ddf._meta, enforce_metadata=False))

    def random_shuffle(self, *, seed: int | None = None, num_blocks: int | None = None) -> Dataset:
        """Shuffle all rows across partitions (Ray's ``Dataset.random_shuffle``), lazily, as a Dask shuffle.

        The order is fixed when this is called (``seed=None`` draws a seed now), so every pass over the
        result (each epoch, each rank's shard) sees the same order; call it again for another order.

        Its cost: every output partition is made from all the input partitions, and a partition is computed
        when it is read (nothing is kept), so each partition a pass reads reads the whole input again. Fine for
        data of a few partitions; for large data shuffle the files once beforehand, or use
        ``randomize_block_order`` (partition order only, no cost).
        """
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        if num_blocks is not None:
            _check_batch_size(num_blocks, allow_none=False)
        n = num_blocks or self._ddf.npartitions
        keyed = self._ddf.map_partitions(_add_key, seed, meta=self._ddf._meta.assign(**{_KEY: np.int64(0)}))
        shuffled = keyed.shuffle(on=_KEY, npartitions=n, shuffle_method="tasks")
        return Dataset(shuffled.map_partitions(_drop_key, seed, meta=self._ddf._meta))

    def randomize_block_order(self, *, seed: int | None = None) -> Dataset:
        """The same partitions in a random order (Ray's ``Dataset.randomize_block_order``): cheap, no shuffle."""
        rng = np.random.default_rng(seed)
        order = [int(i) for i in rng.permutation(self._ddf.npartitions)]
        ddf = dd.concat([self._ddf.partitions[i] for i in order])
        lengths = [self._lengths[i] for i in order] if self._lengths is not None else None
        return Dataset(ddf, lengths)

    def repartition(self, num_blocks: int, *, shuffle: bool = False) -> Dataset:
        """The same rows in ``num_blocks`` partitions (Ray's ``Dataset.repartition``; ``shuffle=True`` shuffles
        them too)."""
        _check_batch_size(num_blocks, allow_none=False)
        ds = self.random_shuffle(num_blocks=num_blocks) if shuffle else self
        return Dataset(ds._ddf.repartition(npartitions=num_blocks))

    def select_columns(self, cols: str | list[str]) -> Dataset:
        """Only these columns (Ray's ``Dataset.select_columns``)."""
        cols = [cols] if isinstance(cols, str) else list(cols)
        missing = [c for c in cols if c not in self._ddf.columns]
        if missing:
            raise ValueError(
                f"select_columns: no column(s) {missing}; the dataset has {list(self._ddf.columns)}"
            )
        return Dataset(self._ddf[cols], self._lengths)

    def drop_columns(self, cols: str | list[str]) -> Dataset:
        """Without these columns (Ray's ``Dataset.drop_columns``)."""
        cols = [cols] if isinstance(cols, str) else list(cols)
        missing = [c for c in cols if c not in self._ddf.columns]
        if missing:
            raise ValueError(
                f"drop_columns: no column(s) {missing}; the dataset has {list(self._ddf.columns)}"
            )
        return Dataset(self._ddf.drop(columns=cols), self._lengths)

    def add_column(
        self, col: str, fn: Callable[[pd.DataFrame], Any], *, batch_format: BatchFormat = "pandas"
    ) -> Dataset:
        """A new column ``col`` = ``fn(batch)`` computed per partition (Ray's ``Dataset.add_column``)."""
        _check_batch_format(batch_format)
        return self._map_frames(_ColumnAdder(col, fn, batch_format))

    def union(self, *others: Dataset) -> Dataset:
        """This dataset's rows, then each other's (Ray's ``Dataset.union``)."""
        for other in others:
            if not isinstance(other, Dataset):
                raise TypeError(f"union takes Datasets, got {type(other).__name__}")
        datasets = [self, *others]
        lengths = None
        if all(d._lengths is not None for d in datasets):
            lengths = [n for d in datasets for n in d._lengths]  # type: ignore[union-attr]
        return Dataset(dd.concat([d._ddf for d in datasets]), lengths)

    def limit(self, limit: int) -> Dataset:
        """The first ``limit`` rows (Ray's ``Dataset.limit``); computes the partition row counts."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be an int >= 0, got {limit!r}")
        return self._rows(0, min(limit, self.count()))

    # ---------------------------------------------------------------------------------------------- splits

    def split(self, n: int, *, equal: bool = False) -> list[Dataset]:
        """``n`` disjoint datasets in row order (Ray's ``Dataset.split``); computes the row count.

        Sizes differ by at most one row; ``equal=True`` makes them equal by dropping the last ``count() % n``
        rows."""
        _check_batch_size(n, allow_none=False)
        total = self.count()
        if equal:
            per = total // n
            bounds = [i * per for i in builtins.range(n + 1)]
        else:
            bounds = [i * total // n for i in builtins.range(n + 1)]
        return [self._rows(bounds[i], bounds[i + 1]) for i in builtins.range(n)]

    def train_test_split(
        self, test_size: float | int, *, shuffle: bool = False, seed: int | None = None
    ) -> tuple[Dataset, Dataset]:
        """``(train, test)``: the last ``test_size`` of the rows as the test set (Ray's
        ``Dataset.train_test_split``); ``test_size`` is a fraction in (0, 1) or a number of rows. With
        ``shuffle=True`` the rows are shuffled first (``random_shuffle(seed=seed)``). Computes the row count."""
        ds = self.random_shuffle(seed=seed) if shuffle else self
        total = ds.count()
        if isinstance(test_size, float):
            if not 0 < test_size < 1:
                raise ValueError(f"test_size as a fraction must be in (0, 1), got {test_size!r}")
            n_test = int(np.ceil(total * test_size))
        elif isinstance(test_size, int) and not isinstance(test_size, bool):
            if not 0 < test_size < total:
                raise ValueError(
                    f"test_size as a number of rows must be in 1..{total - 1}, got {test_size!r}"
                )
            n_test = test_size
        else:
            raise TypeError(
                f"test_size must be a float in (0, 1) or an int number of rows, got {test_size!r}"
            )
        cut = total - n_test
        return ds._rows(0, cut), ds._rows(cut, total)

    # --------------------------------------------------------------------------------------------- reading

    def count(self) -> int:
        """The number of rows (Ray's ``Dataset.count``); computed once, partition by partition."""
        return int(sum(self._partition_lengths()))

    def num_blocks(self) -> int:
        """The number of partitions (Ray's blocks)."""
        return int(self._ddf.npartitions)

    def schema(self) -> Schema:
        """The columns and their types (Ray's ``Dataset.schema``), read from the first rows, so a
        ``map_batches`` result's types are exact."""
        head = self._head(1)
        dtypes = head.dtypes if len(head.columns) else self._ddf._meta.dtypes
        return Schema([str(c) for c in dtypes.index], list(dtypes))

    def columns(self) -> list[str]:
        """The column names (Ray's ``Dataset.columns``)."""
        return self.schema().names

    def take(self, limit: int = 20) -> list[dict[str, Any]]:
        """The first ``limit`` rows, as dicts (Ray's ``Dataset.take``); reads only the partitions it needs."""
        return self._head(limit).to_dict("records")

    def take_all(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Every row, as dicts (Ray's ``Dataset.take_all``): for small datasets; ``limit`` raises past it."""
        frame = self.to_pandas(limit=limit)
        return frame.to_dict("records")

    def take_batch(self, batch_size: int = 20, *, batch_format: BatchFormat = "numpy") -> Any:
        """The first ``batch_size`` rows as one batch (Ray's ``Dataset.take_batch``; numpy by default)."""
        _check_batch_size(batch_size, allow_none=False)
        _check_batch_format(batch_format)
        return _format(self._head(batch_size), batch_format)

    def show(self, limit: int = 20) -> None:
        """Print the first ``limit`` rows (Ray's ``Dataset.show``)."""
        for row in self.take(limit):
            print(row)

    def _head(self, n: int) -> pd.DataFrame:
        frames, have = [], 0
        for frame in _frames(self._ddf, [(i, 0, None) for i in builtins.range(self._ddf.npartitions)], None):
            frames.append(frame.iloc[: n - have])
            have += len(frames[-1])
            if have >= n:
                break
        if not frames:
            return self._ddf._meta
        return pd.concat(frames).reset_index(drop=True)

    def to_pandas(self, limit: int | None = None) -> pd.DataFrame:
        """Every row in one ``pandas.DataFrame`` in this process (Ray's ``Dataset.to_pandas``): for datasets that
        fit in memory. ``limit``: raise ``ValueError`` when there are more rows than that."""
        if limit is not None and self.count() > limit:
            raise ValueError(
                f"the dataset has {self.count()} rows, more than to_pandas(limit={limit}); iterate it with "
                "iter_batches instead"
            )
        return self._ddf.compute().reset_index(drop=True)

    def to_dask(self) -> dd.DataFrame:
        """The underlying ``dask.dataframe.DataFrame`` (Ray's ``Dataset.to_dask``)."""
        return self._ddf

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """Every row, as a dict, partition by partition (Ray's ``Dataset.iter_rows``)."""
        return self.iterator().iter_rows()

    def iter_batches(
        self,
        *,
        batch_size: int | None = _DEFAULT_BATCH_SIZE,
        batch_format: BatchFormat = "numpy",
        drop_last: bool = False,
        **ray_options: Any,
    ) -> Iterator[Any]:
        """Batches of ``batch_size`` rows (across partition boundaries; None: one per partition), computed a
        partition at a time (Ray's ``Dataset.iter_batches``; numpy batches by default, as Ray's)."""
        return self.iterator().iter_batches(
            batch_size=batch_size, batch_format=batch_format, drop_last=drop_last, **ray_options
        )

    def iter_torch_batches(
        self,
        *,
        batch_size: int | None = _DEFAULT_BATCH_SIZE,
        dtypes: Any = None,
        device: Any = "auto",
        collate_fn: Callable[[dict[str, np.ndarray]], Any] | None = None,
        drop_last: bool = False,
        **ray_options: Any,
    ) -> Iterator[Any]:
        """Batches as dicts of column -> ``torch.Tensor`` (Ray's ``Dataset.iter_torch_batches``): see
        ``DataIterator.iter_torch_batches``."""
        return self.iterator().iter_torch_batches(
            batch_size=batch_size,
            dtypes=dtypes,
            device=device,
            collate_fn=collate_fn,
            drop_last=drop_last,
            **ray_options,
        )

    def iterator(self) -> DataIterator:
        """A ``DataIterator`` over every row (Ray's ``Dataset.iterator``)."""
        return DataIterator(self, None, name="dataset")

    # ---------------------------------------------------------------------------------------- aggregates

    def _column(self, on: str) -> Any:
        if on not in self._ddf.columns:
            raise ValueError(f"no column {on!r}; the dataset has {list(self._ddf.columns)}")
        return self._ddf[on]

    def sum(self, on: str) -> Any:
        """The sum of column ``on`` (Ray's ``Dataset.sum``, one column)."""
        return self._column(on).sum().compute()

    def min(self, on: str) -> Any:
        """The minimum of column ``on`` (Ray's ``Dataset.min``, one column)."""
        return self._column(on).min().compute()

    def max(self, on: str) -> Any:
        """The maximum of column ``on`` (Ray's ``Dataset.max``, one column)."""
        return self._column(on).max().compute()

    def mean(self, on: str) -> Any:
        """The mean of column ``on`` (Ray's ``Dataset.mean``, one column)."""
        return self._column(on).mean().compute()

    def std(self, on: str, ddof: int = 1) -> Any:
        """The standard deviation of column ``on`` (Ray's ``Dataset.std``, one column)."""
        return self._column(on).std(ddof=ddof).compute()

    # --------------------------------------------------------------------------------------------- writing

    def write_parquet(self, path: str, *, storage_options: dict[str, Any] | None = None) -> None:
        """Write one Parquet file per partition under directory ``path`` (local, s3://...; Ray's
        ``Dataset.write_parquet``)."""
        self._ddf.to_parquet(_absolute(path), storage_options=storage_options, write_index=False)

    def write_csv(self, path: str, *, storage_options: dict[str, Any] | None = None) -> None:
        """Write one CSV file per partition under directory ``path`` (Ray's ``Dataset.write_csv``)."""
        target = _absolute(path)
        self._ddf.to_csv(f"{target}/*.csv", storage_options=storage_options, index=False)

    def write_json(self, path: str, *, storage_options: dict[str, Any] | None = None) -> None:
        """Write one JSON-lines file per partition under directory ``path`` (Ray's ``Dataset.write_json``)."""
        target = _absolute(path)
        self._ddf.to_json(f"{target}/*.json", storage_options=storage_options, orient="records", lines=True)


#: Ray's hints that change no result here (Dask places the tasks; one partition is always prefetched): accepted.
_HINTS = frozenset(
    {"concurrency", "num_cpus", "memory", "zero_copy_batch", "prefetch_batches", "prefetch_blocks"}
)


def _check_options(where: str, options: dict[str, Any]) -> None:
    """Ray options this subset cannot honour are refused by name, never silently ignored."""
    for name in options:
        if name in _HINTS:
            continue
        if name in ("local_shuffle_buffer_size", "local_shuffle_seed"):
            raise ValueError(
                f"{where}({name}=...): local shuffling is not built; call random_shuffle() on the dataset before "
                "giving it to the trainer"
            )
        if name in ("compute", "num_gpus", "fn_constructor_args", "fn_constructor_kwargs", "ray_remote_args"):
            raise ValueError(
                f"{where}({name}=...): Ray's actor pools and task resources are not built; partitions run as Dask "
                "tasks on any worker: pass a function and drop it"
            )
        raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")


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


# ---------------------------------------------------------------------------------------------- iterators


class DataIterator:
    """Iterates a dataset, or a rank's shard of one (Ray: ``ray.data.DataIterator``, what
    ``ddp_runtime.get_dataset_shard`` returns). Each call of an ``iter_*`` method is a new pass (an epoch),
    computed partition by partition.

    Args:
        dataset: The dataset.
        pieces: The shard's ``(partition, first row, end row)`` pieces, in order; None: every row.
        name: The dataset's name (``TorchTrainer(datasets=...)`` key), for messages.
    """

    def __init__(self, dataset: Dataset, pieces: Sequence[tuple[int, int, int]] | None, *, name: str) -> None:
        self._dataset = dataset
        self._pieces = list(pieces) if pieces is not None else None
        self._name = name

    def __repr__(self) -> str:
        return (
            f"DataIterator({self._name!r}, pieces={len(self._pieces) if self._pieces is not None else 'all'})"
        )

    def __getattr__(self, name: str) -> Any:
        if name in _NOT_BUILT_METHODS or name in ("to_tf", "iter_tf_batches"):
            advice = _NOT_BUILT_METHODS.get(name, "use iter_torch_batches")
            raise NotImplementedError(f"DataIterator.{name} (Ray Data) is not built here: {advice}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _frames(self) -> Iterator[pd.DataFrame]:
        ds = self._dataset
        if self._pieces is None:
            pieces = [(i, 0, None) for i in builtins.range(ds._ddf.npartitions)]
            return _frames(ds._ddf, pieces, None)
        return _frames(ds._ddf, self._pieces, ds._lengths)

    def count(self) -> int:
        """The number of rows this iterator yields per pass (no computation for a shard)."""
        if self._pieces is None:
            return self._dataset.count()
        return sum(stop - start for _, start, stop in self._pieces)

    def iter_batches(
        self,
        *,
        batch_size: int | None = _DEFAULT_BATCH_SIZE,
        batch_format: BatchFormat = "numpy",
        drop_last: bool = False,
        **ray_options: Any,
    ) -> Iterator[Any]:
        """One pass in batches of ``batch_size`` rows (formed across partition boundaries, so only the last is
        shorter; None: one batch per partition), each a dict of column -> ndarray (``"numpy"``, the default) or
        a ``pandas.DataFrame``. ``prefetch_batches`` is accepted (one partition is always computed ahead);
        ``local_shuffle_buffer_size`` is refused (``random_shuffle`` the dataset instead)."""
        _check_options("iter_batches", ray_options)
        _check_batch_size(batch_size, allow_none=True)
        _check_batch_format(batch_format)
        return (_format(frame, batch_format) for frame in _rebatch(self._frames(), batch_size, drop_last))

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """One pass, row by row, each a dict of column -> value."""
        for frame in self._frames():
            yield from frame.to_dict("records")

    def iter_torch_batches(
        self,
        *,
        batch_size: int | None = _DEFAULT_BATCH_SIZE,
        dtypes: Any = None,
        device: Any = "auto",
        collate_fn: Callable[[dict[str, np.ndarray]], Any] | None = None,
        drop_last: bool = False,
        **ray_options: Any,
    ) -> Iterator[Any]:
        """One pass in batches of dicts of column -> ``torch.Tensor`` (Ray's ``iter_torch_batches``).

        ``dtypes``: one ``torch.dtype`` for every column, or a dict column -> dtype. ``device``: where the
        tensors go ("auto": the rank's device inside a training function, else the CPU). ``collate_fn``: called
        with each numpy batch instead; what it returns is yielded as is (move it to a device yourself). Batches
        form across partition boundaries: on a shard of ``get_dataset_shard`` every rank gets the same number.
        """
        import torch

        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be a function of a numpy batch (a dict), got {collate_fn!r}")
        target = _device(device)
        batches = self.iter_batches(
            batch_size=batch_size, batch_format="numpy", drop_last=drop_last, **ray_options
        )
        if collate_fn is not None:
            return (collate_fn(batch) for batch in batches)
        return (
            {name: _tensor(values, _dtype(dtypes, name), target, torch) for name, values in batch.items()}
            for batch in batches
        )

    def materialize(self) -> Dataset:
        """Ray's ``DataIterator.materialize`` is refused for a shard: iterate it (each call is one epoch)."""
        raise NotImplementedError(
            "DataIterator.materialize (Ray Data) is not built here: iterate the shard with iter_torch_batches or "
            "iter_batches, once per epoch"
        )


def _device(device: Any) -> Any:
    import torch

    if device == "auto" or device is None:
        from ddp_runtime.session import _local as session_local

        session = getattr(session_local, "session", None)
        return session.context.device if session is not None else torch.device("cpu")
    return torch.device(device)


def _dtype(dtypes: Any, name: str) -> Any:
    if isinstance(dtypes, dict):
        return dtypes.get(name)
    return dtypes


def _tensor(values: np.ndarray, dtype: Any, device: Any, torch: Any) -> torch.Tensor:
    if values.dtype == object:
        raise TypeError(
            "iter_torch_batches cannot make a tensor of a column of Python objects (strings?): drop it with "
            "drop_columns, encode it in map_batches, or pass collate_fn="
        )
    if not values.flags.writeable:  # pandas hands out read-only views; torch wants to own writable memory
        values = values.copy()
    tensor = torch.as_tensor(values)
    if dtype is not None:
        tensor = tensor.to(dtype)
    return tensor.to(device) if tensor.device != device else tensor


# ------------------------------------------------------------------------------------------------- readers


def _reader_paths(paths: Any) -> str | list[str]:
    if isinstance(paths, str | os.PathLike):
        return _absolute(paths)
    if isinstance(paths, list | tuple) and paths:
        return _absolute(list(paths))
    raise TypeError(f"paths must be a path or a non-empty list of paths, got {paths!r}")


def read_csv(
    paths: str | list[str],
    *,
    storage_options: dict[str, Any] | None = None,
    blocksize: int | str | None = "default",
    **read_csv_args: Any,
) -> Dataset:
    """CSV files as a lazy ``Dataset`` (Ray's ``ray.data.read_csv``): a path, a glob or a list of them, local,
    ``s3://`` or ``http(s)://`` (any fsspec URL); ``storage_options`` go to fsspec (s3fs: ``key``, ``secret``,
    ``client_kwargs={"endpoint_url": ...}``). Files are split into partitions of ``blocksize`` bytes; the
    other arguments go to ``pandas.read_csv``."""
    return Dataset(
        dd.read_csv(
            _reader_paths(paths), storage_options=storage_options, blocksize=blocksize, **read_csv_args
        )
    )


def read_parquet(
    paths: str | list[str],
    *,
    columns: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    **read_parquet_args: Any,
) -> Dataset:
    """Parquet files (or directories of them) as a lazy ``Dataset`` (Ray's ``ray.data.read_parquet``); paths and
    ``storage_options`` as ``read_csv``; ``columns`` reads only those."""
    return Dataset(
        dd.read_parquet(
            _reader_paths(paths), columns=columns, storage_options=storage_options, **read_parquet_args
        )
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
    return Dataset(
        dd.read_json(
            _reader_paths(paths),
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


# ---------------------------------------------------------------------------------------------- not built

_READ = "is not built: read_parquet, read_csv and read_json are; for other files, "
#: Ray Data names that are not here -> what to use instead.
NOT_BUILT: dict[str, str] = {
    **{
        name: f"{_READ}list them with fsspec and build rows with from_items or map_batches"
        for name in (
            "read_images",
            "read_binary_files",
            "read_text",
            "read_numpy",
            "read_tfrecords",
            "read_webdataset",
            "read_avro",
            "read_lance",
            "read_delta",
            "read_iceberg",
        )
    },
    "read_sql": "is not built: query with pandas.read_sql and pass the frame to from_pandas",
    "read_mongo": "is not built: query with pymongo and pass the rows to from_items",
    "read_bigquery": "is not built: export the table to Parquet and use read_parquet",
    "read_datasource": "custom datasources are not built: build a dask.dataframe and use from_dask",
    "from_arrow": "is not built: call table.to_pandas() and use from_pandas",
    "from_huggingface": "is not built: use dataset.to_pandas() with from_pandas, or its Parquet files with "
    "read_parquet",
    "from_torch": "is not built: keep a torch Dataset in a DataLoader with ddp_runtime.torch.prepare_data_loader",
    "from_spark": "is not built: write the Spark DataFrame to Parquet and use read_parquet",
    "from_modin": "is not built: use from_pandas or from_dask",
    "from_mars": "is not built: use from_pandas or from_dask",
    "from_tf": "is not built: use from_numpy or from_pandas",
    "from_pandas_refs": "is not built: use from_pandas, or from_dask for a distributed frame",
    "from_numpy_refs": "is not built: use from_numpy",
    "from_arrow_refs": "is not built: use from_dask",
    "ActorPoolStrategy": "is not built: map_batches runs functions as Dask tasks; pass a function, not a class "
    "with compute=",
    "DataContext": "is not built: Dask's own config (dask.config) applies",
    "Preprocessor": "is not built: do the preprocessing in map_batches",
    "preprocessors": "is not built: do the preprocessing in map_batches",
    "set_progress_bars": "is not built: the Dask dashboard shows every partition task",
}


def __getattr__(name: str) -> Any:
    if name in NOT_BUILT:
        raise NotBuiltError(f"ray.data.{name} {NOT_BUILT[name]}", name=name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
