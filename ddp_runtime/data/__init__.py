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

from typing import Any

from ddp_runtime.config import DataConfig
from ddp_runtime.data._batch import BatchFormat  # noqa: F401 - Ray's batch_format type, importable here as before
from ddp_runtime.data._dataset import Dataset, Schema
from ddp_runtime.data._iterate import DataIterator
from ddp_runtime.data._pieces import _row_ranges  # noqa: F401 - the trainer cuts ranks' shards with it
from ddp_runtime.data._sources import (
    from_dask,
    from_items,
    from_numpy,
    from_pandas,
    range,
    read_csv,
    read_json,
    read_parquet,
)
from ddp_runtime.not_built import NotBuiltError

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
