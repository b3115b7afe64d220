"""``sweepflow.tune.schedulers``: Ray Tune's trial schedulers, as settings for the sweep's own schedulers.

Ray lets ``metric``/``mode`` be given to the scheduler or to ``tune.run``/``TuneConfig``; the scheduler is built
when the experiment starts, with whichever was given (and a clear error when neither was).
"""

from __future__ import annotations

from typing import Any

from sweepflow.tasks.sweep.schedulers import TrialScheduler, make_scheduler


class FIFOScheduler:
    """Runs every trial to its end (Ray's default)."""

    metric: str | None = None
    mode: str | None = None

    def build(self, metric: str | None, mode: str | None) -> TrialScheduler:
        return make_scheduler({"type": "fifo"})

    @property
    def max_t(self) -> int | None:
        return None


class ASHAScheduler:
    """Asynchronous successive halving, one bracket (Ray's ``ASHAScheduler`` / ``AsyncHyperBandScheduler``)."""

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: int = 100,
        grace_period: int = 1,
        reduction_factor: float = 4,
        brackets: int = 1,
        stop_last_trials: bool = True,
    ) -> None:
        if brackets != 1:
            raise ValueError(f"ASHAScheduler(brackets={brackets}): only one bracket is supported; use brackets=1")
        if mode not in (None, "min", "max"):
            raise ValueError(f"ASHAScheduler(mode={mode!r}): mode must be 'min' or 'max'")
        self.time_attr = time_attr
        self.metric = metric
        self.mode = mode
        self.max_t = max_t
        self.grace_period = grace_period
        self.reduction_factor = reduction_factor
        self.build(metric or "metric", mode or "min")  # the numbers are checked now, before any work

    def build(self, metric: str | None, mode: str | None) -> TrialScheduler:
        metric, mode = self.metric or metric, self.mode or mode
        if not metric or not mode:
            raise ValueError(
                "ASHAScheduler needs the metric to compare trials by and its mode: pass metric=... and mode='min' "
                "or 'max' to the scheduler, or to tune.run / TuneConfig"
            )
        return make_scheduler(
            {
                "type": "asha",
                "metric": metric,
                "mode": mode,
                "max_t": self.max_t,
                "grace_period": self.grace_period,
                "reduction_factor": self.reduction_factor,
                "time_attr": self.time_attr,
            }
        )

    def __repr__(self) -> str:
        return (
            f"ASHAScheduler(metric={self.metric!r}, mode={self.mode!r}, max_t={self.max_t}, "
            f"grace_period={self.grace_period}, reduction_factor={self.reduction_factor})"
        )


AsyncHyperBandScheduler = ASHAScheduler


def resolve(scheduler: Any) -> Any:
    if scheduler is None:
        return FIFOScheduler()
    if not hasattr(scheduler, "build"):
        raise TypeError(
            f"scheduler={scheduler!r}: use sweepflow.tune.schedulers.ASHAScheduler(...) or FIFOScheduler()"
        )
    return scheduler
