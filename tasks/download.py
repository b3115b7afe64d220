"""The Prefect task that prepares a sweep's dataset once, before any trial starts.

All work happens in ``sweepflow.tasks.datasets.prepare_dataset``, which is already idempotent (verified raw files are
not downloaded again, an existing prepared directory is reused). The Prefect layer adds two things:

* **Retries, only where they can help**: network failures (``DatasetFetchError``) are retried with
  backoff; a bad config, a missing file or a checksum mismatch fails at once, since retrying would only
  repeat the same answer.
* **Task caching**: a second flow run with the same data parameters skips the task entirely (state
  ``Cached``). The key is the config's ``cache_identity()`` (dataset, source, cache dir, split parameters,
  checksum overrides; no credentials, no host-local staging dir), so a dict and a ``DataConfig`` with the
  same values share it. A
  cached result is only accepted while its prepared directory still exists: if someone cleaned the cache,
  the task runs again and re-creates it, instead of handing trainers a path to nothing. That check reads
  the cache where it is, so it works the same for a local ``cache_dir`` and an ``s3://`` one (with the
  config's ``cache_storage_options``, or the AWS environment).
* **New data at the same location**: for a source that publishes new data under the same file names
  (``DataConfig.follow_source``), the key also holds each file's current version, read with one ``HEAD``
  (HTTP ETag, else Last-Modified and size) or ``HeadObject`` (S3 ETag) per file before deciding. Unchanged:
  ``Cached``, nothing downloaded. Changed: the task runs, downloads the new files and returns the new data
  checksum, which the pipeline records on its MLflow parent run and model version
  (``sweepflow.data_checksum``). If that look-up fails, the run is not cached at all (the key is None): the
  task body then hits the same source, and a network error there is a DatasetFetchError, retried as any
  other. An unreachable source is never taken for an unchanged one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.cache_policies import CachePolicy

from sweepflow.tasks.compat import NO_RESULT, cached_task_result, failed_state_exception
from sweepflow.tasks.datasets import (
    DataConfig,
    DatasetConfigError,
    DatasetError,
    DatasetFetchError,
    PreparedDataset,
    prepare_dataset,
    prepared_dataset_exists,
    source_versions,
)

if TYPE_CHECKING:
    from prefect import Task
    from prefect.client.schemas.objects import TaskRun
    from prefect.context import TaskRunContext
    from prefect.states import State

__all__ = ["PreparedDatasetCachePolicy", "dataset_cache_key", "download_dataset"]

logger = logging.getLogger(__name__)

#: Part of every key: bump it to invalidate all cached download_dataset results at once.
CACHE_KEY_VERSION = "download_dataset/v1"

#: Cached results older than this are recomputed, which re-checks the source's files (cheap when cached).
CACHE_EXPIRATION = timedelta(days=7)


def dataset_cache_key(
    config: DataConfig | Mapping[str, Any], versions: Mapping[str, Mapping[str, str]] | None = None
) -> str:
    """Stable key for a data config: sha256 of its ``cache_identity()`` as canonical JSON, plus, for a
    followed source, the file ``versions`` it has now (``source_versions``).

    Canonical JSON rather than Prefect's cloudpickle-based input hashing, so the key does not depend on
    whether a dict or a DataConfig was passed, on dict order, or on library versions. Without versions the
    key is the one it always was.
    """
    identity = DataConfig.coerce(config).cache_identity()
    if versions is not None:
        identity["source_versions"] = {name: dict(v) for name, v in versions.items()}
    payload = json.dumps({"version": CACHE_KEY_VERSION, **identity}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def _still_valid(result: Any, storage_options: Mapping[str, Any] | None) -> bool:
    """True if a cached task result points at a complete prepared directory (local or remote)."""
    try:
        prepared = PreparedDataset.from_dict(result)
    except ValueError:
        return False
    return prepared_dataset_exists(prepared.path, storage_options)


@dataclass
class PreparedDatasetCachePolicy(CachePolicy):
    """Key on the data config's identity; refuse a cached result whose prepared directory is gone.

    Prefect has no hook to validate a cache hit, so validation happens while computing the key: if the
    record stored under the key is stale, the key is moved on (deterministically, derived from the stale
    path), the task runs and re-creates the directory. The prepared path is itself deterministic, so after
    that re-run the original record is valid again and later runs hit it.
    """

    max_stale_records: int = 3

    def compute_key(
        self,
        task_ctx: TaskRunContext,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str | None:
        try:
            config = DataConfig.coerce(inputs.get("config", {}))
        except DatasetConfigError:
            return None  # no caching; the task body raises the same error with its message
        try:
            versions = source_versions(config)  # None unless follow_source: one HEAD per file
        except DatasetError as exc:
            # Not "unchanged": run uncached; the body meets the same source and fails (retried if transient).
            logger.warning("not using the task cache: could not read the source's file versions: %s", exc)
            return None
        key = dataset_cache_key(config, versions)
        for _ in range(self.max_stale_records):
            result = cached_task_result(task_ctx, key)
            if result is NO_RESULT or _still_valid(result, config.cache_storage_options):
                return key
            stale = result.get("path") if isinstance(result, Mapping) else repr(result)
            key = hashlib.sha256(f"{key}:stale:{stale}".encode()).hexdigest()
        return None  # several stale generations: run without caching rather than loop


def _retry_on_network_error(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry only transient fetch failures; everything else would fail the same way again."""
    return isinstance(failed_state_exception(state), DatasetFetchError)


@task(
    name="download-dataset",
    cache_policy=PreparedDatasetCachePolicy(),
    cache_expiration=CACHE_EXPIRATION,
    persist_result=True,
    result_serializer="json",
    retries=3,
    retry_delay_seconds=[2, 10, 30],
    retry_condition_fn=_retry_on_network_error,
)
def download_dataset(config: DataConfig | dict[str, Any]) -> dict[str, Any]:
    """Prepare the dataset described by ``config`` and return ``PreparedDataset.to_dict()``.

    ``config`` is a ``DataConfig`` with ``cache_dir`` set (the pipeline passes its resolved ``cfg.data``) or
    its ``to_dict()`` form (what a deployment parameter is); it is validated again here. The returned
    dict is JSON, so it can be a Prefect result and be passed to training tasks on Dask workers, which
    read the splits with ``sweepflow.tasks.datasets.load_split(result["path"], "train")``. With an ``s3://``
    ``cache_dir`` the path is an S3 URI; workers then need read access to it (the AWS environment, or
    ``load_split(..., storage_options=...)``). The result never holds credentials.
    """
    logger = get_run_logger()
    prepared = prepare_dataset(config)  # validates it again: model_copy(update=...) does not
    logger.info(
        "dataset %s ready at %s (sizes %s, data checksum %s)",
        prepared.name,
        prepared.path,
        prepared.sizes,
        prepared.checksum[:12],
    )
    return prepared.to_dict()
