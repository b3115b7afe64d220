"""``Dataset`` (Ray's ``ray.data.Dataset``): a lazy table whose blocks are a Dask DataFrame's partitions, its
transformations, splits, reads, aggregates and writers; and ``Schema``, its columns and their types."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd

from ddp_runtime.data._batch import (
    _DEFAULT_BATCH_SIZE,
    BatchFormat,
    _check_batch_format,
    _check_batch_size,
    _format,
)
from ddp_runtime.data._iterate import DataIterator, _frames
from ddp_runtime.data._mappers import (
    _KEY,
    _add_key,
    _BatchMapper,
    _ColumnAdder,
    _drop_key,
    _probe_meta,
    _RowFilter,
    _RowMapper,
)
from ddp_runtime.data._paths import _absolute
from ddp_runtime.data._pieces import _compute_lengths, _piece, _row_ranges, _slice_rows
from ddp_runtime.data._refused import _NOT_BUILT_METHODS, _check_options


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
