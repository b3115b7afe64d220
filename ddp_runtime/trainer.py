"""``TorchTrainer``: run a PyTorch training function as a DDP group on a Dask cluster (Ray: ``ray.train.torch``).

The driver (``fit``) runs the group one attempt at a time (``_group.GroupRun``: gang-reserve one Dask worker
per rank, submit one pinned task per rank, relay rank 0's reports to ``on_report``, keep checkpoints by
``CheckpointConfig``, tear the whole group down when any rank fails or its worker dies), and restarts it from
the latest checkpoint up to ``FailureConfig.max_failures`` times.

The driver side never imports torch (only the ranks and the in-worker helpers of ``prepare`` do), so the
process that drives a sweep does not pay its import (~5 s) or its memory.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from distributed import Client, default_client, get_worker, worker_client

from ddp_runtime._gang import InsufficientResourcesError
from ddp_runtime._gang import lend as gang_lend
from ddp_runtime._group import GroupRun, ReportCallback, Verdict
from ddp_runtime.callback import TrainRunContext, checked_callbacks
from ddp_runtime.checkpoint import Checkpoint, RunStorage, StoredCheckpoint
from ddp_runtime.cluster import gpu_count, local_cluster
from ddp_runtime.config import DataConfig, RunConfig, ScalingConfig, TorchConfig, default_storage_path
from ddp_runtime.object_store import object_store
from ddp_runtime.result import Result, TrainingFailedError
from ddp_runtime.session import _install_shards, get_context

log = logging.getLogger(__name__)

__all__ = ["ReportCallback", "TorchTrainer", "Verdict", "default_storage_path"]


class TorchTrainer:
    """Run ``train_loop_per_worker`` on ``scaling_config.num_workers`` ranks (Ray: ``TorchTrainer``).

    ``on_report(metrics) -> bool`` is called on the driver for every rank-0 report while the group runs;
    returning True stops the group at that report (the ranks see ``report`` raise and exit) and frees its
    workers; returning a ``Verdict(stop=..., checkpoint=True)`` also asks rank 0 for a checkpoint of that report
    (kept when its function offers one: ``report(..., checkpoint_on_request=...)``). ``on_side(payload)`` is
    called on the driver, in order, for what rank 0 sent through ``ddp_runtime.session.side_channel`` (e.g. its
    system metrics). ``client`` defaults to the current Dask client; with none, ``fit`` starts a local cluster.

    ``datasets`` (Ray's): ``ddp_runtime.data.Dataset`` objects by name, read in the training function with
    ``ddp_runtime.get_dataset_shard(name)``; ``dataset_config`` (a ``DataConfig``) says which are split between
    the ranks (all, by default: equal disjoint shards, the last ``rows % num_workers`` rows dropped) and which
    every rank gets whole. ``fit`` counts the split datasets' rows per partition on the cluster before the group
    starts; the ranks then stream their partitions from the Dask workers.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        torch_config: TorchConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        client: Client | None = None,
        on_report: ReportCallback | None = None,
        on_side: Callable[[Any], None] | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
    ) -> None:
        if not callable(train_loop_per_worker):
            raise TypeError(
                f"train_loop_per_worker must be a function, got {type(train_loop_per_worker).__name__}"
            )
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.torch_config = torch_config or TorchConfig()
        self.resume_from_checkpoint = resume_from_checkpoint
        self.client = client
        self.on_report = on_report
        self.on_side = on_side
        self.datasets = _checked_datasets(datasets)
        if dataset_config is not None and not isinstance(dataset_config, DataConfig):
            raise TypeError(
                f"dataset_config must be a ddp_runtime.DataConfig(datasets_to_split=...), got {dataset_config!r}"
            )
        self.dataset_config = dataset_config or DataConfig()
        to_split = self.dataset_config.datasets_to_split
        unknown = [] if to_split == "all" else [n for n in to_split if n not in self.datasets]
        if unknown:
            raise ValueError(
                f"DataConfig(datasets_to_split=...) names {unknown}, which are not in TorchTrainer(datasets=...); "
                f"given: {sorted(self.datasets) or 'none'}"
            )
        if self.run_config.progress_reporter is not None:
            raise ValueError(
                "RunConfig(progress_reporter=...) draws a Tune experiment's trials table: pass it in "
                "Tuner(run_config=...) or tune.run(progress_reporter=...), not to a TorchTrainer"
            )
        self.callbacks = checked_callbacks(self.run_config.callbacks)
        self.run_context = TrainRunContext(self.run_config, self.train_loop_config, self.scaling_config)
        checkpoints = self.run_config.checkpoint_config
        if checkpoints.checkpoint_frequency or checkpoints.checkpoint_at_end:
            raise ValueError(
                "CheckpointConfig(checkpoint_frequency=..., checkpoint_at_end=...) drives a Tune class trainable's "
                "save_checkpoint; a training function saves its own: call report(metrics, "
                "checkpoint=Checkpoint.from_directory(d)) where you want one, and drop those two settings"
            )
        self.name = (
            self.run_config.name or f"TorchTrainer_{datetime.now():%Y-%m-%d_%H-%M-%S}_{uuid.uuid4().hex[:6]}"
        )
        self.storage = RunStorage(
            self.run_config.storage_path or default_storage_path(), self.name, self.run_config.storage_options
        )

    # ----------------------------------------------------------------------------------------------- driver

    def fit(self) -> Result:
        """Train: run the group until its function returns, restarting it from the latest checkpoint on
        failure (Ray's ``TorchTrainer.fit``).

        Without ``client`` and with no current Dask client, a local cluster of ``num_workers`` workers is
        started for this call and closed after it.

        Returns:
            The run's ``Result``: the last metrics, every report, the latest and kept checkpoints.

        Raises:
            TrainingFailedError: the group failed more than ``FailureConfig.max_failures`` times (-1: never
                gives up).
            InsufficientResourcesError: the cluster cannot hold the group (e.g. ``use_gpu=True`` on a machine
                without a GPU and no cluster connected).
        """
        with self._client() as client, object_store(client):  # the objects put so far are on its cluster
            result = self._fit(client)
        if self.run_config.verbose:  # RunConfig(verbose=0): nothing but warnings
            last = result.metrics_history[-1] if result.metrics_history else {}
            log.info("%s: %d report(s); last %s", self.name, len(result.metrics_history), last)
        return result

    @contextlib.contextmanager
    def _client(self) -> Iterator[Client]:
        if self.client is not None:
            yield self.client
            return
        if _in_a_dask_task():  # a trial's function fitting a trainer of its own (Ray Train v2's Tune pattern)
            with _inside_a_rank() as client:
                yield client
            return
        try:
            current = default_client()
        except ValueError:
            current = None  # no client in this process: start a local cluster sized for this group
        if current is not None:
            yield current  # (outside the try: a ValueError of the body is the body's)
            return
        resources = {k: float(v) for k, v in self.scaling_config.worker_resources.items()}
        # Before any worker starts: without a GPU its ranks would fail on CUDA, and the workers restart.
        if resources.get("GPU") and not gpu_count():
            raise InsufficientResourcesError(
                f"ScalingConfig(use_gpu=True) asks {resources['GPU']:g} GPU per worker, but this machine has no GPU "
                "(nvidia-smi lists none) and no Dask cluster is connected: set use_gpu=False to train on CPUs, or "
                "pass client= (or connect a Client first) to a cluster whose workers have GPUs"
            )
        with local_cluster(n_workers=self.scaling_config.num_workers, resources=resources) as client:
            yield client

    def _fit(self, client: Client) -> Result:
        history: list[dict[str, Any]] = []
        errors: list[BaseException] = []
        committed = self.storage.list_committed()
        resume = self.resume_from_checkpoint
        stopped = False
        max_failures = self.run_config.failure_config.max_failures
        attempt = 0
        self._train_time_s = 0.0
        self._held_s = 0.0
        self._startup_s = 0.0
        self._rank0_window: tuple[str, float, float] | None = None
        group_view = _GroupView(self, self._with_shards(client)) if self.datasets else self
        while True:
            outcome = GroupRun(group_view, client, attempt, resume, committed, history).run()
            self._train_time_s += outcome.train_time_s
            self._held_s += outcome.held_s
            self._startup_s += outcome.startup_s
            self._rank0_window = outcome.rank0_window or self._rank0_window
            committed = outcome.committed
            # A UserCallback stopped the group (StopTraining: Tune stopped the trial driving it).
            if outcome.callback_raised is not None:
                raise outcome.callback_raised
            if outcome.error is None:
                stopped = outcome.stopped
                break
            errors.append(outcome.error)
            self._tell_callbacks_of(outcome.error)
            log.warning("group %s attempt %d failed: %s", self.name, attempt, outcome.error)
            if max_failures != -1 and len(errors) > max_failures:
                raise TrainingFailedError(
                    self._result(history, committed, errors, stopped=False, error=outcome.error)
                )
            attempt += 1
            resume = committed[-1].checkpoint if committed else resume
        return self._result(history, committed, errors, stopped=stopped, error=None)

    def _tell_callbacks_of(self, error: BaseException) -> None:
        """``UserCallback.after_exception`` with the failed rank's error (rank 0 when no rank is named)."""
        for callback in self.callbacks:
            callback.after_exception(self.run_context, {int(getattr(error, "rank", 0) or 0): error})

    def _with_shards(self, client: Client) -> Callable[..., Any]:
        """The training function wrapped to hand each rank its dataset shards: the split datasets' partition row
        counts are computed here, on the cluster (only counts come back), and cut into equal row ranges."""
        from ddp_runtime.data import DataIterator, _row_ranges

        n = self.scaling_config.num_workers
        to_split = self.dataset_config.datasets_to_split
        shards: dict[str, list[Any]] = {}
        for name, dataset in self.datasets.items():
            if to_split != "all" and name not in to_split:
                shards[name] = [DataIterator(dataset, None, name=name)] * n
                continue
            lengths = dataset._partition_lengths(client)
            per = sum(lengths) // n  # every rank the same rows: the last sum % n are dropped
            shards[name] = [
                DataIterator(dataset, _row_ranges(lengths, rank * per, (rank + 1) * per), name=name)
                for rank in range(n)
            ]
            dropped = sum(lengths) - per * n
            if dropped:
                log.info(
                    "dataset %r: %d row(s) split %d ways, the last %d dropped", name, sum(lengths), n, dropped
                )
        return _WithShards(self.train_loop_per_worker, shards)

    def _result(
        self,
        history: list[dict[str, Any]],
        committed: list[StoredCheckpoint],
        errors: list[BaseException],
        *,
        stopped: bool,
        error: BaseException | None,
    ) -> Result:
        cfg = self.run_config.checkpoint_config
        best = list(committed)
        if cfg.checkpoint_score_attribute is not None:
            sign = -1.0 if cfg.checkpoint_score_order == "max" else 1.0
            best.sort(key=lambda s: sign * float(s.metrics.get(cfg.checkpoint_score_attribute, float("nan"))))
        return Result(
            metrics=history[-1] if history else None,
            metrics_history=history,
            checkpoint=committed[-1].checkpoint if committed else None,
            best_checkpoints=[(s.checkpoint, s.metrics) for s in best],
            path=self.storage.uri,
            error=error,
            stopped_early=stopped,
            num_failures=len(errors),
            attempts_errors=errors,
            train_time_s=self._train_time_s,
            held_s=self._held_s,
            startup_s=self._startup_s,
            rank0_worker=self._rank0_window[0] if self._rank0_window else None,
            started_at=self._rank0_window[1] if self._rank0_window else None,
            ended_at=self._rank0_window[2] if self._rank0_window else None,
        )


def _checked_datasets(datasets: Any) -> dict[str, Any]:
    """``TorchTrainer(datasets=...)`` checked before any work: a dict of name -> ``ddp_runtime.data.Dataset``."""
    if datasets is None:
        return {}
    if not isinstance(datasets, dict):
        raise TypeError(
            f'TorchTrainer(datasets=...) takes a dict of name -> Dataset, e.g. {{"train": ds}}, got '
            f"{type(datasets).__name__}"
        )
    if not datasets:
        return {}
    from ddp_runtime.data import Dataset  # pandas and dask.dataframe: only for trainers given datasets

    wrong = {name: type(ds).__name__ for name, ds in datasets.items() if not isinstance(ds, Dataset)}
    if wrong or not all(isinstance(name, str) for name in datasets):
        raise TypeError(
            f"TorchTrainer(datasets=...) takes ddp_runtime.data.Dataset values under string names (build them with "
            f"ddp_runtime.data.read_csv, from_pandas, ...); not datasets: {wrong or 'non-string names'} among the "
            f"names given: {sorted(map(str, datasets))}"
        )
    return dict(datasets)


class _WithShards:
    """A training function that first installs the calling rank's dataset shards (``get_dataset_shard``).
    Keeps the function's signature (``__wrapped__``), so it is called with ``train_loop_config`` or without, as
    the function itself would be."""

    def __init__(self, fn: Callable[..., Any], shards: dict[str, list[Any]]) -> None:
        functools.update_wrapper(self, fn)
        self.shards = shards

    def __call__(self, *args: Any) -> Any:
        rank = get_context().get_world_rank()
        _install_shards({name: per_rank[rank] for name, per_rank in self.shards.items()})
        try:
            return self.__wrapped__(*args)
        finally:
            _install_shards(None)


def _in_a_dask_task() -> bool:
    """Whether this thread runs a task of a Dask worker."""
    try:
        get_worker()
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def _inside_a_rank() -> Iterator[Client]:
    """The cluster of the Dask task calling ``fit()``: a client of its scheduler, with the task seceded from its
    worker's threads while the group runs, so it holds none of them (a rank of the group may run on this worker).
    When the task is a 1-rank group's rank (a Tune trial's function), that group lends its worker and resources
    to the groups placed meanwhile (``_gang.lend``): the trial's reservation is the group's, and trials driving
    groups never wait for one another's workers."""
    from ddp_runtime.session import _current, inside_training_function

    session = _current() if inside_training_function() else None
    with worker_client(separate_thread=True) as client:
        if session is not None and session.group_id is not None and session.context.world_size == 1:
            client.run_on_scheduler(gang_lend, session.group_id)
        yield client


class _GroupView:
    """The trainer as its groups see it, with the training function wrapped (``_WithShards``)."""

    def __init__(self, trainer: TorchTrainer, train_loop_per_worker: Callable[..., Any]) -> None:
        self._trainer = trainer
        self.train_loop_per_worker = train_loop_per_worker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)
