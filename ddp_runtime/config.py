"""Typed, validated configuration for ddp_runtime.

Names and fields mirror Ray Train's (``ScalingConfig``, ``RunConfig``, ...) so that user code ported from
Ray changes only its imports. Every config is a frozen dataclass validated in ``__post_init__``: a bad value
fails where it is written, with a message that says how to fix it, instead of deep inside a Dask worker.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


def _check_amount(name: str, amount: Any) -> None:
    if (
        isinstance(amount, bool)
        or not isinstance(amount, int | float)
        or not math.isfinite(amount)
        or amount <= 0
    ):
        raise ValueError(
            f"resources_per_worker[{name!r}] must be a positive number, got {amount!r}; "
            f'use e.g. {{"{name}": 1}} (fractions such as 0.5 let two 1-rank groups share a worker)'
        )


@dataclass(frozen=True)
class ScalingConfig:
    """How many ranks a training group has and what each rank reserves on its Dask worker.

    Each rank runs on its own Dask worker. ``resources_per_worker`` names Dask worker resources (workers
    declare them with ``--resources "GPU=1"``); ``use_gpu=True`` implies ``{"GPU": 1}`` per rank unless
    overridden and selects the NCCL backend.
    """

    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    # Intra-op threads each rank's torch uses; None: its "CPU" resource. Set apart from the reservation when a
    # rank is meant to use more cores than one worker declares (Tune trials sharing one host's cores, as Ray does).
    threads_per_worker: int | None = None

    def __post_init__(self) -> None:
        if self.threads_per_worker is not None and (
            isinstance(self.threads_per_worker, bool)
            or not isinstance(self.threads_per_worker, int)
            or self.threads_per_worker < 1
        ):
            raise ValueError(
                f"ScalingConfig.threads_per_worker must be an int >= 1 (or None: the CPU resource), "
                f"got {self.threads_per_worker!r}"
            )
        if (
            isinstance(self.num_workers, bool)
            or not isinstance(self.num_workers, int)
            or self.num_workers < 1
        ):
            raise ValueError(f"ScalingConfig.num_workers must be an int >= 1, got {self.num_workers!r}")
        resources = dict(self.resources_per_worker or {})
        for name, amount in resources.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"resources_per_worker keys must be resource names, got {name!r}")
            _check_amount(name, amount)
        if self.use_gpu:
            resources.setdefault("GPU", 1)
        object.__setattr__(self, "resources_per_worker", resources)

    @property
    def worker_resources(self) -> dict[str, float]:
        """The Dask resources one rank reserves (never None)."""
        return dict(self.resources_per_worker or {})


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoint retention: keep the best ``num_to_keep`` by a reported metric (the latest is always kept,
    so a restart can resume from it). ``checkpoint_frequency`` (every n steps) and ``checkpoint_at_end`` drive a
    Tune class trainable's ``save_checkpoint``; a training function saves its own (``report(checkpoint=...)``)."""

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["min", "max"] = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (
            isinstance(self.num_to_keep, bool)
            or not isinstance(self.num_to_keep, int)
            or self.num_to_keep < 1
        ):
            raise ValueError(
                f"CheckpointConfig.num_to_keep must be None (keep all) or an int >= 1, got {self.num_to_keep!r}"
            )
        if (
            isinstance(self.checkpoint_frequency, bool)
            or not isinstance(self.checkpoint_frequency, int)
            or self.checkpoint_frequency < 0
        ):
            raise ValueError(
                f"CheckpointConfig.checkpoint_frequency must be an int >= 0 (0: none), got {self.checkpoint_frequency!r}"
            )
        if self.checkpoint_score_order not in ("min", "max"):
            raise ValueError(
                f"CheckpointConfig.checkpoint_score_order must be 'min' or 'max', got {self.checkpoint_score_order!r}"
            )


@dataclass(frozen=True)
class FailureConfig:
    """How many times a failed group is restarted (from its latest checkpoint) before ``fit()`` fails; in a Tune
    experiment, ``fail_fast`` ends the experiment at its first failed trial (True: the others stop and none
    starts; "raise": the same, and ``Tuner.fit`` raises instead of returning the grid)."""

    max_failures: int = 0
    fail_fast: bool | str = False

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_failures, bool)
            or not isinstance(self.max_failures, int)
            or self.max_failures < -1
        ):
            raise ValueError(
                f"FailureConfig.max_failures must be an int >= 0 (or -1 for unlimited), got {self.max_failures!r}"
            )
        if self.fail_fast not in (True, False, "raise"):
            raise ValueError(
                f'FailureConfig.fail_fast must be True, False or "raise", got {self.fail_fast!r}'
            )


def default_storage_path() -> str:
    """Where runs are kept when ``RunConfig.storage_path`` is None."""
    return os.path.join(os.path.expanduser("~"), "sweepflow_results")


#: ``RunConfig.stop``: stop once a reported metric reaches a bound, or when ``stop(trial_id, metrics)`` is True.
StopCriteria = Mapping[str, float] | Callable[[str, dict[str, Any]], bool]


@dataclass(frozen=True)
class RunConfig:
    """How a run is kept and ended (Ray: ``ray.train.RunConfig``, which is also ``ray.tune.RunConfig``; the same
    class serves ``TorchTrainer`` and ``sweepflow.tune.Tuner``).

    Checkpoints live in ``storage_path/name/``: a local directory or any fsspec URI (``s3://bucket/prefix``), by
    default ``default_storage_path()``; ``storage_options`` are passed to fsspec (for s3fs: ``key``, ``secret``,
    ``client_kwargs={"endpoint_url": ...}``). Every rank's worker must be able to reach it: on a multi-node
    cluster use shared storage. ``stop`` ends a run (a trial) at the report that meets it: ``{"training_iteration":
    10}`` (any reported metric reaching its bound) or a function ``stop(trial_id, metrics) -> bool``.
    ``progress_reporter`` and ``verbose`` say how a Tune experiment prints its trials table (``verbose=0``: not);
    ``callbacks`` are a Tune experiment's ``sweepflow.tune.Callback`` objects (a ``TorchTrainer`` alone has none).
    """

    name: str | None = None
    storage_path: str | None = None
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    storage_options: dict[str, Any] | None = None
    stop: StopCriteria | None = None
    progress_reporter: Any = None  # sweepflow.tune.CLIReporter
    verbose: int = 1
    callbacks: list[Any] | None = None  # sweepflow.tune.Callback objects (checked by the Tuner)

    def __post_init__(self) -> None:
        if self.checkpoint_config is None:
            object.__setattr__(self, "checkpoint_config", CheckpointConfig())
        if self.failure_config is None:
            object.__setattr__(self, "failure_config", FailureConfig())
        if self.stop is not None and not callable(self.stop) and not isinstance(self.stop, Mapping):
            raise TypeError(
                f'RunConfig.stop must be a dict like {{"training_iteration": 10}} or a function '
                f"stop(trial_id, metrics) -> bool, got {self.stop!r}"
            )
        if self.callbacks is not None and not isinstance(self.callbacks, list | tuple):
            raise TypeError(
                f"RunConfig.callbacks must be a list of callbacks, e.g. callbacks=[MyCallback()], got {self.callbacks!r}"
            )
        if self.name is not None and (not self.name or "/" in self.name):
            raise ValueError(f"RunConfig.name must be a non-empty name without '/', got {self.name!r}")


@dataclass(frozen=True)
class TorchConfig:
    """torch.distributed settings of a group (Ray: ``ray.train.torch.TorchConfig``).

    ``backend`` defaults to ``nccl`` with GPUs and ``gloo`` without. ``rendezvous_timeout_s`` bounds the
    wait for every rank to join the group's store (a peer slow to start counts here, not against the
    collective timeout); ``timeout_s`` bounds connecting the process group once all have joined, and every
    collective. ``teardown_timeout_s`` is how long the driver waits for the surviving ranks
    of a failed group to exit on their own before it restarts the group's Dask workers.

    ``hang_timeout_s`` (default None: no bound) is the longest the group may go without progress: from rank 0
    entering the training function (every rank has joined the process group by then; set-up before it is
    bounded by the two timeouts above) to its first report, and between two reports. Past it, the driver
    takes every rank's Python stack, fails the attempt with a ``RankHangError`` naming the rank that hung and
    the line it is at (the ranks waiting for it in a collective or ``report`` are told apart from it), and
    restarts the group's Dask workers as for a failed group (a hung thread cannot be stopped otherwise, so
    even a 1-rank group's worker is restarted). A hang counts as a failure for ``FailureConfig``. Set it above
    the slowest epoch, the first included (on a fresh worker it pays DDP's first-use imports, ~10 s on a
    small machine).
    """

    backend: Literal["nccl", "gloo"] | None = None
    timeout_s: float = 300.0
    rendezvous_timeout_s: float = 60.0
    teardown_timeout_s: float = 1.0
    hang_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.backend not in (None, "nccl", "gloo"):
            raise ValueError(
                f"TorchConfig.backend must be 'nccl', 'gloo' or None (automatic), got {self.backend!r}"
            )
        for name in ("timeout_s", "rendezvous_timeout_s", "teardown_timeout_s", "hang_timeout_s"):
            value = getattr(self, name)
            if name == "hang_timeout_s" and value is None:
                continue  # no bound on a group's time without progress
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"TorchConfig.{name} must be a positive number of seconds, got {value!r}")


def stop_met(stop: StopCriteria | None, trial_id: str, metrics: Mapping[str, Any]) -> bool:
    """Whether a report meets ``RunConfig.stop`` (a dict: any of its metrics reached its bound)."""
    if stop is None:
        return False
    if callable(stop):
        return bool(stop(trial_id, dict(metrics)))
    return any(key in metrics and metrics[key] >= bound for key, bound in stop.items())


@dataclass(frozen=True)
class DataConfig:
    """Which of a ``TorchTrainer``'s ``datasets`` are split between its ranks (Ray: ``ray.train.DataConfig``).

    ``datasets_to_split="all"`` (the default) splits every dataset: each rank's ``get_dataset_shard(name)``
    yields its own disjoint rows, the same number on every rank (the last ``rows % num_workers`` rows are
    dropped, so the ranks' batch counts match and DDP never waits on a rank with one batch more). A list names
    the datasets to split; the others are given whole to every rank (e.g. a validation set each rank scores).
    """

    datasets_to_split: Literal["all"] | list[str] | tuple[str, ...] = "all"

    def __post_init__(self) -> None:
        value = self.datasets_to_split
        if value == "all":
            return
        if (
            isinstance(value, str)
            or not isinstance(value, list | tuple)
            or not all(isinstance(v, str) for v in value)
        ):
            raise ValueError(
                f'DataConfig.datasets_to_split must be "all" or a list of dataset names, got {value!r}'
            )
        object.__setattr__(self, "datasets_to_split", list(value))
