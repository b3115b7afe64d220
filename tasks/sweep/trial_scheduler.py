"""What every trial scheduler is: the ``TrialScheduler`` interface, its ``Decision`` on a report, and how a scheduler
settles the metric and mode it compares trials by (``merge_search_properties``).

The sweep driver runs several trials concurrently (one thread per trial, each driving a Dask DDP worker group)
and calls one shared scheduler from all of them, so every scheduler guards its state with a lock. Each one lives
in a module of its own (``fifo``, ``asha``, ``median_stopping``, ``hyperband``, ``pbt``, ``pb2``); ``schedulers``
builds them from plain data. Pure Python + numpy (no Prefect, MLflow, torch or Dask).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ._str_enum import StrEnum


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


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )
