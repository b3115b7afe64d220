"""Trial schedulers: decide, on every reported result, whether a running trial should go on.

The sweep driver runs several trials concurrently (one thread per trial, each driving a Dask DDP
worker group) and calls one shared scheduler from all of them, so every scheduler here guards its
state with a lock. The decision is returned as the string :data:`CONTINUE` or :data:`STOP`.

:class:`ASHAScheduler` mirrors Ray Tune's ``AsyncHyperBandScheduler`` with a single bracket
(``brackets=1``, ``stop_last_trials=True``, Ray's defaults) so results and intuitions from Ray
transfer: see ``python/ray/tune/schedulers/async_hyperband.py`` (``_Bracket.on_result``/``cutoff``).

Like :mod:`sweepflow.tasks.sweep.space`, this module is pure Python + numpy (no Prefect, MLflow, torch or
Dask), and schedulers are built from plain data with :func:`make_scheduler` so that they can be
deployment parameters.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ._str_enum import StrEnum

__all__ = ["Decision", "CONTINUE", "STOP", "ASHAScheduler", "AsyncHyperBandScheduler", "FIFOScheduler",
           "TrialScheduler", "make_scheduler"]  # fmt: skip

class Decision(StrEnum):
    """A scheduler's answer to a trial's report."""

    CONTINUE = "CONTINUE"
    STOP = "STOP"  # prune it (or, at the scheduler's max_t, it is done)
    DONE = "DONE"  # it met a stop criterion (e.g. Tune's ``stop={...}``): complete, not pruned
    STOP_ALL = "STOP_ALL"  # it is complete, and so is the sweep: the others stop, none starts (Stopper.stop_all)
    EXPLOIT = "EXPLOIT"  # PBT: continue from another trial's checkpoint with a new config (``take_exploit``)
    PAUSE = "PAUSE"  # stop the group, give the slot back, and ask ``wait_to_resume`` whether to go on (HyperBand)


CONTINUE, STOP = Decision.CONTINUE, Decision.STOP


def merge_search_properties(
    owner: str, own: tuple[str | None, str | None], given: tuple[str | None, str | None]
) -> tuple[str, str]:
    """The metric and mode a scheduler or search algorithm (``owner``) uses: its own, else the experiment's
    (``given``, from tune.run / TuneConfig). Both given and different is refused (as in Ray: only one could be
    used), and so is neither (nothing to compare trials by); each error names the fix."""
    if given[1] not in (None, "min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {given[1]!r}")
    for name, mine, theirs in zip(("metric", "mode"), own, given, strict=True):
        if mine is not None and theirs is not None and mine != theirs:
            raise ValueError(
                f"{owner}({name}={mine!r}) and the experiment's {name}={theirs!r} differ: give {name} "
                "to the scheduler or search algorithm, or to tune.run / TuneConfig, not both"
            )
    metric, mode = own[0] or given[0], own[1] or given[1]
    if not metric or not mode:
        raise ValueError(
            f"{owner} needs the metric to compare trials by and its mode: pass metric=... and mode='min' or "
            f"'max' to {owner}, or to tune.run / TuneConfig"
        )
    return metric, mode


class TrialScheduler:
    """Interface shared by all schedulers; every method is safe to call from several threads.

    Call order per trial: ``on_trial_add`` once, then ``on_trial_result`` for every report (stop
    the trial when it returns :data:`STOP`), then exactly one of ``on_trial_complete`` (finished or
    stopped; pass its last result) or ``on_trial_error`` (crashed).
    """

    #: The ``time_attr`` at which a trial is complete (None: the trial decides, e.g. its epochs).
    max_t: int | None = None
    #: How a trial this scheduler stopped is labelled ("stopped early (<reason>) at epoch n").
    stop_reason = "scheduler"
    #: What it compares trials by (None: nothing, as FIFO), and the reported counter it schedules on.
    metric: str | None = None
    mode: str | None = None
    time_attr: str | None = None

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def _check_time_attr_and_mode(self, time_attr: Any, mode: Any) -> None:
        """The two arguments every Ray scheduler takes, checked alike; the errors name the scheduler."""
        owner = type(self).__name__
        if not isinstance(time_attr, str) or not time_attr:
            raise ValueError(
                f"{owner}: time_attr must be the non-empty name of a reported, monotonically increasing value "
                f"(e.g. 'training_iteration'), got {time_attr!r}"
            )
        if mode not in (None, "min", "max"):
            raise ValueError(f"{owner}: mode must be 'min' or 'max' ('min' for a loss, 'max' for accuracy), got {mode!r}")

    # A scheduler is pickled with the experiment's settings (``Tuner.restore`` builds it again from them): its
    # locks are not state, and are made anew.
    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in vars(self).items() if k not in ("_lock", "_cond")}
        state["_had_condition"] = hasattr(self, "_cond")  # PBT and HyperBand wait on one
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        had_condition = state.pop("_had_condition", False)
        self.__dict__.update(state)
        self._lock = threading.Lock()
        if had_condition:
            self._cond = threading.Condition(self._lock)

    def set_search_properties(self, metric: str | None, mode: str | None) -> None:
        """The experiment's metric and mode, for a scheduler built without them (as Ray's Tune passes them).
        Raises, naming the fix, when the scheduler needs them and neither it nor the experiment has them."""

    def checkpoint_every(self) -> int | None:
        """How often (in reports) a trial must save a checkpoint for this scheduler to work (PBT continues a trial
        from another's, HyperBand resumes a paused one); None: it needs none."""
        return None

    def check_room(self, *, trials: int, at_once: int) -> None:
        """Before any trial runs: raises ValueError, naming the settings to change, when this scheduler cannot
        work with ``trials`` trials of which ``at_once`` run at the same time (most schedulers can)."""

    def on_trial_config(self, trial_id: str, config: dict[str, Any]) -> dict[str, Any]:
        """The config a trial trains with, as it starts (or continues after an exploit): the scheduler may add to
        it (PBT samples the mutated names a config lacks). Most schedulers take it as it is."""
        return config

    def take_exploit(self, trial_id: str) -> Any:
        """After an ``EXPLOIT`` decision: what the trial continues from (``pbt.Exploit``); None for the others."""
        return None

    def wait_to_resume(self, trial_id: str, give_up: Callable[[], bool]) -> Decision:
        """After a ``PAUSE`` decision: block until the trial may go on (CONTINUE) or is stopped (STOP)."""
        raise NotImplementedError(f"{type(self).__name__} never pauses a trial")

    def no_more_trials(self, total: int) -> None:
        """The sweep starts no trial after its ``total``-th (a scheduler waiting for a group of trials stops
        waiting once they are all there)."""

    def on_trial_add(self, trial_id: str) -> None:
        """A trial starts (or goes on after a pause or an exploit); called once before its first result."""
        raise NotImplementedError

    def on_trial_result(self, trial_id: str, result: Mapping[str, Any]) -> Decision:
        """Decide on one report of a trial: ``CONTINUE``, ``STOP``, ``PAUSE`` or ``EXPLOIT`` (a ``Decision``).

        Args:
            trial_id: the reporting trial.
            result: its reported metrics, with the scheduler's ``time_attr``.
        """
        raise NotImplementedError

    def on_trial_complete(self, trial_id: str, result: Mapping[str, Any] | None) -> None:
        """A trial ended without an error (finished, or stopped by a decision); ``result``: its last report,
        if any.
        """
        raise NotImplementedError

    def on_trial_error(self, trial_id: str) -> None:
        """A trial failed; it reports no more."""
        raise NotImplementedError

    def debug_string(self) -> str:
        """A one-line account of the scheduler's state, for logs (Ray's ``debug_string``)."""
        return type(self).__name__


class FIFOScheduler(TrialScheduler):
    """Runs every trial to completion: the baseline, and the default when no scheduler is configured."""

    def __init__(self) -> None:
        super().__init__()
        self._live: set[str] = set()

    def on_trial_add(self, trial_id: str) -> None:
        """Count the trial as live."""
        with self._lock:
            self._live.add(trial_id)

    def on_trial_result(self, trial_id: str, result: Mapping[str, Any]) -> Decision:
        """Always ``CONTINUE``: FIFO never stops a trial."""
        return CONTINUE

    def on_trial_complete(self, trial_id: str, result: Mapping[str, Any] | None) -> None:
        """The trial is no longer live."""
        with self._lock:
            self._live.discard(trial_id)

    def on_trial_error(self, trial_id: str) -> None:
        """The trial is no longer live."""
        with self._lock:
            self._live.discard(trial_id)

    def debug_string(self) -> str:
        """``"FIFOScheduler: <n> live trials"``."""
        with self._lock:
            return f"FIFOScheduler: {len(self._live)} live trials"

    def __repr__(self) -> str:
        return "FIFOScheduler()"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
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
    """Asynchronous successive halving (ASHA, https://arxiv.org/abs/1810.05934), one bracket.

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
        if brackets != 1:
            raise ValueError(f"ASHAScheduler(brackets={brackets!r}): only one bracket is supported; use brackets=1")
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

        # Ray's formula, float rounding included (np.log, int truncation), so the rungs match exactly.
        num_rungs = int(np.log(max_t / grace_period) / np.log(reduction_factor) + 1)
        # Descending, so the first milestone <= the current time is the highest rung reached.
        self._rungs: list[tuple[float, dict[str, float]]] = [
            (grace_period * reduction_factor**k, {}) for k in reversed(range(num_rungs))
        ]
        self._live: set[str] = set()
        self._num_stopped = 0

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
        """The rung milestones in ascending order, e.g. ``[1, 2, 4]`` for grace 1, rf 2, max_t 4.

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
        """Ray's ``_Bracket.on_result``: decide at (and record into) the highest rung reached, once."""
        action = CONTINUE
        for milestone, recorded in self._rungs:
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

    def rung_cutoffs(self) -> dict[float, float | None]:
        """Current cutoff per milestone, in the metric's own sign (for logging)."""
        with self._lock:
            out: dict[float, float | None] = {}
            for milestone, recorded in reversed(self._rungs):
                cutoff = _cutoff(recorded, self.reduction_factor)
                out[milestone] = None if cutoff is None else self._sign * cutoff
            return out

    def debug_string(self) -> str:
        """The stopped count and each rung's milestone, size and current cutoff."""
        cutoffs = self.rung_cutoffs()
        with self._lock:
            rungs = " | ".join(
                f"t={m:g}: n={len(rec)} cutoff={cutoffs[m]}" for m, rec in reversed(self._rungs)
            )
            return f"ASHAScheduler({self.metric}, {self.mode}): num_stopped={self._num_stopped}; {rungs}"

    def __repr__(self) -> str:
        return (
            f"ASHAScheduler(metric={self.metric!r}, mode={self.mode!r}, max_t={self.max_t}, "
            f"grace_period={self.grace_period}, reduction_factor={self.reduction_factor})"
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


#: Ray's other name for the same algorithm (``ASHAScheduler`` is its alias there).
AsyncHyperBandScheduler = ASHAScheduler


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
