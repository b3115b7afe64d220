"""A ``TorchTrainer``'s own callbacks (Ray Train v2's ``ray.train.UserCallback``), called on the driver.

``RunConfig(callbacks=[...])`` of a ``TorchTrainer`` takes ``UserCallback`` objects: ``after_report`` once per
report of the group, with rank 0's metrics (a one-item list: the other ranks' metrics stay on their ranks) and
the report's checkpoint once it is committed; ``after_exception`` when an attempt of the group fails, with the
failed rank's error. Both run in the thread that called ``fit()``, so a callback may call what that thread may
call, for instance ``sweepflow.tune.report`` when ``fit()`` runs inside a Tune trial
(``sweepflow.tune.integration.ray_train.TuneReportCallback``). A callback that raises ``StopTraining`` stops the
group at that report and ``fit()`` raises it again once the group has ended, so the code after ``fit()`` in a
trial does not run (as when Tune stops a Ray trial); any other error of a callback stops the group and
``fit()`` raises it.

A report of a multi-rank group reaches the callbacks with its checkpoint when rank 0 passed one (the driver
then waits for the checkpoint's commit before calling them), else with ``checkpoint=None``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddp_runtime.checkpoint import Checkpoint
    from ddp_runtime.config import RunConfig, ScalingConfig


@dataclass(frozen=True)
class TrainRunContext:
    """What a callback is told about the run (Ray's ``TrainRunContext``): its id, its run config, the training
    function's config and the scaling config."""

    run_config: RunConfig
    train_loop_config: dict[str, Any] | None
    scaling_config: ScalingConfig
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def get_run_config(self) -> RunConfig:
        """The run's ``RunConfig``."""
        return self.run_config


class UserCallback:
    """A ``TorchTrainer`` callback (Ray's ``ray.train.UserCallback``): subclass it and override either hook."""

    def after_report(
        self,
        run_context: TrainRunContext,
        metrics: list[dict[str, Any]],
        checkpoint: Checkpoint | None,
    ) -> None:
        """Called on the driver after a report of the group: ``metrics[0]`` is rank 0's; ``checkpoint`` the
        report's committed checkpoint, or None."""

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, BaseException]
    ) -> None:
        """Called on the driver after an attempt of the group failed: the failed rank's error by its rank."""


def checked_callbacks(callbacks: list[Any] | tuple[Any, ...] | None) -> list[UserCallback]:
    """A ``TorchTrainer``'s ``RunConfig.callbacks``: ``UserCallback`` objects only; a Tune experiment's callbacks
    are refused with where they go."""
    found = list(callbacks or ())
    wrong = [c for c in found if not isinstance(c, UserCallback)]
    if wrong:
        raise ValueError(
            f"TorchTrainer(run_config=RunConfig(callbacks=...)) takes ddp_runtime.UserCallback objects (Ray Train's "
            f"after_report/after_exception), got {wrong!r}; a Tune experiment's callbacks (trial start, results, "
            "end) go in Tuner(run_config=...) or tune.run(callbacks=...)"
        )
    return found
