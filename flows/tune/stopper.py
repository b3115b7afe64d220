"""Ray Tune's stoppers: ``tune.run(stop=...)`` / ``RunConfig(stop=...)`` takes a dict, a function
``fn(trial_id, result) -> bool`` or a ``Stopper``.

A stopper is asked after every report of every trial, in the flow's process (it sees the reports in the order
they arrive, as in Ray): ``stopper(trial_id, result)`` True completes that trial (it counts as ended, not
pruned); ``stopper.stop_all()`` True ends the experiment (the running trials stop at their next report, none
starts; the stopped runs end FINISHED, not KILLED).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any


class Stopper:
    """Subclass and define ``__call__(trial_id, result) -> bool`` (stop this trial) and, optionally,
    ``stop_all() -> bool`` (stop the experiment)."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        raise NotImplementedError(f"{type(self).__name__} must define __call__(self, trial_id, result) -> bool")

    def stop_all(self) -> bool:
        """Whether to end the whole experiment, asked after every report; the default never does."""
        return False


class NoopStopper(Stopper):
    """A stopper that never stops anything (Ray's ``NoopStopper``)."""
    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False


class FunctionStopper(Stopper):
    """A function ``fn(trial_id, result) -> bool`` as a stopper."""

    def __init__(self, function: Callable[[str, dict[str, Any]], bool]) -> None:
        if not callable(function):
            raise TypeError(f"FunctionStopper(function): function must be fn(trial_id, result) -> bool, got {function!r}")
        self._function = function

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return bool(self._function(trial_id, result))


class CombinedStopper(Stopper):
    """Stops a trial when any of its stoppers does; the experiment when any of them does."""

    def __init__(self, *stoppers: Stopper) -> None:
        for stopper in stoppers:
            if not isinstance(stopper, Stopper):
                raise TypeError(f"CombinedStopper(*stoppers): {stopper!r} is not a tune.Stopper")
        self._stoppers = stoppers

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        # Every stopper sees every report (a plateau stopper keeps a window), so no short-circuit.
        return any([stopper(trial_id, result) for stopper in self._stoppers])

    def stop_all(self) -> bool:
        """True when any of the stoppers would end the experiment."""
        return any(stopper.stop_all() for stopper in self._stoppers)


class MaximumIterationStopper(Stopper):
    """Completes a trial at its ``max_iter``-th report."""

    def __init__(self, max_iter: int) -> None:
        if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"MaximumIterationStopper(max_iter): give an integer >= 1, got {max_iter!r}")
        self.max_iter = max_iter

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return int(result.get("training_iteration", 0)) >= self.max_iter


def _metric_value(stopper: str, metric: str, result: dict[str, Any]) -> float:
    if metric not in result:
        reported = sorted(result)
        raise ValueError(f"{stopper}: the trial's report has no {metric!r} (it has {reported}); report it or stop by one of those")
    return float(result[metric])


class TrialPlateauStopper(Stopper):
    """Completes a trial whose ``metric`` stopped moving: after ``grace_period`` reports, when the standard
    deviation of its last ``num_results`` values is below ``std`` (and, with ``metric_threshold``, the latest
    value is better than the threshold for ``mode``)."""

    def __init__(
        self,
        metric: str,
        std: float = 0.01,
        num_results: int = 4,
        grace_period: int = 4,
        metric_threshold: float | None = None,
        mode: str | None = None,
    ) -> None:
        if metric_threshold is not None and mode not in ("min", "max"):
            raise ValueError("TrialPlateauStopper(metric_threshold=...): give mode='min' or mode='max' with it")
        if num_results < 1 or grace_period < 0 or std < 0:
            raise ValueError("TrialPlateauStopper: num_results >= 1, grace_period >= 0 and std >= 0")
        self.metric, self.std, self.num_results, self.grace_period = metric, std, num_results, grace_period
        self.metric_threshold, self.mode = metric_threshold, mode
        self._window: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=num_results))
        self._count: dict[str, int] = defaultdict(int)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = _metric_value("TrialPlateauStopper", self.metric, result)
        window = self._window[trial_id]
        window.append(value)
        self._count[trial_id] += 1
        if self._count[trial_id] < self.grace_period or len(window) < self.num_results:
            return False
        if self.metric_threshold is not None:
            good = value < self.metric_threshold if self.mode == "min" else value > self.metric_threshold
            if not good:
                return False
        mean = sum(window) / len(window)
        return math.sqrt(sum((v - mean) ** 2 for v in window) / len(window)) < self.std


class ExperimentPlateauStopper(Stopper):
    """Ends the experiment when the best ``top`` values of ``metric`` reported so far stopped moving: their
    standard deviation below ``std`` for ``patience`` reports in a row."""

    def __init__(self, metric: str, std: float = 0.001, top: int = 10, mode: str = "min", patience: int = 0) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"ExperimentPlateauStopper(mode=...): 'min' or 'max', got {mode!r}")
        if top < 2:
            raise ValueError("ExperimentPlateauStopper(top=...): give at least 2 (a deviation needs two values)")
        self.metric, self.std, self.top, self.mode, self.patience = metric, std, top, mode, patience
        self._best: list[float] = []
        self._flat = 0

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = _metric_value("ExperimentPlateauStopper", self.metric, result)
        self._best = sorted([*self._best, value], reverse=self.mode == "max")[: self.top]
        if len(self._best) == self.top:
            mean = sum(self._best) / self.top
            flat = math.sqrt(sum((v - mean) ** 2 for v in self._best) / self.top) <= self.std
            self._flat = self._flat + 1 if flat else 0
        return False

    def stop_all(self) -> bool:
        """True once the ``top`` best values have stayed within ``std`` for more than ``patience`` reports in
        a row.
        """
        return len(self._best) == self.top and self._flat > self.patience


class TimeoutStopper(Stopper):
    """Ends the experiment ``timeout`` seconds (or a ``datetime.timedelta``) after its first report."""

    def __init__(self, timeout: Any) -> None:
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
            raise ValueError(f"TimeoutStopper(timeout): seconds > 0 or a timedelta, got {timeout!r}")
        self.timeout_s = float(seconds)
        self._started: float | None = None

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if self._started is None:
            self._started = time.monotonic()
        return False

    def stop_all(self) -> bool:
        """True once ``timeout`` has passed since the first report the stopper saw."""
        return self._started is not None and time.monotonic() - self._started >= self.timeout_s


def max_reports(stop: Any) -> int:
    """The report count at which ``stop`` completes every trial, when it says so (0: it does not)."""
    if isinstance(stop, dict) and "training_iteration" in stop:
        return int(stop["training_iteration"])
    if isinstance(stop, MaximumIterationStopper):
        return stop.max_iter
    if isinstance(stop, CombinedStopper):
        bounds = [max_reports(s) for s in stop._stoppers if max_reports(s)]
        return min(bounds) if bounds else 0
    return 0
