"""``sweepflow.tune.schedulers``: Ray Tune's trial schedulers. They are the sweep's own schedulers (one class per
algorithm, in ``sweepflow.tasks.sweep.schedulers``), which take Ray's arguments and defaults.

Ray lets ``metric``/``mode`` be given to the scheduler or to ``tune.run``/``TuneConfig``: the experiment hands its
own to the scheduler (``set_search_properties``) before any trial runs, with a clear error when neither has them.
"""

from __future__ import annotations

from typing import Any

from sweepflow.tasks.sweep.hyperband import HyperBandScheduler
from sweepflow.tasks.sweep.pb2 import PB2
from sweepflow.tasks.sweep.pbt import PopulationBasedTraining
from sweepflow.tasks.sweep.schedulers import (
    ASHAScheduler,
    AsyncHyperBandScheduler,
    FIFOScheduler,
    MedianStoppingRule,
    TrialScheduler,
)
from sweepflow.tune.not_built import refusing

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "FIFOScheduler",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PB2",
    "PopulationBasedTraining",
    "TrialScheduler",
    "resolve",
]


def resolve(scheduler: Any) -> TrialScheduler:
    """The experiment's scheduler: FIFO when none was given; anything else is refused with the fix."""
    if scheduler is None:
        return FIFOScheduler()
    if not isinstance(scheduler, TrialScheduler):
        raise TypeError(
            f"scheduler={scheduler!r}: use sweepflow.tune.schedulers.ASHAScheduler(...), MedianStoppingRule(...), "
            "HyperBandScheduler(...), PopulationBasedTraining(...), PB2(...) or FIFOScheduler()"
        )
    return scheduler

__getattr__ = refusing(__name__)  # Ray names not built here: refused with the reason and the fix
