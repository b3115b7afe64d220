"""``sweepflow.tune.search.optuna.OptunaSearch``: Optuna's TPE proposes each trial's config from the results so
far (Ray Tune's ``OptunaSearch``), on the sweep's ``TPESampler`` for a space of ``tune.*`` domains, or on an
Optuna study's ask/tell for a define-by-run function."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: A define-by-run space: it calls ``trial.suggest_float/suggest_int/suggest_categorical`` on an ``optuna.Trial``
#: and may return a dict of constants to merge into the config.
DefineByRun = Callable[[Any], "dict[str, Any] | None"]


class OptunaSearch:
    """Settings only: the experiment builds the sampler (``sweepflow.tune._internal.searchers``), so one ``OptunaSearch``
    can be given to several experiments (each gets a fresh study), and a ``Tuner`` saved for ``restore`` pickles
    without an Optuna study in it.

    ``space``: a dict of ``tune.*`` domains (plain values stay constant), or a define-by-run function
    ``space(trial) -> dict | None``; None: the experiment's ``config``/``param_space`` is the space.
    ``points_to_evaluate``: configs the first trials run (Optuna's ``enqueue_trial``; a point may leave
    parameters out, TPE proposes them). ``evaluated_rewards``: the metric those points already reached: TPE learns
    from them and they are not run again (not with a define-by-run function, as in Ray).

    Multi-objective (as in Ray): ``metric=["loss", "acc"], mode=["min", "max"]`` searches an Optuna study with one
    direction per objective, told each finished trial's last reported value of every objective (a trial missing
    one, or with a value that is not finite, is told as failed). ``sampler``: the Optuna sampler to search with
    (e.g. ``optuna.samplers.NSGAIISampler(seed=0)``; each experiment gets a copy); default: TPE, which Optuna
    makes multi-objective when there are several objectives (Ray's default too). The experiment's own
    ``metric`` is None or one of the objectives (its mode must be that objective's): it ranks the trials
    (best trial, schedulers, checkpoints); ``ResultGrid.pareto_front()`` / ``ExperimentAnalysis.pareto_front()``
    give the trials no other trial beats on every objective."""

    def __init__(
        self,
        space: Mapping[str, Any] | DefineByRun | None = None,
        metric: str | Sequence[str] | None = None,
        mode: str | Sequence[str] | None = None,
        points_to_evaluate: Sequence[Mapping[str, Any]] | None = None,
        seed: int | None = None,
        evaluated_rewards: Sequence[float] | None = None,
        n_startup_trials: int = 4,
        sampler: Any = None,
    ) -> None:
        if isinstance(metric, list | tuple) or isinstance(mode, list | tuple):
            metric, mode = _objectives(metric, mode)
        elif mode not in (None, "min", "max"):
            raise ValueError(f"OptunaSearch(mode={mode!r}): mode must be 'min' or 'max'")
        if sampler is not None and not callable(getattr(sampler, "sample_relative", None)):
            raise TypeError(
                f"OptunaSearch(sampler={sampler!r}): give an Optuna sampler, e.g. "
                "optuna.samplers.NSGAIISampler(seed=0) or optuna.samplers.TPESampler(seed=0)"
            )
        if isinstance(metric, list) and evaluated_rewards is not None:
            raise ValueError(
                "OptunaSearch(evaluated_rewards=...) with several objectives is not built: give points_to_evaluate "
                "alone (they run as the first trials)"
            )
        if isinstance(n_startup_trials, bool) or not isinstance(n_startup_trials, int) or n_startup_trials < 0:
            raise ValueError(
                f"OptunaSearch(n_startup_trials={n_startup_trials!r}): give how many trials are sampled at random "
                "before TPE models the results, an int >= 0"
            )
        if space is not None and not callable(space) and not isinstance(space, Mapping):
            raise TypeError(
                f"OptunaSearch(space=...) takes a dict of tune.* domains or a define-by-run function "
                f"space(trial) that calls trial.suggest_float/suggest_int/suggest_categorical; got "
                f"{type(space).__name__}"
            )
        points = _points(points_to_evaluate)
        rewards = _rewards(evaluated_rewards, points, define_by_run=callable(space))
        self.space = space
        self.metric = metric
        self.mode = mode
        self.points_to_evaluate = points
        self.seed = seed
        self.evaluated_rewards = rewards
        self.n_startup_trials = n_startup_trials
        self.sampler = sampler

    @property
    def objectives(self) -> tuple[tuple[str, str], ...]:
        """(metric, mode) of each objective of a multi-objective search; empty for one metric."""
        if isinstance(self.metric, list):
            return tuple(zip(self.metric, self.mode, strict=True))  # type: ignore[arg-type]
        return ()

    @property
    def define_by_run(self) -> bool:
        """Whether ``space`` is a define-by-run function (``trial -> None``, Optuna's ask interface) rather
        than a dict of domains.
        """
        return callable(self.space)

    def __repr__(self) -> str:
        space = f"space={qualified_name(self.space)}, " if self.define_by_run else ""
        points = f", points_to_evaluate={len(self.points_to_evaluate)} point(s)" if self.points_to_evaluate else ""
        rewarded = " (evaluated)" if self.evaluated_rewards else ""
        sampler = f", sampler={type(self.sampler).__name__}" if self.sampler is not None else ""
        return (
            f"OptunaSearch({space}metric={self.metric!r}, mode={self.mode!r}, seed={self.seed}, "
            f"n_startup_trials={self.n_startup_trials}{sampler}{points}{rewarded})"
        )


def qualified_name(fn: Any) -> str:
    """``module.qualname`` of ``fn``: how a define-by-run space function is shown in reprs and the sweep line.
    """
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _objectives(metric: Any, mode: Any) -> tuple[list[str], list[str]]:
    """A multi-objective search's metrics and modes, checked: two lists of the same length, names unique."""
    if not isinstance(metric, list | tuple) or not isinstance(mode, list | tuple) or len(metric) != len(mode):
        raise ValueError(
            f"OptunaSearch(metric={metric!r}, mode={mode!r}): a multi-objective search takes a list of metrics and "
            "a list of modes of the same length, e.g. metric=['loss', 'acc'], mode=['min', 'max']"
        )
    if not metric or not all(isinstance(m, str) and m for m in metric) or len(set(metric)) != len(metric):
        raise ValueError(f"OptunaSearch(metric={metric!r}): give each objective's name once")
    if any(m not in ("min", "max") for m in mode):
        raise ValueError(f"OptunaSearch(mode={mode!r}): each mode must be 'min' or 'max'")
    return list(metric), list(mode)


def _points(points: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    if points is None:
        return []
    if isinstance(points, Mapping) or not isinstance(points, Sequence):
        raise TypeError(
            f"OptunaSearch(points_to_evaluate=...) takes a list of configs, e.g. [{{'lr': 0.01}}], got "
            f"{type(points).__name__}"
        )
    for i, point in enumerate(points):
        if not isinstance(point, Mapping) or not all(isinstance(k, str) for k in point):
            raise TypeError(
                f"OptunaSearch(points_to_evaluate=...): point {i} must be a dict of parameter names to values, "
                f"got {point!r}"
            )
    return [dict(p) for p in points]


def _rewards(rewards: Sequence[float] | None, points: list[dict[str, Any]], *, define_by_run: bool) -> list[float]:
    if rewards is None:
        return []
    if define_by_run:
        # Ray refuses it too: an evaluated point is told to the study with each parameter's distribution, which
        # only the function knows (when it runs on a trial).
        raise ValueError(
            "OptunaSearch(evaluated_rewards=...) cannot be used with a define-by-run space function: give the "
            "space as a dict of tune.* domains, or drop evaluated_rewards and let points_to_evaluate run"
        )
    if isinstance(rewards, str | bytes) or not isinstance(rewards, Sequence):
        raise TypeError(f"OptunaSearch(evaluated_rewards=...) takes a list of numbers, got {type(rewards).__name__}")
    if len(rewards) != len(points):
        raise ValueError(
            f"OptunaSearch(evaluated_rewards=...) gives {len(rewards)} result(s) for {len(points)} "
            "points_to_evaluate: give one result per point, in the same order"
        )
    for i, reward in enumerate(rewards):
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
            raise ValueError(
                f"OptunaSearch(evaluated_rewards=...): result {i} must be a finite number (the metric point {i} "
                f"reached), got {reward!r}"
            )
    return [float(r) for r in rewards]
