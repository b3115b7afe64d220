"""What ``TorchTrainer.fit()`` returns (Ray: ``ray.train.Result``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddp_runtime.checkpoint import Checkpoint


class RankError(RuntimeError):
    """A rank's training function raised; carries the rank and its traceback text."""

    def __init__(self, rank: int | None, worker: str | None, message: str, traceback_text: str = "") -> None:
        self.rank = rank
        self.worker = worker
        self.traceback_text = traceback_text
        where = f"rank {rank}" if rank is not None else "the group"
        super().__init__(f"{where} (Dask worker {worker}) failed: {message}\n{traceback_text}".rstrip())


class RankHangError(RankError):
    """A rank stopped making progress (``TorchConfig.hang_timeout_s``, or its peers' collective timed out).

    ``rank``/``worker`` name the (first) rank found hung, ``summary`` says where it is and what the other ranks
    were doing, ``traceback_text`` holds the hung rank(s)' Python stacks as taken from their workers.
    """

    def __init__(self, rank: int | None, worker: str | None, summary: str, traceback_text: str = "") -> None:
        self.rank = rank
        self.worker = worker
        self.summary = summary
        self.traceback_text = traceback_text
        RuntimeError.__init__(self, f"{summary}\n{traceback_text}".rstrip())

    def __reduce__(self) -> tuple[Any, ...]:  # picklable although __init__ takes more than the message
        return (type(self), (self.rank, self.worker, self.summary, self.traceback_text))


@dataclass
class Result:
    """What ``TorchTrainer.fit()`` returns (Ray's ``ray.train.Result``), plus what the run cost.

    Differs from Ray: the reports are a list (``metrics_history``) rather than ``metrics_dataframe``;
    ``fit()`` returns only on success (``error`` is None), and on failure raises ``TrainingFailedError``,
    whose ``result`` holds the last attempt's error.

    Attributes:
        metrics: rank 0's last report; None when it reported nothing.
        metrics_history: every report of rank 0, over all attempts, in order.
        checkpoint: the latest committed checkpoint; None when none was reported.
        best_checkpoints: (checkpoint, metrics reported with it) for every kept checkpoint, best first by
            ``CheckpointConfig.checkpoint_score_attribute`` (else oldest first).
        path: the run's directory, ``storage_path/name``.
        error: the error that ended training (set only in ``TrainingFailedError.result``).
        stopped_early: ``on_report`` stopped the group before the function returned.
        num_failures: how many attempts failed (each restart from the latest checkpoint follows one).
        attempts_errors: each failed attempt's error, in order.
        train_time_s: seconds rank 0 spent inside the training function (all attempts).
        held_s: seconds the group held its workers (all attempts), less ``startup_s``.
        startup_s: seconds the group waited for its workers' one-time start-up.
        started_at: when rank 0 of the last attempt entered the training function (epoch seconds).
        ended_at: when it left it.
        rank0_worker: the Dask worker rank 0 of the last attempt ran on.
    """

    metrics: dict[str, Any] | None
    metrics_history: list[dict[str, Any]]
    checkpoint: Checkpoint | None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]]
    path: str
    error: BaseException | None = None
    stopped_early: bool = False
    num_failures: int = 0
    attempts_errors: list[BaseException] = field(default_factory=list)
    # Seconds rank 0 spent inside the training function (all attempts): fit()'s wall time minus this is the
    # runtime's own overhead (reservation, launch, rendezvous, teardown).
    train_time_s: float = 0.0
    # Seconds the group held its workers (all attempts): from its reservation on the scheduler to its release,
    # less ``startup_s``. Times the number of ranks, this is what the group cost the cluster (worker-seconds).
    held_s: float = 0.0
    # Seconds the group waited for its workers' one-time start-up (all attempts; the slowest rank's): a cold
    # worker's first imports (the preloads, torch._dynamo). 0.0 on warm workers (``cluster.warm_up_workers``).
    startup_s: float = 0.0
    # When rank 0 of the last attempt entered and left the training function (epoch seconds), and on which
    # Dask worker: consecutive groups on one worker show how long it sat idle between them.
    started_at: float | None = None
    ended_at: float | None = None
    rank0_worker: str | None = None


class TrainingFailedError(RuntimeError):
    """``fit()`` gave up: the group failed more than ``FailureConfig.max_failures`` times."""

    def __init__(self, result: Result) -> None:
        self.result = result
        super().__init__(
            f"training failed after {result.num_failures} failure(s) (FailureConfig.max_failures allows "
            f"{result.num_failures - 1}); last error: {result.error}"
        )
