"""The median stopping rule (``MedianStoppingRule``, Ray Tune's, with its arguments)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sweepflow.tasks.sweep.trial_scheduler import (
    CONTINUE,
    STOP,
    Decision,
    TrialScheduler,
    _is_number,
    merge_search_properties,
)


class MedianStoppingRule(TrialScheduler):
    """The median stopping rule (Golovin et al., "Google Vizier", 2017), with Ray Tune's arguments: once a trial's
    ``time_attr`` reaches ``grace_period``, it is stopped when its best ``metric`` so far is worse than the median,
    over the other trials that got at least as far, of their running means up to the same ``time_attr``, provided
    at least ``min_samples_required`` such trials exist. Stopped trials are not paused and resumed here
    (``hard_stop=False`` and ``min_time_slice`` are refused). Ray's defaults count wall-clock seconds
    (``time_attr="time_total_s"``, ``grace_period=60``), which reports here do not carry: the defaults count
    reports instead (``training_iteration``, from the first); pass ``time_attr`` for another reported counter."""

    stop_reason = "median stopping rule"

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        grace_period: float = 1,
        min_samples_required: int = 3,
        min_time_slice: float = 0,
        hard_stop: bool = True,
    ) -> None:
        super().__init__()
        self._check_time_attr_and_mode(time_attr, mode)
        if not _is_number(grace_period) or grace_period < 0:
            raise ValueError(f"MedianStoppingRule: grace_period must be a number >= 0, got {grace_period!r}")
        if isinstance(min_samples_required, bool) or not isinstance(min_samples_required, int) or min_samples_required < 1:
            raise ValueError(
                f"MedianStoppingRule: min_samples_required must be an integer >= 1, got {min_samples_required!r}"
            )
        if hard_stop is not True:
            raise ValueError(
                "MedianStoppingRule(hard_stop=False) pauses trials to resume them later; trials here are stopped or "
                "go on: leave hard_stop=True"
            )
        if min_time_slice:
            raise ValueError(
                f"MedianStoppingRule(min_time_slice={min_time_slice!r}) spaces out pausing, which trials here do "
                "not do: leave min_time_slice=0"
            )
        self.time_attr, self.metric, self.mode = time_attr, metric, mode
        self.grace_period, self.min_samples_required = grace_period, min_samples_required
        self._history: dict[str, list[tuple[float, float]]] = {}  # trial -> (time, signed value), in order
        self._live: set[str] = set()

    def set_search_properties(self, metric: str | None, mode: str | None) -> None:
        """Fill in the experiment's metric and mode where the rule was built without them.

        Raises:
            ValueError: they differ from the ones the rule was given, or neither has them.
        """
        self.metric, self.mode = merge_search_properties("MedianStoppingRule", (self.metric, self.mode), (metric, mode))

    def _point(self, trial_id: str, result: Mapping[str, Any]) -> tuple[float, float]:
        if self.metric is None or self.mode is None:
            self.set_search_properties(None, None)  # raises, with the fix
        for key in (self.metric, self.time_attr):
            if key not in result or not _is_number(result[key]):
                raise ValueError(
                    f"MedianStoppingRule: result for trial {trial_id!r} has no numeric {key!r}; reported keys: "
                    f"{sorted(result)}. Report {key!r} or configure the scheduler with the name that is reported"
                )
        sign = 1.0 if self.mode == "max" else -1.0
        return float(result[self.time_attr]), sign * float(result[self.metric])

    def _running_mean(self, trial_id: str, time: float) -> float:
        values = [v for t, v in self._history[trial_id] if t <= time]
        return sum(values) / len(values)

    def on_trial_add(self, trial_id: str) -> None:
        """Register the trial (a trial going on keeps its history)."""
        with self._lock:
            self._live.add(trial_id)
            self._history.setdefault(trial_id, [])

    def on_trial_result(self, trial_id: str, result: Mapping[str, Any]) -> Decision:
        """``STOP`` when the trial's best value is worse than the median of the others' running means at the
        same time, else ``CONTINUE`` (see the class docstring).

        Raises:
            ValueError: the result lacks the numeric metric or ``time_attr``, or no metric/mode was ever
                given.
        """
        time, value = self._point(trial_id, result)
        with self._lock:
            self._history.setdefault(trial_id, []).append((time, value))
            if time < self.grace_period:
                return CONTINUE
            others = [
                other
                for other, points in self._history.items()
                if other != trial_id and points and points[-1][0] >= time
            ]
            if len(others) < self.min_samples_required:
                return CONTINUE
            median = float(np.median([self._running_mean(other, time) for other in others]))
            best = max(v for _, v in self._history[trial_id])
            return STOP if best < median else CONTINUE

    def on_trial_complete(self, trial_id: str, result: Mapping[str, Any] | None) -> None:
        """The trial is no longer live; its results stay, and later trials are compared with them."""
        with self._lock:
            self._live.discard(trial_id)  # its results stay: later trials are compared with them

    def on_trial_error(self, trial_id: str) -> None:
        """The trial is no longer live; its results stay."""
        with self._lock:
            self._live.discard(trial_id)

    def __repr__(self) -> str:
        return (
            f"MedianStoppingRule(time_attr={self.time_attr!r}, metric={self.metric!r}, mode={self.mode!r}, "
            f"grace_period={self.grace_period}, min_samples_required={self.min_samples_required})"
        )
