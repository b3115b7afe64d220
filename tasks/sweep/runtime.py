"""What the trials of one sweep share in the flow's process (``SweepRuntime``): the Dask client, the scheduler,
the tracker. The ``train-trial`` task receives it as a parameter Prefect neither inspects nor caches (``quote``,
``NO_CACHE``): trials run in the flow's process, on Prefect's thread pool."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweepflow.tasks.sweep.events import SweepObserver
from sweepflow.tasks.sweep.progress import SweepProgress
from sweepflow.tasks.sweep.samplers import Sampler
from sweepflow.tasks.sweep.slots import HeldSlot, TrialSlots
from sweepflow.tasks.sweep.trial_scheduler import TrialScheduler
from sweepflow.tasks.tracking.runs import RunTracker, TrackingServerError
from sweepflow.tasks.tracking.writers import RunWriters

# What runs one group of a trial: called with ``TorchTrainer``'s arguments, returns an object whose ``fit()``
# returns a ``ddp_runtime.Result`` (or raises ``TrainingFailedError``).
Trainer = Callable[..., Any]


def _torch_trainer(*args: Any, **kwargs: Any) -> Any:
    from ddp_runtime.torch import TorchTrainer  # imported by the sweeps that run groups, not by its importers

    return TorchTrainer(*args, **kwargs)


@dataclass
class SweepRuntime:
    """What the trials of one sweep share, in the flow's process."""

    client: Any  # the Dask client the groups run on (None: a fake trainer that needs none)
    slots: TrialSlots
    scheduler: TrialScheduler
    tracker: RunTracker
    parent_run_id: str
    progress: SweepProgress
    staging_dir: str  # for checkpoints when the artifact store is proxied by the tracking server
    deadline: float | None = None  # time.monotonic() after which running trials are stopped
    storage_options: dict[str, Any] | None = None
    artifacts_destination: str | None = None  # the tracking server's --artifacts-destination, when known
    writers: RunWriters = field(default_factory=RunWriters)  # the child runs' writers, joined by the sweep
    aborted: str | None = None  # why the sweep is stopping: running trials stop at their next report
    killed: bool = (
        True  # the stop is an error elsewhere (their runs end KILLED), not a rule (stop_all, fail_fast)
    )
    fail_fast: bool = False  # a failed trial ends the sweep (before its slot frees: no other trial starts)
    # trial id -> where its checkpoints are (``<storage>/checkpoints``): PBT copies a donor's latest from there
    storages: dict[str, str] = field(default_factory=dict)
    _grants: dict[int, tuple[HeldSlot, float]] = field(
        default_factory=dict
    )  # trial index -> (slot, queued s)
    trainer: Trainer = _torch_trainer  # runs each group (TorchTrainer on ``client``; a fake one in tests)
    sampler: Sampler | None = None  # told each report (``on_report``): a searcher learning while trials run
    observer: SweepObserver | None = None  # told the sweep's events (events.py), one at a time
    observer_error: Exception | None = None  # what the observer raised: the sweep stops, then raises it
    _observer_lock: threading.RLock = field(default_factory=threading.RLock)

    def notify(self, event: str, *args: Any) -> Any:
        """Tell the observer ``event`` (a ``SweepObserver`` method); returns its answer (None without one). When it
        raises, the sweep stops as after any error (running trials stop at their next report, none starts) and
        ``Sweep.run`` raises it at the end; the observer hears nothing more."""
        if self.observer is None:
            return None
        with self._observer_lock:
            if self.observer_error is not None:
                return None
            try:
                return getattr(self.observer, event)(*args)
            except Exception as exc:  # noqa: BLE001 - raised by Sweep.run once every trial has ended
                self.observer_error = exc
                self.abort(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                return None

    def grant(self, index: int, slot: HeldSlot, *, queued_s: float) -> None:
        """Hand trial ``index`` the slot the sweep took for it (its task takes it with ``take_grant``)."""
        self._grants[index] = (slot, queued_s)

    def take_grant(self, index: int) -> tuple[HeldSlot, float]:
        return self._grants.pop(index)

    def abort(self, reason: str) -> None:
        """An error elsewhere: the running trials stop (their runs end KILLED) and none starts."""
        if self.aborted is None:
            self.aborted, self.killed = reason, True

    def writer_failed(self, exc: BaseException) -> None:
        """A trial's MLflow writer stopped on ``exc``. A server error (its code failed: every trial's writes would
        fail the same way) stops the sweep now, rather than training trials whose results cannot be recorded; an
        outage past its bound, or one trial's refused write, fails the sweep at its end as before."""
        if isinstance(exc, TrackingServerError):
            self.abort(str(exc).splitlines()[0])

    def end_early(self, reason: str) -> None:
        """A rule ends the sweep (a stopper's ``stop_all``, ``fail_fast``): the running trials stop as stopped
        early, none starts."""
        if self.aborted is None:
            self.aborted, self.killed = reason, False

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline
