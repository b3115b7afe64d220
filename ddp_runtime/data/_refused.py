"""The Ray Data methods (``Dataset``, ``DataIterator``) and options not built here, each with what to use
instead; Ray's hints that change nothing here are accepted. (Module names not built: the package's
``NOT_BUILT``.)"""

from __future__ import annotations

from typing import Any

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
