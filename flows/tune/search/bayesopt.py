"""``sweepflow.tune.search.bayesopt.BayesOptSearch``: Bayesian optimisation with a Gaussian process (the
``bayesian-optimization`` package) proposes each trial's config (Ray Tune's ``BayesOptSearch``, same module path,
arguments and meaning). Needs the ``bayesopt`` extra (``pip install 'sweepflow[bayesopt]'``).

BayesOpt searches continuous parameters only: the space is ``tune.uniform`` domains (another float sampler such
as ``loguniform`` is searched uniformly between its bounds, as Ray does, with a warning) or ``(lower, upper)``
pairs, given here or as the experiment's ``config``/``param_space``. Nested dicts are ``a/b`` parameters.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sweepflow.tasks.sweep.space import (
    RANDOM_DOMAINS,
    LogUniform,
    QUniform,
    Uniform,
    config_leaves,
    is_grid,
    plain,
)
from sweepflow.tune.search.library_searcher import LibrarySearcher
from sweepflow.tune.search.searcher import Searcher

__all__ = ["BayesOptSearch"]

log = logging.getLogger(__name__)

_UTILITIES = {"ucb": "UpperConfidenceBound", "ei": "ExpectedImprovement", "poi": "ProbabilityOfImprovement"}


def _bayes_opt() -> Any:
    try:
        import bayes_opt
    except ImportError as exc:
        raise ImportError(
            "BayesOptSearch needs bayesian-optimization, which is not installed: pip install 'sweepflow[bayesopt]' "
            "(or 'bayesian-optimization>=1.4')"
        ) from exc
    return bayes_opt


class BayesOptSearch(LibrarySearcher):
    """Ray's ``BayesOptSearch``: ``space`` (``{name: (lower, upper)}`` or ``tune.uniform`` domains; None: the
    experiment's ``config``/``param_space``), ``metric``/``mode`` (or the experiment's), ``points_to_evaluate``
    (configs the first trials run), ``utility_kwargs`` (the acquisition: ``kind`` ``"ucb"``/``"ei"``/``"poi"``,
    ``kappa``, ``xi``), ``random_state``, ``random_search_steps`` (results gathered before the first is given to
    the Gaussian process: its first proposals are random), ``patience`` and ``skip_duplicate`` (a config already
    proposed, to 5 digits, is not proposed again; after ``patience`` duplicates in a row the search is FINISHED).

    BayesOpt maximises: a ``mode="min"`` metric is told negated. A failed trial, or one whose last report lacks
    the metric, is not told (as in Ray)."""

    def __init__(
        self,
        space: Mapping[str, Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: Sequence[Mapping[str, Any]] | None = None,
        utility_kwargs: Mapping[str, Any] | None = None,
        random_state: int = 42,
        random_search_steps: int = 10,
        verbose: int = 0,
        patience: int = 5,
        skip_duplicate: bool = True,
    ) -> None:
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"BayesOptSearch(patience={patience!r}): an integer >= 1")
        if isinstance(random_search_steps, bool) or not isinstance(random_search_steps, int) or random_search_steps < 0:
            raise ValueError(f"BayesOptSearch(random_search_steps={random_search_steps!r}): an integer >= 0")
        utility = {"kind": "ucb", "kappa": 2.576, "xi": 0.0, **dict(utility_kwargs or {})}
        if utility["kind"] not in _UTILITIES or set(utility) - {"kind", "kappa", "xi"}:
            raise ValueError(
                f"BayesOptSearch(utility_kwargs={dict(utility_kwargs or {})!r}): kind is 'ucb', 'ei' or 'poi', with "
                "kappa (ucb) and xi (ei, poi)"
            )
        super().__init__(metric=metric, mode=mode)  # checks them
        self._byo = _bayes_opt()
        self._utility_kwargs = utility
        self._random_state, self._verbose = random_state, verbose
        self._random_search_steps, self._patience, self._skip_duplicate = random_search_steps, patience, skip_duplicate
        self._points = [dict(p) for p in points_to_evaluate or ()]
        self._optimizer: Any = None
        self._utility: Any = None  # bayesian-optimization < 2: the acquisition given to each suggest
        self._bounds: dict[str, tuple[float, float]] = {}
        self._live: dict[str, dict[str, float]] = {}  # trial id -> the point proposed
        self._seen: set[tuple[float, ...]] = set()
        self._buffered: list[tuple[dict[str, float], float]] = []  # results held until random_search_steps
        self._registered = False
        if space:
            self._set_space(space)

    # ------------------------------------------------------------------------------------------ the experiment

    space_hint = "tune.uniform domains"

    def _has_space(self) -> bool:
        return self._optimizer is not None

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """A point to evaluate first, then the Gaussian process's proposal (random until it has results);
        ``FINISHED`` after ``patience`` duplicates in a row."""
        self._check_ready()
        if self._points:
            point = self._points.pop(0)
        else:
            for _ in range(self._patience):
                point = {k: float(v) for k, v in self._ask().items()}
                if not (self._skip_duplicate and self._key(point) in self._seen):
                    break
            else:
                log.info("BayesOptSearch proposed %d duplicates in a row: the search is finished", self._patience)
                return Searcher.FINISHED
        self._seen.add(self._key(point))
        self._live[trial_id] = point
        return plain(point)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """Give the Gaussian process the trial's metric (negated for ``mode='min'``), once
        ``random_search_steps`` results are in; a failure is not told."""
        point = self._live.pop(trial_id, None)
        value = self._reached(result, error)
        if point is None or value is None:
            return
        self._buffered.append((point, -value if self._mode == "min" else value))
        if self._registered or len(self._buffered) >= self._random_search_steps:
            for params, target in self._buffered:
                self._optimizer.register(params=params, target=target)
            self._buffered, self._registered = [], True

    def get_state(self) -> dict[str, Any]:
        """What ``save`` pickles: the optimizer (its observations), the results held and the points left."""
        return {key: getattr(self, key) for key in _STATE}

    def set_state(self, state: dict[str, Any]) -> None:
        """Take back what ``get_state`` returned (``restore``)."""
        for key in _STATE:
            setattr(self, key, state[key])

    # ---------------------------------------------------------------------------------------------- the space

    def _ask(self) -> dict[str, Any]:
        if self._utility is not None:
            return self._optimizer.suggest(self._utility)
        return self._optimizer.suggest()

    def _key(self, point: Mapping[str, float]) -> tuple[float, ...]:
        return tuple(round(point[name], 5) for name in self._bounds)

    def _set_space(self, space: Mapping[str, Any]) -> None:
        self._bounds = _bounds(space)
        byo, kind = self._byo, self._utility_kwargs["kind"]
        kwargs = {"f": None, "pbounds": self._bounds, "random_state": self._random_state, "verbose": self._verbose}
        if hasattr(byo, "UtilityFunction"):  # bayesian-optimization 1.x (Ray's API): the acquisition per suggest
            self._utility = byo.UtilityFunction(**self._utility_kwargs)
            self._optimizer = byo.BayesianOptimization(**kwargs, allow_duplicate_points=True)
        else:  # 2.x and later: the acquisition is the optimizer's
            from bayes_opt import acquisition

            options = {"kappa": self._utility_kwargs["kappa"]} if kind == "ucb" else {"xi": self._utility_kwargs["xi"]}
            function = getattr(acquisition, _UTILITIES[kind])(**options)
            self._optimizer = byo.BayesianOptimization(
                **kwargs, acquisition_function=function, allow_duplicate_points=True
            )
        for i, point in enumerate(self._points):
            if set(point) != set(self._bounds):
                raise ValueError(
                    f"BayesOptSearch(points_to_evaluate=...): point {i} gives {sorted(point)}; give exactly the "
                    f"space's parameters {sorted(self._bounds)} ('a/b' for a nested key)"
                )


_STATE = ("_optimizer", "_utility", "_bounds", "_live", "_seen", "_buffered", "_registered", "_points", "_metric",
          "_mode")


def _bounds(space: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """The continuous parameters' ``(lower, upper)``, by ``a/b`` name; constants are left to the experiment."""
    bounds: dict[str, tuple[float, float]] = {}
    for path, value in config_leaves(dict(space)):
        label = "/".join(path)
        if is_grid(value):
            raise ValueError(f"{label}: tune.grid_search is not searched by BayesOptSearch (continuous parameters only)")
        if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int | float) for v in value):
            bounds[label] = (float(value[0]), float(value[1]))
        elif isinstance(value, Uniform | LogUniform):
            if isinstance(value, LogUniform):
                log.warning("%s: BayesOptSearch searches loguniform's range uniformly (as Ray's)", label)
            bounds[label] = (float(value.low), float(value.high))
        elif isinstance(value, QUniform):
            raise ValueError(f"{label}: BayesOptSearch does not search quantized values (as Ray's); use tune.uniform")
        elif isinstance(value, RANDOM_DOMAINS):
            raise ValueError(
                f"{label}: BayesOptSearch searches continuous parameters only, not {type(value).__name__}; use "
                "tune.uniform, or a searcher for discrete spaces (OptunaSearch, HyperOptSearch, NevergradSearch)"
            )
    if not bounds:
        raise ValueError("BayesOptSearch: the space has nothing to search (no tune.uniform domains)")
    return bounds
