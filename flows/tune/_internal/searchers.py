"""From a ``search_alg`` (Ray's searcher objects: ``OptunaSearch``, ``Repeater``, ``ConcurrencyLimiter``,
``BasicVariantGenerator``) to the sweep's ``Sampler``, and what the experiment records about its search.

The searcher objects only hold settings (``sweepflow.tune.search``); each experiment gets fresh samplers here:
the sweep's ``RandomSampler`` (no ``search_alg``, or ``BasicVariantGenerator``: random search crossed with the
grids), ``SearchSampler`` (a space of ``tune.*`` domains, on the sweep's ``TPESampler``), ``DefineByRunSampler``
(a define-by-run function on an Optuna study's ask/tell), ``RepeatSampler`` (``Repeater``) and
``SearcherSampler`` (a ``Searcher``, in ``sweepflow.tasks.sweep.searcher``).
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweepflow.tasks.sweep.samplers import (
    RandomSampler,
    Sampler,
    SamplerExhausted,
    optuna_study,
    tell_study,
)
from sweepflow.tasks.sweep.searcher import searcher_ranking, searcher_sampler
from sweepflow.tasks.sweep.space import config_leaves, is_grid, parse_param_space, plain, set_leaf
from sweepflow.tasks.sweep.trial_scheduler import merge_search_properties
from sweepflow.tune.search.concurrency import BasicVariantGenerator, ConcurrencyLimiter
from sweepflow.tune.search.optuna import OptunaSearch, qualified_name
from sweepflow.tune.search.repeater import TRIAL_INDEX, Repeater
from sweepflow.tune.search.searcher import Searcher
from sweepflow.tune.search_space import Domain, SearchSampler, flat_point, space_as_data


@dataclass(frozen=True)
class SearchPlan:
    """The experiment's search: its sampler, the metric/mode it ranks by, and what is recorded about it."""

    sampler: Sampler
    metric: str | None
    mode: str | None
    label: str  # the parent run's "search" param (part of what a resumed run must share)
    searched: tuple[str, ...]  # config paths the trials table shows ("a/b" for nested keys)
    varying_names: tuple[str, ...]  # searched top-level keys (trial names show them)
    search_space: dict[str, Any]  # the space's top level as data (the sweep report's axes)
    objectives: tuple[tuple[str, str], ...] = ()  # a multi-objective search's (metric, mode) pairs


def unwrap(
    search_alg: Any, max_concurrent_trials: int | None, seed: int | None
) -> tuple[Any, Repeater | None, int | None, int | None]:
    """Ray's wrappers taken off the searcher: a ``ConcurrencyLimiter`` lowers the experiment's concurrency, a
    ``Repeater`` is kept for ``plan``, a ``BasicVariantGenerator`` is the default search (None) with its seed.
    Returns (searcher or None, repeater, max_concurrent_trials, seed)."""
    repeater: Repeater | None = None
    while isinstance(search_alg, ConcurrencyLimiter | Repeater):
        if isinstance(search_alg, ConcurrencyLimiter):
            limit = search_alg.max_concurrent
            max_concurrent_trials = min(max_concurrent_trials or limit, limit)
            if isinstance(search_alg.searcher, Searcher):  # told, as in Ray; the experiment keeps the limit anyway
                search_alg.searcher.set_max_concurrency(limit)
        elif repeater is not None:
            raise ValueError(
                f"a Repeater(repeat={repeater.repeat}) wraps another Repeater(repeat={search_alg.repeat}): repeat "
                f"once, with Repeater(searcher, repeat={repeater.repeat * search_alg.repeat})"
            )
        else:
            repeater = search_alg
        search_alg = search_alg.searcher
    if isinstance(search_alg, BasicVariantGenerator):
        if search_alg.max_concurrent:
            limit = search_alg.max_concurrent
            max_concurrent_trials = min(max_concurrent_trials or limit, limit)
        seed = search_alg.random_state if search_alg.random_state is not None else seed
        search_alg = None
    return search_alg, repeater, max_concurrent_trials, seed


def plan(
    search_alg: Any,
    repeater: Repeater | None,
    param_space: Mapping[str, Any],
    *,
    num_samples: int,
    metric: str | None,
    mode: str | None,
    seed: int | None,
) -> SearchPlan:
    """The sampler for ``search_alg`` (unwrapped by ``unwrap``; None: random/grid search over ``param_space``),
    repeated by ``repeater``; every mistake refused here, before any service starts."""
    configs = _configs(num_samples, repeater)  # the searcher proposes configs; each runs as `repeat` trials
    space: Mapping[str, Any] = param_space
    sampler: Sampler
    if search_alg is None:
        sampler = RandomSampler(parse_param_space(param_space), seed=seed, num_samples=configs)
        label = "random"
    elif isinstance(search_alg, OptunaSearch):
        metric, mode = _optuna_ranking(search_alg, repeater, metric, mode)
        _check_one_space(search_alg, param_space)
        sampler, label, space = _optuna_sampler(
            search_alg, param_space, configs=configs, metric=metric, mode=mode, seed=seed
        )
    elif isinstance(search_alg, Searcher):
        metric, mode = searcher_ranking(search_alg, metric, mode)
        sampler = searcher_sampler(search_alg, param_space, configs=configs, metric=metric, mode=mode)
        label = f"{qualified_name(type(search_alg))} (searcher)"
    else:
        raise TypeError(
            f"search_alg={search_alg!r}: use a searcher of sweepflow.tune.search (OptunaSearch, HyperOptSearch, "
            "BasicVariantGenerator, or your own subclass of sweepflow.tune.search.Searcher), optionally in a "
            "ConcurrencyLimiter or Repeater"
        )
    varying = tuple("/".join(p) for p, v in config_leaves(dict(space)) if isinstance(v, Domain) or is_grid(v))
    searched = varying
    if repeater is not None:
        sampler = RepeatSampler(sampler, repeat=repeater.repeat, set_index=repeater.set_index)
        label = f"{label}, each config run {repeater.repeat}x (Repeater)"
        searched = (*searched, TRIAL_INDEX) if repeater.set_index else searched
    return SearchPlan(
        sampler=sampler,
        metric=metric,
        mode=mode,
        objectives=search_alg.objectives if isinstance(search_alg, OptunaSearch) else (),
        label=label,
        searched=searched,
        varying_names=tuple(v for v in varying if "/" not in v),
        search_space=space_as_data(space),
    )


def _configs(num_samples: int, repeater: Repeater | None) -> int:
    """How many configs the searcher proposes: ``num_samples`` counts every trial, each config's repeats
    included."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")
    repeat = repeater.repeat if repeater is not None else 1
    if num_samples % repeat:
        fewer, more = num_samples - num_samples % repeat, num_samples - num_samples % repeat + repeat
        raise ValueError(
            f"num_samples={num_samples} with Repeater(repeat={repeat}): num_samples counts every trial, repeats "
            f"included, so it must be a multiple of repeat (Ray ignores the {num_samples % repeat} left over); use "
            f"num_samples={more} ({more // repeat} configs x {repeat})" + (f" or {fewer}" if fewer else "")
        )
    return num_samples // repeat


def _optuna_ranking(
    search_alg: OptunaSearch, repeater: Repeater | None, metric: str | None, mode: str | None
) -> tuple[str | None, str | None]:
    """The experiment's metric/mode with an ``OptunaSearch``: one of a multi-objective search's objectives (or
    none), else the searcher's own (a different one is refused)."""
    objectives = search_alg.objectives
    if objectives:  # the experiment ranks by one of them, or by none (as in Ray)
        metric, mode = _ranking_objective(objectives, metric, mode)
        if repeater is not None:
            raise ValueError(
                "a Repeater around a multi-objective OptunaSearch is not built (each objective's average would "
                "be told); run each config once, or search one metric"
            )
        return metric, mode
    # The searcher's metric/mode become the experiment's (a different one was refused), and so the
    # scheduler's.
    return merge_search_properties(
        "OptunaSearch", (search_alg.metric, search_alg.mode), (metric, mode)  # type: ignore[arg-type]
    )


def _check_one_space(search_alg: OptunaSearch, param_space: Mapping[str, Any]) -> None:
    """OptunaSearch's own space and a config/param_space that searches too are refused: only one can be
    searched."""
    searched_in_config = [
        "/".join(p) for p, v in config_leaves(dict(param_space)) if isinstance(v, Domain) or is_grid(v)
    ]
    if search_alg.space and searched_in_config:
        # As in Ray: only one of the two spaces could be searched; the other's domains would be dropped.
        given = "a space"
        if search_alg.define_by_run:
            given = f"a define-by-run function ({qualified_name(search_alg.space)})"
        raise ValueError(
            f"OptunaSearch(space=...) was given {given}, and config/param_space searches {searched_in_config} "
            "too: only one of them can be the search space. Move those parameters into OptunaSearch's space "
            "(trial.suggest_float/suggest_int/suggest_categorical in a define-by-run function), or give "
            "OptunaSearch no space; plain values in config/param_space are merged into every trial's config"
        )


def _optuna_sampler(
    search_alg: OptunaSearch,
    param_space: Mapping[str, Any],
    *,
    configs: int,
    metric: str | None,
    mode: str | None,
    seed: int | None,
) -> tuple[Sampler, str, Mapping[str, Any]]:
    """An ``OptunaSearch``'s sampler (define-by-run, or over its space merged into ``param_space``), its label
    and the space searched."""
    objectives = search_alg.objectives
    optuna_seed = search_alg.seed if search_alg.seed is not None else seed
    tpe = {  # what both of Optuna's ways of searching take
        "num_samples": configs,
        "mode": mode,
        "seed": optuna_seed,
        "n_startup_trials": search_alg.n_startup_trials,
        "points_to_evaluate": search_alg.points_to_evaluate,
        "objectives": objectives,
        "optuna_sampler": search_alg.sampler,
    }
    which = type(search_alg.sampler).__name__ if search_alg.sampler is not None else "tpe"
    if objectives:
        which += ", objectives " + ", ".join(f"{m} {d}" for m, d in objectives)
    if search_alg.define_by_run:
        sampler = DefineByRunSampler(
            search_alg.space,  # type: ignore[arg-type]  # callable: define_by_run
            constants=param_space,
            **tpe,
        )
        return sampler, f"{which} (optuna, define-by-run {qualified_name(search_alg.space)})", param_space
    space = _deep_merged(param_space, search_alg.space or {})  # type: ignore[arg-type]  # a dict here
    sampler = SearchSampler(space, metric=metric, evaluated_rewards=search_alg.evaluated_rewards, **tpe)
    return sampler, f"{which} (optuna)", space


def _ranking_objective(
    objectives: tuple[tuple[str, str], ...], metric: str | None, mode: str | None
) -> tuple[str | None, str | None]:
    """The experiment's own metric/mode with a multi-objective search: none (trials are not ranked, as in Ray's
    multi-objective example), or one of the objectives, in its mode."""
    modes = dict(objectives)
    if metric is None:
        if mode is not None:
            raise ValueError(f"mode={mode!r} without a metric: give metric= one of the objectives {list(modes)}")
        return None, None
    if metric not in modes:
        raise ValueError(
            f"metric={metric!r} is not one of OptunaSearch's objectives {list(modes)}: the experiment ranks its "
            "trials by one of them (or give no metric: ResultGrid.get_best_result(metric, mode) and pareto_front() "
            "still work)"
        )
    if mode is not None and mode != modes[metric]:
        raise ValueError(
            f"mode={mode!r} for {metric!r}, but OptunaSearch searches {metric!r} with mode={modes[metric]!r}: give "
            "the same mode, or none"
        )
    return metric, modes[metric]


def last_values(result: Any, objectives: Sequence[tuple[str, str]]) -> list[Any] | None:
    """What a multi-objective study is told of an ended trial (as Ray's ``OptunaSearch``): each objective's value
    in its last report; None for a failed trial."""
    if not result.status.selectable:
        return None
    return [result.last.get(name) for name, _ in objectives]


def shown(searched: tuple[str, ...], sampler: Sampler) -> tuple[str, ...]:
    """The config paths the trials table shows: the planned ones, then those a define-by-run function set (known
    only once it ran)."""
    seen = getattr(sampler, "seen", ())
    planned = tuple(path for path in searched if path != TRIAL_INDEX)
    index = (TRIAL_INDEX,) if TRIAL_INDEX in searched else ()  # a repeat's position last, after the parameters
    return (*planned, *(path for path in seen if path not in planned), *index)


def _deep_merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping) and not is_grid(value) and not is_grid(below):
            merged[key] = _deep_merged(below, value)
        else:
            merged[key] = value
    return merged


class DefineByRunSampler(Sampler):
    """Ray's ``OptunaSearch(space=fn)``: each config is what ``fn`` suggests on a trial of an Optuna study
    (``study.ask()``; TPE proposes the values from the results told so far), merged over the constants of the
    experiment's config: ``{**constants, **trial.params, **fn's returned dict}``, with ``"a/b"`` names nested as
    ``{"a": {"b": ...}}``. ``points_to_evaluate`` are enqueued first (``study.enqueue_trial``): the function's
    ``suggest_*`` calls return their values."""

    def __init__(
        self,
        space: Callable[[Any], dict[str, Any] | None],
        *,
        constants: Mapping[str, Any],
        num_samples: int,
        mode: str,
        seed: int | None,
        n_startup_trials: int,
        points_to_evaluate: Sequence[Mapping[str, Any]] = (),
        objectives: Sequence[tuple[str, str]] = (),
        optuna_sampler: Any = None,
    ) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")
        if len(points_to_evaluate) > num_samples:
            raise ValueError(
                f"{len(points_to_evaluate)} points_to_evaluate, but num_samples={num_samples} trials: the last "
                f"points would never run; raise num_samples to at least {len(points_to_evaluate)} or give fewer points"
            )
        try:
            import optuna
        except ImportError as exc:
            raise ImportError("OptunaSearch needs Optuna: pip install 'optuna>=4'") from exc
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._space = space
        self._constants = dict(constants)
        # Constant liar: with several trials running, proposals do not pile onto one point (as TPESampler does).
        self._study = optuna_study(
            optuna, mode=mode, modes=[m for _, m in objectives], seed=seed, n_startup_trials=n_startup_trials,
            sampler=optuna_sampler,
        )
        self.objectives = tuple(objectives)
        self._points = deque(flat_point(p) for p in points_to_evaluate)
        self._given_points = len(self._points)
        self.total = num_samples
        self._asked = 0
        self.seen: list[str] = []  # config paths the function set, first seen first (the trials table's columns)

    def ask(self) -> tuple[int, dict[str, Any]]:
        """The next trial's (number, config): the function runs on a new study trial (an enqueued point
        first).

        Raises:
            SamplerExhausted: all ``num_samples`` trials were proposed.
            ValueError: the function returned something other than None or a dict with str keys, or ignored a
                point's parameter; the study trial is closed as failed.
        """
        self._check_left()
        point = self._points.popleft() if self._points else None
        if point is not None:  # the points are the first trials, in the order given
            self._study.enqueue_trial(point)
        return self._propose(point)

    def ask_known(self, config: dict[str, Any]) -> int:
        """A resumed experiment's trial that ran with ``config``: the function runs on a trial with its values
        fixed, so the study records it as its next proposal."""
        self._check_left()
        if self._points:  # it was proposed in a point's turn: the point is spent (config holds its values)
            self._points.popleft()
        self._study.enqueue_trial(flat_point(config))
        number, _ = self._propose(None)
        return number

    def tell(self, number: int, value: float | None) -> None:
        """Tell the study trial ``number``'s result: the best value of the metric it reached, or None if it
        failed.
        """
        tell_study(self._study, number, value)

    def tell_result(self, number: int, result: Any) -> None:
        """An ended trial: its best value of the metric, or (several objectives) each one's last value."""
        if self.objectives:
            tell_study(self._study, number, last_values(result, self.objectives))
        else:
            super().tell_result(number, result)

    def _check_left(self) -> None:
        if self._asked >= self.total:
            raise SamplerExhausted(f"all {self.total} trials were proposed")

    def _propose(self, point: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        trial = self._study.ask()
        which = f"OptunaSearch's define-by-run space function {qualified_name(self._space)}"
        try:
            returned = self._space(trial)
        except Exception as exc:
            # The user's function failed: the study's trial is closed as failed, and the error goes on (the sweep
            # ends with it: every later trial would run the same function).
            self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
            note = f"raised by {which}, proposing trial {self._asked}"
            if sys.version_info >= (3, 11):
                exc.add_note(note)
            else:  # Python 3.10 has no add_note: the note is kept where 3.11's would be (its tracebacks omit it)
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]
            raise
        problem = _returned_problem(returned)
        params = dict(trial.params)
        extra = flat_point(returned) if isinstance(returned, Mapping) else {}
        if problem is None and point is not None:
            unused = sorted(set(point) - set(params) - set(extra))
            if unused:
                problem = (
                    f"points_to_evaluate[{self._given_points - len(self._points) - 1}] gives {unused}, which the "
                    f"function did not suggest for that trial (it suggested {sorted(params)}): name the parameters "
                    "as the function's trial.suggest_* calls do ('a/b' for a nested key)"
                )
        if problem is not None:
            self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
            raise ValueError(f"{which}: {problem}")
        config: dict[str, Any] = plain(self._constants)
        for key, value in {**params, **extra}.items():
            set_leaf(config, tuple(key.split("/")), plain(value))
        self.seen.extend(key for key in params if key not in self.seen)  # what is searched (not the constants)
        self._asked += 1
        return trial.number, config


def _returned_problem(returned: Any) -> str | None:
    if returned is None:
        return None
    if not isinstance(returned, Mapping):
        return f"it must return None or a dict of constants to merge into the config, got {type(returned).__name__}"
    bad = [k for k in returned if not isinstance(k, str)]
    if bad:
        return f"the dict it returns must have str keys (config names), got {bad}"
    return None


class RepeatSampler(Sampler):
    """Ray's ``Repeater``: each config ``inner`` proposes is proposed ``repeat`` times in a row (with
    ``config["__trial_index__"]`` = 0 .. repeat-1 when ``set_index``); once every repeat was told, ``inner`` is
    told their mean (failed repeats left out; all failed: a failure). ``total`` counts the repeats."""

    def __init__(self, inner: Sampler, *, repeat: int, set_index: bool) -> None:
        self.inner, self.repeat, self.set_index = inner, repeat, set_index
        self.total = inner.total * repeat
        self._asked = 0
        self._group: tuple[int, dict[str, Any]] | None = None  # the inner proposal being repeated
        self._group_of: dict[int, int] = {}  # trial number -> inner number
        self._told: dict[int, list[float | None]] = {}  # inner number -> its repeats' results so far

    @property
    def seen(self) -> Sequence[str]:
        """The config paths the inner sampler's define-by-run function set (the trials table's columns); empty
        for a dict space.
        """
        return getattr(self.inner, "seen", ())

    def ask(self) -> tuple[int, dict[str, Any]]:
        """The next trial's (number, config): the inner proposal being repeated, or a new one once it was
        proposed ``repeat`` times.

        Raises:
            SamplerExhausted: all ``total`` trials were proposed.
        """
        return self._next(None)

    def ask_known(self, config: dict[str, Any]) -> int:
        """A resumed experiment's trial: repeats are proposed in a row, so the first of a group is the inner
        sampler's known proposal and the others join it."""
        return self._next(config)[0]

    def _next(self, known: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        if self._asked >= self.total:
            raise SamplerExhausted(f"all {self.total} trials were proposed")
        index = self._asked % self.repeat
        if index == 0 or self._group is None:
            if known is None:
                self._group = self.inner.ask()
            else:
                base = {k: v for k, v in known.items() if k != TRIAL_INDEX}
                self._group = (self.inner.ask_known(base), base)
            self._told[self._group[0]] = []
        inner_number, config = self._group
        number = self._asked
        self._asked += 1
        self._group_of[number] = inner_number
        proposed = plain(config)
        if self.set_index:
            proposed[TRIAL_INDEX] = index
        return number, proposed

    def tell(self, number: int, value: float | None) -> None:
        """Record one repeat's result; once every repeat of its config is told, tell ``inner`` their mean."""
        inner_number = self._group_of.pop(number)
        told = self._told[inner_number]
        told.append(value)
        if len(told) < self.repeat:
            return
        del self._told[inner_number]
        ended = [v for v in told if v is not None and math.isfinite(v)]
        self.inner.tell(inner_number, sum(ended) / len(ended) if ended else None)
