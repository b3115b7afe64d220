"""What a sweep tells an observer while it runs: its start and end, the driver loop's steps, each trial's start,
reports and end (``sweepflow.tune`` maps them onto Ray Tune's ``Callback`` hooks).

Every event is delivered in the flow's process, one at a time (``SweepRuntime.notify`` holds a lock), never on a
Dask worker: a trial's start and reports from its task's thread, the rest from the sweep's own thread. An
observer that raises stops the sweep: the running trials stop at their next report (their runs end KILLED),
none starts, no further event is delivered, and ``Sweep.run`` raises the observer's error once every trial has
ended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweepflow.tasks.sweep.results import TrialResult
    from sweepflow.tasks.sweep.template import SweepTrial


class SweepObserver:
    """The events of one sweep; every method does nothing unless overridden."""

    def sweep_started(self, total: int) -> None:
        """Before any trial: ``total`` trials will be proposed."""

    def step_begin(self) -> None:
        """The driver loop begins a step (it starts what it can, then takes one trial's end or a freed slot)."""

    def step_end(self) -> None:
        """The driver loop ended a step."""

    def trial_started(self, spec: SweepTrial, run_id: str, storage: str) -> None:
        """A trial's MLflow run is open and its group is about to start; ``storage``: where its checkpoints go."""

    def trial_result(self, spec: SweepTrial, result: Mapping[str, Any]) -> bool | None:
        """A trial reported ``result`` (the scheduler has already decided on it). ``spec``: with its current config
        (PBT changes it). True asks for a checkpoint of this report (Ray: a callback setting ``should_checkpoint``):
        the trial's rank 0 saves one if its function can (a class trainable), before it goes on."""
        return None

    def trial_ended(self, result: TrialResult) -> None:
        """A trial that started has ended (completed, stopped early, or failed); its MLflow writes are queued."""

    def sweep_ended(self, results: Sequence[TrialResult]) -> None:
        """Every trial has ended and every MLflow write of theirs is done."""
