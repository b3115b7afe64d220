"""Asynchronous successive halving (``ASHAScheduler``, Ray's ``AsyncHyperBandScheduler``).

It mirrors Ray Tune's ``AsyncHyperBandScheduler`` (``stop_last_trials=True``, Ray's default; one bracket by
default, ``brackets=n`` for more) so results and intuitions from Ray transfer: see
``python/ray/tune/schedulers/async_hyperband.py`` (``_Bracket.on_result``/``cutoff``).
"""

from __future__ import annotations

import math
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


def _cutoff(recorded: Mapping[str, float], reduction_factor: float) -> float | None:
    """Value a new arrival at this rung must reach: the (1 - 1/rf) quantile of what was recorded.

    Same as Ray's ``np.nanpercentile(values, (1 - 1/rf) * 100)`` (linear interpolation, NaNs ignored),
    except that when nothing but NaN was recorded it returns ``None`` instead of NaN; both make the
    comparison fail, i.e. CONTINUE, but this way numpy emits no "All-NaN slice" warning.
    """
    values = [v for v in recorded.values() if not math.isnan(v)]
    if not values:
        return None
    return float(np.percentile(values, (1 - 1 / reduction_factor) * 100))


class ASHAScheduler(TrialScheduler):
    """Asynchronous successive halving (ASHA, https://arxiv.org/abs/1810.05934), in one or more brackets.

    Rungs sit at ``grace_period * reduction_factor**k`` time units. The first time a trial's
    ``time_attr`` reaches a rung (the highest one reached, if it skipped some), its metric is
    compared with the ``(1 - 1/reduction_factor)`` quantile of the values recorded at that rung by
    trials that got there earlier, then recorded. It is stopped if strictly worse, so roughly the
    top ``1/reduction_factor`` continue; the first trial at a rung always continues, because nothing
    has been recorded yet -- this asynchrony is what lets ASHA avoid waiting for a full cohort. A
    trial whose ``time_attr`` reaches ``max_t`` is stopped (it is done). These are exactly the
    semantics of Ray Tune's ``ASHAScheduler`` with ``brackets=1``, including its rung count
    ``int(log(max_t / grace_period) / log(reduction_factor) + 1)``: when ``max_t`` is
    ``grace_period * rf**k`` there is a rung at ``max_t`` itself, which never decides anything (a
    result at ``max_t`` is stopped before the rungs are consulted) but receives the final values
    passed to ``on_trial_complete``.

    With ``brackets=n`` (Ray's asynchronous HyperBand), bracket ``s`` (0..n-1) has its rungs at
    ``grace_period * reduction_factor**(k + s)``, ``int(log(max_t / grace_period) / log(reduction_factor) - s + 1)``
    of them (Ray's count), so a trial in a higher bracket gets longer before its first decision. Each trial is
    dealt to a bracket when added, at random with probabilities ``softmax(number of rungs)`` drawn from NumPy's
    global random state, as in Ray (seed ``np.random`` for the same deal); a trial is compared only with the trials
    of its own bracket.

    Unlike Ray, which silently returns CONTINUE, a result without the metric or time attribute
    raises ``ValueError``: a misspelled metric would otherwise silently disable early stopping.
    A NaN metric is recorded and continues, as in Ray (NaN is neither better nor worse).
    """

    stop_reason = "ASHA"  # how a trial it stopped is labelled (runs table, report, CLI)

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
        """Ray Tune's arguments and defaults. ``metric``/``mode`` may come later from the experiment
        (``set_search_properties``); every number is checked now, before any trial runs."""
        super().__init__()
        if metric is not None and (not isinstance(metric, str) or not metric):
            raise ValueError(
                f"ASHAScheduler: metric must be the non-empty name of a reported metric, got {metric!r}"
            )
        self._check_time_attr_and_mode(time_attr, mode)
        if isinstance(brackets, bool) or not isinstance(brackets, int) or brackets < 1:
            raise ValueError(f"ASHAScheduler(brackets={brackets!r}): the number of brackets, an integer >= 1")
        if stop_last_trials is not True:
            raise ValueError(
                f"ASHAScheduler(stop_last_trials={stop_last_trials!r}): a trial always stops at max_t here; "
                "leave stop_last_trials=True and raise max_t to train longer"
            )
        for name, value in (
            ("max_t", max_t),
            ("grace_period", grace_period),
            ("reduction_factor", reduction_factor),
        ):
            if not _is_number(value) or not math.isfinite(value):
                raise ValueError(f"ASHAScheduler: {name} must be a finite number, got {value!r}")
        if grace_period < 1:
            raise ValueError(
                f"ASHAScheduler: grace_period must be >= 1 (the earliest {time_attr} at which a trial "
                f"may be stopped), got {grace_period}"
            )
        if max_t < grace_period:
            raise ValueError(
                f"ASHAScheduler: max_t must be >= grace_period, got max_t={max_t}, grace_period={grace_period}; "
                f"raise max_t or lower grace_period"
            )
        if reduction_factor <= 1:
            raise ValueError(
                f"ASHAScheduler: reduction_factor must be > 1 (it keeps about 1/reduction_factor of the "
                f"trials at each rung; 2, 3 or 4 are usual), got {reduction_factor}"
            )
        self.metric = metric
        self.mode = mode
        self.max_t = max_t
        self.grace_period = grace_period
        self.reduction_factor = reduction_factor
        self.time_attr = time_attr

        self.brackets = brackets
        self._brackets = [self._bracket(s) for s in range(brackets)]
        self._rungs = self._brackets[0]  # bracket 0: the one bracket of brackets=1 (milestones, cutoffs)
        self._bracket_of: dict[str, list[tuple[float, dict[str, float]]]] = {}  # trial id -> its bracket's rungs
        self._live: set[str] = set()
        self._num_stopped = 0

    def _bracket(self, s: int) -> list[tuple[float, dict[str, float]]]:
        """Bracket ``s``'s rungs, highest first (so the first milestone <= a trial's time is the highest it
        reached), each with the values recorded there. Ray's count, float rounding included (np.log, int
        truncation), so the rungs match exactly."""
        rf = self.reduction_factor
        num_rungs = int(np.log(self.max_t / self.grace_period) / np.log(rf) - s + 1)
        return [(self.grace_period * rf ** (k + s), {}) for k in reversed(range(num_rungs))]

    def set_search_properties(self, metric: str | None, mode: str | None) -> None:
        """The experiment's metric/mode fill what the scheduler was built without; two different ones are
        refused (as in Ray), since only one of them could be used."""
        own = (self.metric, self.mode)
        self.metric, self.mode = merge_search_properties("ASHAScheduler", own, (metric, mode))

    @property
    def _sign(self) -> float:
        """Internally the metric is maximised (Ray's metric_op): min-mode values are negated."""
        if self.metric is None or self.mode is None:
            self.set_search_properties(None, None)  # raises, with the fix
        return 1.0 if self.mode == "max" else -1.0

    @property
    def milestones(self) -> list[float]:
        """Bracket 0's rung milestones in ascending order, e.g. ``[1, 2, 4]`` for grace 1, rf 2, max_t 4.

        Only milestones below ``max_t`` can stop a trial; see the class docstring.
        """
        return [m for m, _ in reversed(self._rungs)]

    def _time_and_value(self, trial_id: str, result: Mapping[str, Any]) -> tuple[float, float]:
        sign = self._sign  # raises when no metric/mode was ever given
        for key in (self.metric, self.time_attr):
            if key not in result:
                raise ValueError(
                    f"ASHAScheduler: result for trial {trial_id!r} has no {key!r}; reported keys: "
                    f"{sorted(result)}. Report {key!r} or configure the scheduler with the name that is reported"
                )
        try:
            value = float(result[self.metric])
            time = float(result[self.time_attr])
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"ASHAScheduler: trial {trial_id!r} reported non-numeric {self.metric!r}="
                f"{result[self.metric]!r} or {self.time_attr!r}={result[self.time_attr]!r}"
            ) from exc
        return time, sign * value

    def _record(self, trial_id: str, time: float, value: float) -> Decision:
        """Ray's ``_Bracket.on_result``: decide at (and record into) the highest rung of the trial's bracket
        reached, once."""
        action = CONTINUE
        for milestone, recorded in self._bracket_of[trial_id]:
            if time < milestone or trial_id in recorded:
                continue
            cutoff = _cutoff(recorded, self.reduction_factor)
            if cutoff is not None and value < cutoff:
                action = STOP
            recorded[trial_id] = value
            break
        return action

    def on_trial_add(self, trial_id: str) -> None:
        """Register a new trial.

        Raises:
            ValueError: the trial id was added before (ids must be unique).
        """
        with self._lock:
            if trial_id in self._live:
                raise ValueError(
                    f"ASHAScheduler: trial {trial_id!r} was added twice; trial ids must be unique"
                )
            self._live.add(trial_id)
            if len(self._brackets) == 1:
                self._bracket_of[trial_id] = self._brackets[0]
            else:  # Ray's deal: softmax over the brackets' rung counts, from NumPy's global random state
                sizes = np.array([len(rungs) for rungs in self._brackets])
                weights = np.e ** (sizes - sizes.max())
                self._bracket_of[trial_id] = self._brackets[np.random.choice(len(sizes), p=weights / weights.sum())]

    def bracket_of(self, trial_id: str) -> int:
        """The bracket (0..brackets-1) trial ``trial_id`` was dealt to."""
        with self._lock:
            return next(i for i, rungs in enumerate(self._brackets) if rungs is self._bracket_of[trial_id])

    def on_trial_result(self, trial_id: str, result: Mapping[str, Any]) -> Decision:
        """``STOP`` at ``max_t`` or when the result falls below its rung's cutoff, else ``CONTINUE`` (see the
        class docstring).

        Raises:
            ValueError: the result lacks the numeric metric or ``time_attr`` (Ray would silently continue), or
                the trial was never added or has already ended.
        """
        time, value = self._time_and_value(trial_id, result)
        with self._lock:
            if trial_id not in self._live:
                raise ValueError(
                    f"ASHAScheduler: result for unknown trial {trial_id!r}; call on_trial_add first "
                    f"(and no results after on_trial_complete/on_trial_error)"
                )
            if time >= self.max_t:
                action = STOP
            else:
                action = self._record(trial_id, time, value)
            if action == STOP:
                self._num_stopped += 1
            return action

    def on_trial_complete(self, trial_id: str, result: Mapping[str, Any] | None) -> None:
        """Record the final result (as Ray does) so later trials are compared against it too.

        This matters when the final report reached a rung the trial was never recorded at, notably
        a trial stopped at ``max_t``. ``result=None`` (nothing reported) records nothing.
        """
        parsed = self._time_and_value(trial_id, result) if result is not None else None
        with self._lock:
            if trial_id not in self._live:
                raise ValueError(
                    f"ASHAScheduler: on_trial_complete for unknown or finished trial {trial_id!r}"
                )
            if parsed is not None:
                self._record(trial_id, *parsed)
            self._live.discard(trial_id)

    def on_trial_error(self, trial_id: str) -> None:
        """Forget the trial; what it recorded at rungs stays, as in Ray (those values were real)."""
        with self._lock:
            self._live.discard(trial_id)

    def rung_cutoffs(self, bracket: int = 0) -> dict[float, float | None]:
        """Current cutoff per milestone of ``bracket``, in the metric's own sign (for logging)."""
        with self._lock:
            return {milestone: self._shown_cutoff(rec) for milestone, rec in reversed(self._brackets[bracket])}

    def debug_string(self) -> str:
        """The stopped count and each bracket's rungs: milestone, size and current cutoff."""
        with self._lock:
            shown = []
            for i, bracket in enumerate(self._brackets):
                rungs = " | ".join(
                    f"t={m:g}: n={len(rec)} cutoff={self._shown_cutoff(rec)}" for m, rec in reversed(bracket)
                )
                shown.append(rungs if len(self._brackets) == 1 else f"bracket {i}: {rungs}")
            return f"ASHAScheduler({self.metric}, {self.mode}): num_stopped={self._num_stopped}; " + "; ".join(shown)

    def _shown_cutoff(self, recorded: Mapping[str, float]) -> float | None:
        cutoff = _cutoff(recorded, self.reduction_factor)
        return None if cutoff is None else self._sign * cutoff

    def __repr__(self) -> str:
        return (
            f"ASHAScheduler(metric={self.metric!r}, mode={self.mode!r}, max_t={self.max_t}, "
            f"grace_period={self.grace_period}, reduction_factor={self.reduction_factor}"
            + (f", brackets={self.brackets})" if self.brackets != 1 else ")")
        )


#: Ray's other name for the same algorithm (``ASHAScheduler`` is its alias there).
AsyncHyperBandScheduler = ASHAScheduler
