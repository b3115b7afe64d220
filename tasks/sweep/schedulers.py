"""Trial schedulers built from plain data (``make_scheduler``), so that they can be deployment parameters, and the
names the rest of the sweep imports them by. Each scheduler lives in a module of its own: ``fifo``, ``asha``,
``median_stopping`` (and ``hyperband``, ``pbt``, ``pb2``); what they share is ``trial_scheduler``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sweepflow.tasks.sweep.asha import ASHAScheduler, AsyncHyperBandScheduler
from sweepflow.tasks.sweep.fifo import FIFOScheduler
from sweepflow.tasks.sweep.median_stopping import MedianStoppingRule
from sweepflow.tasks.sweep.trial_scheduler import (
    CONTINUE,
    STOP,
    Decision,
    TrialScheduler,
    merge_search_properties,
)

__all__ = ["Decision", "CONTINUE", "STOP", "ASHAScheduler", "AsyncHyperBandScheduler", "FIFOScheduler",
           "MedianStoppingRule", "TrialScheduler", "make_scheduler", "merge_search_properties"]  # fmt: skip


_ASHA_KEYS = ("metric", "mode", "max_t", "grace_period", "reduction_factor", "time_attr")


def make_scheduler(config: Mapping[str, Any] | None) -> TrialScheduler:
    """Build a scheduler from deployment-parameter data.

    ``None`` or ``{"type": "fifo"}`` gives :class:`FIFOScheduler`; ``{"type": "asha", "metric":
    "val_loss", "mode": "min", "max_t": 10, ...}`` gives :class:`ASHAScheduler` with those keyword
    arguments. Unknown keys are rejected, so a typo such as ``"grace": 2`` is not silently ignored.
    """
    if config is None:
        return FIFOScheduler()
    if not isinstance(config, Mapping):
        raise ValueError(f"scheduler config must be a dict like {{'type': 'fifo'}} or None, got {config!r}")
    kind = config.get("type")
    params = {k: v for k, v in config.items() if k != "type"}
    if kind == "fifo":
        if params:
            raise ValueError(f"scheduler 'fifo' takes no parameters, got {sorted(params)}")
        return FIFOScheduler()
    if kind in ("asha", "async_hyperband"):
        unknown = sorted(set(params) - set(_ASHA_KEYS))
        if unknown:
            raise ValueError(f"scheduler 'asha': unknown keys {unknown}; valid keys: {list(_ASHA_KEYS)}")
        missing = [k for k in ("metric", "mode", "max_t") if k not in params]
        if missing:
            raise ValueError(
                f"scheduler 'asha' needs {missing}; e.g. "
                f'{{"type": "asha", "metric": "val_loss", "mode": "min", "max_t": 10}}'
            )
        return ASHAScheduler(**params)
    raise ValueError(f"unknown scheduler type {kind!r}; valid types: 'fifo', 'asha'")
