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
from sweepflow.tune.schedulers.hb_bohb import HyperBandForBOHB

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "FIFOScheduler",
    "HyperBandForBOHB",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PB2",
    "PopulationBasedTraining",
    "TrialScheduler",
    "create_scheduler",
    "resolve",
]

#: Ray's names for ``create_scheduler`` -> (module, class); a class that is not built is refused there.
SCHEDULER_NAMES = {
    name: (__name__, cls)
    for name, cls in (
        ("fifo", "FIFOScheduler"),
        ("async_hyperband", "AsyncHyperBandScheduler"),
        ("asynchyperband", "AsyncHyperBandScheduler"),
        ("median_stopping_rule", "MedianStoppingRule"),
        ("medianstopping", "MedianStoppingRule"),
        ("hyperband", "HyperBandScheduler"),
        ("hb_bohb", "HyperBandForBOHB"),
        ("pbt", "PopulationBasedTraining"),
        ("pbt_replay", "PopulationBasedTrainingReplay"),
        ("pb2", "PB2"),
        ("resource_changing", "ResourceChangingScheduler"),
    )
}


def create_scheduler(scheduler: str, **kwargs: Any) -> TrialScheduler:
    """The scheduler Ray's name stands for (``tune.create_scheduler("pbt", ...)``), built with ``kwargs``.

    Differs from Ray: a keyword the scheduler does not take is refused by name (Ray drops it silently).

    Raises:
        ValueError: an unknown name (the known ones listed), or keywords the scheduler does not take.
        NotBuiltError: a scheduler that is not built here (``pbt_replay``, ``resource_changing``).
    """
    from sweepflow.tune.by_name import create_by_ray_name

    return create_by_ray_name("scheduler", scheduler, SCHEDULER_NAMES, kwargs)


def resolve(scheduler: Any) -> TrialScheduler:
    """The experiment's scheduler: FIFO when none was given; anything else is refused with the fix."""
    if scheduler is None:
        return FIFOScheduler()
    if not isinstance(scheduler, TrialScheduler):
        raise TypeError(
            f"scheduler={scheduler!r}: use sweepflow.tune.schedulers.ASHAScheduler(...), MedianStoppingRule(...), "
            "HyperBandScheduler(...), HyperBandForBOHB(...), PopulationBasedTraining(...), PB2(...) or FIFOScheduler()"
        )
    return scheduler

__getattr__ = refusing(__name__)  # Ray names not built here: refused with the reason and the fix
