"""Synchronous HyperBand (Li et al., 2016, https://arxiv.org/abs/1603.06560) with Ray Tune's arguments.

Trials are dealt into brackets as they start. Bracket ``s`` (0, 1, ...: the first bracket of each band runs its
trials straight to ``max_t``) holds up to ``ceil(s_max_1 / (s + 1) * eta**s)`` trials that first train for
``max_t / eta**s`` of ``time_attr``. Once every trial of a bracket has reached that milestone (or ended), the best
``1/eta`` of them go on for ``eta`` times longer and the others are stopped; and so on until ``max_t``. Bands of
``s_max_1 = int(log(max_t) / log(eta)) + 1`` brackets repeat while trials keep coming. The same bracket sizes and
milestones as Ray's ``HyperBandScheduler``.

A trial that reaches its bracket's milestone before the others *pauses*: its group stops (its latest checkpoint is
where it goes on from) and it gives its slot back, so the bracket's other trials can start; when the bracket is
decided it is told to go on (and waits for a slot, ahead of trials that have not started) or that it is stopped
(:meth:`wait_to_resume`). A trial paused without a checkpoint starts over: report checkpoints (a class trainable
is checkpointed every step under HyperBand).

Pure Python + numpy, like the other schedulers; every method may be called from any trial's thread.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sweepflow.tasks.sweep.trial_scheduler import (
    CONTINUE,
    STOP,
    Decision,
    TrialScheduler,
    merge_search_properties,
)

__all__ = ["HyperBandScheduler"]


@dataclass
class _Bracket:
    """One bracket: its trials' latest results, the current milestone and how many halvings are left."""

    size: int  # how many trials it takes (n0)
    milestone: float  # r: the time every live trial trains to before the bracket is decided
    halvings: int  # s: decisions left before the survivors train to max_t
    max_t: float
    eta: float
    members: list[str] = field(default_factory=list)
    live: dict[str, float] = field(default_factory=dict)  # trial -> its latest time
    scores: dict[str, float] = field(default_factory=dict)  # trial -> its latest signed metric

    def full(self) -> bool:
        return len(self.members) >= self.size

    def everyone_there(self) -> bool:
        return all(t >= self.milestone for t in self.live.values())

    def halve(self) -> tuple[list[str], list[str]]:
        """(go on, stopped): the best ceil(n / eta) live trials go on to the next milestone."""
        self.halvings -= 1
        keep = int(math.ceil(len(self.live) / self.eta))
        self.milestone = min(self.milestone * self.eta, self.max_t)
        ranked = sorted(self.live, key=lambda tid: self.scores.get(tid, -math.inf), reverse=True)
        return ranked[:keep], ranked[keep:]


class HyperBandScheduler(TrialScheduler):
    """Ray Tune's synchronous ``HyperBandScheduler(time_attr, metric, mode, max_t, reduction_factor,
    stop_last_trials)``."""

    stop_reason = "HyperBand"

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: int = 81,
        reduction_factor: float = 3,
        stop_last_trials: bool = True,
    ) -> None:
        super().__init__()
        self._check_time_attr_and_mode(time_attr, mode)
        if isinstance(max_t, bool) or not isinstance(max_t, int | float) or max_t < 1:
            raise ValueError(f"HyperBandScheduler: max_t must be >= 1 (in units of {time_attr!r}), got {max_t!r}")
        if isinstance(reduction_factor, bool) or not isinstance(reduction_factor, int | float) or reduction_factor <= 1:
            raise ValueError(
                f"HyperBandScheduler: reduction_factor must be > 1 (it keeps 1/reduction_factor of a bracket at "
                f"each milestone; 3 is usual), got {reduction_factor!r}"
            )
        if stop_last_trials is not True:
            raise ValueError(
                "HyperBandScheduler(stop_last_trials=False) lets the survivors train past max_t; here a trial "
                "always stops at max_t: leave stop_last_trials=True and raise max_t to train longer"
            )
        self.time_attr, self.metric, self.mode = time_attr, metric, mode
        self.max_t = max_t
        self.eta = float(reduction_factor)
        self.s_max_1 = int(np.round(np.log(max_t) / np.log(self.eta))) + 1
        self._cond = threading.Condition(self._lock)
        self._bands: list[list[_Bracket]] = [[]]
        self._bracket_of: dict[str, _Bracket] = {}
        self._verdicts: dict[str, Decision] = {}  # paused trial -> CONTINUE / STOP once its bracket is decided
        self.num_stopped = 0

    def checkpoint_every(self) -> int | None:
        """1: a trial must checkpoint every report, since a paused trial goes on from its latest checkpoint.
        """
        return 1  # a paused trial resumes from its latest checkpoint

    def set_search_properties(self, metric: str | None, mode: str | None) -> None:
        """Fill in the experiment's metric and mode where the scheduler was built without them.

        Raises:
            ValueError: they differ from the ones the scheduler was given, or neither has them.
        """
        own = (self.metric, self.mode)
        self.metric, self.mode = merge_search_properties("HyperBandScheduler", own, (metric, mode))

    # --------------------------------------------------------------------------------- brackets

    def _new_bracket(self) -> _Bracket:
        band = self._bands[-1]
        while True:
            if len(band) == self.s_max_1:
                band = []
                self._bands.append(band)
            s = len(band)
            size = int(math.ceil(self.s_max_1 / (s + 1) * self.eta**s))
            first = int(self.max_t * self.eta ** (-s))
            if first > 0:
                bracket = _Bracket(size=size, milestone=first, halvings=s, max_t=self.max_t, eta=self.eta)
                band.append(bracket)
                return bracket
            band.append(None)  # type: ignore[arg-type]  # too small a milestone: skipped, as in Ray

    def _current(self) -> _Bracket:
        band = [b for band in self._bands for b in band if b is not None]
        if band and not band[-1].full():
            return band[-1]
        return self._new_bracket()

    def brackets(self) -> list[tuple[int, float, int]]:
        """(size, current milestone, trials in it) of every bracket so far, for logging and tests."""
        with self._lock:
            return [(b.size, b.milestone, len(b.members)) for band in self._bands for b in band if b is not None]

    # --------------------------------------------------------------------------------- the scheduler's calls

    def on_trial_add(self, trial_id: str) -> None:
        """Put a new trial in the current bracket (a trial going on after a pause stays in its own)."""
        with self._lock:
            if trial_id in self._bracket_of:  # it goes on after a pause: same bracket
                return
            bracket = self._current()
            bracket.members.append(trial_id)
            bracket.live[trial_id] = 0.0
            self._bracket_of[trial_id] = bracket
            self._decide_ready()  # the last trial is here: a bracket it did not join may be decided now

    def _point(self, trial_id: str, result: Mapping[str, Any]) -> tuple[float, float]:
        if self.metric is None or self.mode is None:
            self.set_search_properties(None, None)  # raises, with the fix
        for key in (self.time_attr, self.metric):
            value = result.get(key)  # type: ignore[arg-type]
            if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
                raise ValueError(
                    f"HyperBandScheduler: result for trial {trial_id!r} has no numeric {key!r}; reported keys: "
                    f"{sorted(result)}. Report it or configure the scheduler with a name that is reported"
                )
        sign = 1.0 if self.mode == "max" else -1.0
        return float(result[self.time_attr]), sign * float(result[self.metric])  # type: ignore[index]

    def on_trial_result(self, trial_id: str, result: Mapping[str, Any]) -> Decision:
        """CONTINUE below the bracket's milestone; at it, PAUSE until the others get there (then the last one to
        arrive is told whether it goes on), or STOP at ``max_t``."""
        time_, score = self._point(trial_id, result)
        with self._cond:
            bracket = self._bracket_of[trial_id]
            if trial_id not in bracket.live:
                return STOP  # stopped by its bracket's decision while this report was on its way
            bracket.live[trial_id], bracket.scores[trial_id] = time_, score
            if time_ >= self.max_t:
                return STOP  # done (at max_t it is complete, not pruned)
            if time_ < bracket.milestone:
                return CONTINUE
            if not (bracket.full() or self._all_added()) or not bracket.everyone_there():
                return Decision.PAUSE
            self._decide(bracket)
            return self._verdicts.pop(trial_id)

    def _decide(self, bracket: _Bracket) -> None:
        """Every live trial of ``bracket`` is at its milestone: halve it, and give each trial its verdict."""
        go_on, stopped = bracket.halve() if bracket.halvings > 0 else ([], list(bracket.live))
        for tid in stopped:
            bracket.live.pop(tid, None)
            self._verdicts[tid] = STOP
        self.num_stopped += len(stopped)
        for tid in go_on:
            self._verdicts[tid] = CONTINUE
        self._cond.notify_all()

    def wait_to_resume(self, trial_id: str, give_up: Callable[[], bool]) -> Decision:
        """For a paused trial: block until its bracket is decided; CONTINUE (it goes on from its checkpoint) or
        STOP. ``give_up()`` true (the sweep is stopping) ends the wait with STOP."""
        with self._cond:
            while trial_id not in self._verdicts:
                if give_up():
                    return STOP
                self._cond.wait(timeout=0.5)
            return self._verdicts.pop(trial_id)

    _total: int | None = None  # how many trials the sweep starts in all, once it knows

    def _all_added(self) -> bool:
        return self._total is not None and len(self._bracket_of) >= self._total

    def no_more_trials(self, total: int) -> None:
        """The sweep starts no trial after its ``total``-th: once they are all here, a bracket that will never be
        full is decided with the trials it has."""
        with self._cond:
            self._total = total
            self._decide_ready()

    def _decide_ready(self) -> None:
        for band in self._bands:
            for bracket in band:
                if bracket is None or not bracket.live or not (bracket.full() or self._all_added()):
                    continue
                waiting = [tid for tid in bracket.live if tid not in self._verdicts]
                if waiting and bracket.everyone_there() and all(bracket.live[t] < self.max_t for t in waiting):
                    self._decide(bracket)

    def _end(self, trial_id: str) -> None:
        with self._cond:
            bracket = self._bracket_of.get(trial_id)
            if bracket is not None:
                bracket.live.pop(trial_id, None)
            self._verdicts.pop(trial_id, None)
            self._decide_ready()  # the others may have been waiting only for this one
            self._cond.notify_all()

    def on_trial_complete(self, trial_id: str, result: Mapping[str, Any] | None) -> None:
        """The trial leaves its bracket, which may now be decided for the trials waiting in it."""
        self._end(trial_id)

    def on_trial_error(self, trial_id: str) -> None:
        """The trial leaves its bracket, which may now be decided for the trials waiting in it."""
        self._end(trial_id)

    def debug_string(self) -> str:
        """The stopped count and every bracket's (size, milestone, trials in it)."""
        return f"HyperBandScheduler: {self.num_stopped} stopped; brackets {self.brackets()}"

    def __repr__(self) -> str:
        return (
            f"HyperBandScheduler(time_attr={self.time_attr!r}, metric={self.metric!r}, mode={self.mode!r}, "
            f"max_t={self.max_t}, reduction_factor={self.eta:g})"
        )
