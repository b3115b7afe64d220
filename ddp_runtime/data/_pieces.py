"""Which rows of which partitions: the ``(partition, first row, end row)`` pieces holding a range of global
rows (a dataset's slices, a rank's equal shard), a piece as a Dask collection, and the partitions' row counts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dask.dataframe as dd
import pandas as pd


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


def _compute_lengths(ddf: dd.DataFrame, client: Any = None) -> list[int]:
    lengths = ddf.map_partitions(len, meta=(None, "int64"))
    if client is not None:
        series = client.compute(lengths).result()
    else:
        series = lengths.compute()
    return [int(n) for n in series]
