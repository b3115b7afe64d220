"""Iterating rows: ``DataIterator`` (a dataset, or a rank's shard of one), batches of exactly ``batch_size``
rows across partition boundaries, numpy batches as torch tensors, and the partitions streamed through the
worker's client inside a rank (one computed ahead), with Dask's default scheduler elsewhere."""

from __future__ import annotations

import builtins
import collections
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

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
from ddp_runtime.data._pieces import _piece
from ddp_runtime.data._refused import _NOT_BUILT_METHODS, _check_options

if TYPE_CHECKING:  # torch is imported where batches become tensors (ranks), not by drivers
    import torch


class _Rows(Protocol):
    """What an iterator reads of its dataset (a ``Dataset``; typed here without importing it, which imports
    this module): its Dask dataframe, its partitions' row counts when known, and its row count."""

    _ddf: dd.DataFrame
    _lengths: Sequence[int] | None

    def count(self) -> int: ...


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
    from distributed import get_worker

    # Asked of the rank's own worker (loosely: another may take it). Reading tasks are "data producers", which the
    # scheduler treats as root-ish and holds in its queue until a worker has a free slot; with every worker's one
    # thread held by a seceded rank, both ranks of a 2-rank group once waited 600 s on partitions no worker was
    # ever sent (no task running anywhere; a race of the kind of dask/distributed#7223). A task with a worker
    # restriction is never queued, and is computed where its rows are consumed, with no transfer.
    here = [get_worker().address]
    pending: collections.deque[Any] = collections.deque()
    todo = iter(pieces)

    def submit() -> None:
        piece = next(todo, None)
        if piece is not None:
            pending.append(
                client.compute(_piece(ddf, piece, lengths), workers=here, allow_other_workers=True)
            )

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


# ---------------------------------------------------------------------------------------------- iterators


class Passes:
    """What ``iter_batches``/``iter_torch_batches`` return, as Ray's do: an iterable whose every ``iter()`` is a
    new pass over the data (an epoch), so a framework's loop can iterate it once per epoch. ``next()`` on it
    reads the pass under way (the first ``next()`` starts one), as on a generator."""

    def __init__(self, start: Callable[[], Iterator[Any]]) -> None:
        self._start = start
        self._current: Iterator[Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        return self._start()

    def __next__(self) -> Any:
        if self._current is None:
            self._current = self._start()
        return next(self._current)


class DataIterator:
    """Iterates a dataset, or a rank's shard of one (Ray: ``ray.data.DataIterator``, what
    ``ddp_runtime.get_dataset_shard`` returns). Each call of an ``iter_*`` method is a new pass (an epoch),
    computed partition by partition.

    Args:
        dataset: The dataset.
        pieces: The shard's ``(partition, first row, end row)`` pieces, in order; None: every row.
        name: The dataset's name (``TorchTrainer(datasets=...)`` key), for messages.
    """

    def __init__(self, dataset: _Rows, pieces: Sequence[tuple[int, int, int]] | None, *, name: str) -> None:
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
    ) -> Passes:
        """Passes in batches of ``batch_size`` rows (formed across partition boundaries, so only the last is
        shorter; None: one batch per partition), each a dict of column -> ndarray (``"numpy"``, the default) or
        a ``pandas.DataFrame``. ``prefetch_batches`` is accepted (one partition is always computed ahead);
        ``local_shuffle_buffer_size`` is refused (``random_shuffle`` the dataset instead)."""
        _check_options("iter_batches", ray_options)
        _check_batch_size(batch_size, allow_none=True)
        _check_batch_format(batch_format)
        return Passes(
            lambda: (
                _format(frame, batch_format) for frame in _rebatch(self._frames(), batch_size, drop_last)
            )
        )

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
    ) -> Passes:
        """Passes in batches of dicts of column -> ``torch.Tensor`` (Ray's ``iter_torch_batches``); each
        ``iter()`` of the result is one pass (``Passes``).

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
            return Passes(lambda: (collate_fn(batch) for batch in batches))
        return Passes(
            lambda: (
                {name: _tensor(values, _dtype(dtypes, name), target, torch) for name, values in batch.items()}
                for batch in batches
            )
        )

    def materialize(self) -> NoReturn:
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
