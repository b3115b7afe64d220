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
    "create_scheduler",
    "resolve",
]

#: Ray's names for ``create_scheduler`` -> the class's name in this module (refused there when not built).
SCHEDULER_NAMES = {
    "fifo": "FIFOScheduler",
    "async_hyperband": "AsyncHyperBandScheduler",
    "asynchyperband": "AsyncHyperBandScheduler",
    "median_stopping_rule": "MedianStoppingRule",
    "medianstopping": "MedianStoppingRule",
    "hyperband": "HyperBandScheduler",
    "hb_bohb": "HyperBandForBOHB",
    "pbt": "PopulationBasedTraining",
    "pbt_replay": "PopulationBasedTrainingReplay",
    "pb2": "PB2",
    "resource_changing": "ResourceChangingScheduler",
}


def create_scheduler(scheduler: str, **kwargs: Any) -> TrialScheduler:
    """The scheduler Ray's name stands for (``tune.create_scheduler("pbt", ...)``), built with ``kwargs``.

    Differs from Ray: a keyword the scheduler does not take is refused by name (Ray drops it silently).

    Raises:
        ValueError: an unknown name (the known ones listed), or keywords the scheduler does not take.
        NotBuiltError: a scheduler that is not built here (``hb_bohb``, ``pbt_replay``, ``resource_changing``).
    """
    return _created("scheduler", scheduler, SCHEDULER_NAMES, __name__, kwargs)


def _created(what: str, name: str, names: dict[str, str], module: str, kwargs: dict[str, Any]) -> Any:
    import importlib
    import inspect

    key = str(name).lower()
    if key not in names:
        raise ValueError(f"tune.create_{what}({name!r}): the name must be one of {list(names)}")
    cls = getattr(importlib.import_module(module), names[key])
    accepted = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            raise ValueError(
                f"tune.create_{what}({name!r}, ...): {cls.__name__} takes no {', '.join(unknown)} (Ray drops such "
                f"keywords silently; here they are refused so a typo is not lost); it takes {', '.join(accepted) or 'none'}"
            )
    return cls(**kwargs)


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
