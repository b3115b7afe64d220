"""``sweepflow.tune.search.hyperopt.HyperOptSearch``: HyperOpt's Tree-structured Parzen Estimator proposes each
trial's config from the results so far (Ray Tune's ``HyperOptSearch``, same module path, arguments and meaning),
on HyperOpt's own ask/tell: a ``hyperopt.Trials`` record that ``tpe.suggest`` reads and each ended trial's loss is
written to. Needs the ``hyperopt`` extra (``pip install 'sweepflow[hyperopt]'``).

The space is a dict of ``tune.*`` domains (converted to ``hp.*`` expressions; a ``tune.choice`` whose categories
are dicts holding domains is a conditional space, searched only in the branch chosen), or HyperOpt's own space
(``hp.*`` expressions, used as they are), given here or as the experiment's ``config``/``param_space``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from sweepflow.tasks.sweep.space import (
    Choice,
    Constant,
    LogUniform,
    Normal,
    Pow2,
    QRandInt,
    QUniform,
    RandInt,
    SampleFrom,
    Uniform,
    is_grid,
    plain,
)
from sweepflow.tune.search.library_searcher import LibrarySearcher

__all__ = ["HyperOptSearch"]

_DOMAINS = (Choice, LogUniform, Normal, Pow2, QRandInt, QUniform, RandInt, Uniform)


def _hyperopt() -> Any:
    try:
        import hyperopt
    except ImportError as exc:
        raise ImportError(
            "HyperOptSearch needs HyperOpt, which is not installed: pip install 'sweepflow[hyperopt]' (or "
            "'hyperopt>=0.2.7')"
        ) from exc
    return hyperopt


def _same(value: Any) -> Any:
    """HyperOpt's objective for the domain: never called (trials are evaluated by the sweep)."""
    return value


class HyperOptSearch(LibrarySearcher):
    """Ray's ``HyperOptSearch``: ``space`` (``tune.*`` domains or HyperOpt's ``hp.*``; None: the experiment's
    ``config``/``param_space``), ``metric``/``mode`` (or the experiment's), ``points_to_evaluate`` (configs the
    first trials run, every parameter given; a category by its value, as in Ray, for a ``tune.*`` space, by its
    index for HyperOpt's own ``hp.choice``), ``n_initial_points`` random trials before TPE models the results,
    ``random_state_seed`` (the same seed and results: the same configs) and TPE's ``gamma``.

    A failed trial, or one whose last report lacks the metric (or is not finite), is told to HyperOpt as failed."""

    def __init__(
        self,
        space: Mapping[str, Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: Sequence[Mapping[str, Any]] | None = None,
        n_initial_points: int = 20,
        random_state_seed: int | None = None,
        gamma: float = 0.25,
    ) -> None:
        if isinstance(n_initial_points, bool) or not isinstance(n_initial_points, int) or n_initial_points < 1:
            raise ValueError(f"HyperOptSearch(n_initial_points={n_initial_points!r}): an integer >= 1")
        if not 0 < gamma < 1:
            raise ValueError(f"HyperOptSearch(gamma={gamma!r}): TPE's quantile, between 0 and 1")
        if random_state_seed is not None and (
            isinstance(random_state_seed, bool) or not isinstance(random_state_seed, int)
        ):
            raise TypeError(f"HyperOptSearch(random_state_seed={random_state_seed!r}): an integer seed")
        super().__init__(metric=metric, mode=mode)  # checks them
        self._hpo = _hyperopt()
        self._algo = partial(self._hpo.tpe.suggest, n_startup_jobs=n_initial_points, gamma=gamma)
        self._rng = np.random.default_rng(random_state_seed)
        self._given_points = [dict(p) for p in points_to_evaluate or ()]
        self._space: Any = None  # the hp.* space searched
        self._domain: Any = None
        self._trials: Any = None
        self._points: list[dict[str, Any]] = []  # HyperOpt values of the points not proposed yet
        self._live: dict[str, int] = {}  # trial id -> HyperOpt tid
        if space:
            self._set_space(space)

    # ------------------------------------------------------------------------------------------ the experiment

    def _has_space(self) -> bool:
        return self._domain is not None

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        """The next config: a point to evaluate first, then TPE's proposal (random for ``n_initial_points``)."""
        self._check_ready()
        hpo = self._hpo
        tid = self._trials.new_trial_ids(1)[0]
        if self._points:
            vals = self._points.pop(0)
            misc = {
                "tid": tid,
                "cmd": self._domain.cmd,
                "workdir": self._domain.workdir,
                "idxs": {label: [tid] if label in vals else [] for label in self._domain.params},
                "vals": {label: [vals[label]] if label in vals else [] for label in self._domain.params},
            }
            docs = self._trials.new_trial_docs([tid], [None], [self._domain.new_result()], [misc])
        else:
            self._trials.refresh()
            docs = self._algo([tid], self._domain, self._trials, int(self._rng.integers(2**31 - 1)))
        self._trials.insert_trial_docs(docs)
        self._trials.refresh()
        self._live[trial_id] = tid
        chosen = {label: values[0] for label, values in docs[0]["misc"]["vals"].items() if len(values)}
        return plain(hpo.space_eval(self._space, chosen))

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """Write the trial's loss (the metric, negated for ``mode='max'``) to HyperOpt's record, or a failure."""
        tid = self._live.pop(trial_id, None)
        if tid is None:
            return
        hpo = self._hpo
        doc = next(d for d in self._trials._dynamic_trials if d["tid"] == tid)
        value = self._reached(result, error)
        if value is not None:
            doc["result"] = {"loss": -value if self._mode == "max" else value, "status": hpo.STATUS_OK}
            doc["state"] = hpo.JOB_STATE_DONE
        else:
            doc["result"] = {"status": hpo.STATUS_FAIL}
            doc["state"] = hpo.JOB_STATE_ERROR
        self._trials.refresh()

    # --------------------------------------------------------------------------------------- save and restore

    def get_state(self) -> dict[str, Any]:
        """What ``save`` pickles: HyperOpt's ``Trials`` record, its random state, the space and the points left."""
        return {
            "trials": self._trials,
            "rng": self._rng,
            "space": self._space,
            "points": self._points,
            "live": self._live,
            "metric": self._metric,
            "mode": self._mode,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Take back what ``get_state`` returned (``restore``): the searcher goes on where it was saved."""
        self._trials, self._rng, self._space = state["trials"], state["rng"], state["space"]
        self._points, self._live = state["points"], state["live"]
        self._metric, self._mode = state["metric"], state["mode"]
        self._domain = self._hpo.Domain(_same, self._space)

    # ---------------------------------------------------------------------------------------------- the space

    def _set_space(self, space: Mapping[str, Any]) -> None:
        hpo = self._hpo
        native = _is_native(hpo, space)
        self._space = dict(space) if native else _converted(hpo, space, "")
        self._domain = hpo.Domain(_same, self._space)
        self._trials = hpo.Trials()
        self._points = []
        for i, point in enumerate(self._given_points):
            vals = dict(point) if native else _point_values(space, point, "", f"points_to_evaluate[{i}]")
            missing = sorted(set(_active_labels(self._domain, vals)) - set(vals))
            unknown = sorted(set(vals) - set(self._domain.params))
            if missing or unknown:
                raise ValueError(
                    f"HyperOptSearch(points_to_evaluate=...): point {i} "
                    + (f"leaves out {missing}" if missing else f"gives {unknown}, which the space does not have")
                    + ": give every parameter of the space ('a/b' for a nested key), and no other"
                )
            self._points.append(vals)


def _is_native(hpo: Any, space: Mapping[str, Any]) -> bool:
    """A space written with HyperOpt's ``hp.*`` (any value a pyll expression)."""
    apply = hpo.pyll.base.Apply

    def walk(value: Any) -> bool:
        if isinstance(value, apply):
            return True
        if isinstance(value, Mapping):
            return any(walk(v) for v in value.values())
        return isinstance(value, list | tuple) and any(walk(v) for v in value)

    return walk(space)


def _converted(hpo: Any, value: Any, label: str) -> Any:
    """A ``tune.*`` space as ``hp.*`` expressions; each parameter's label is its config path (``a/b``), a
    conditional choice's branches ``a/<index>/...``."""
    hp, scope = hpo.hp, hpo.pyll.scope
    if isinstance(value, Mapping) and not is_grid(value):
        return {key: _converted(hpo, v, f"{label}/{key}" if label else key) for key, v in value.items()}
    if is_grid(value):
        raise ValueError(
            f"{label}: tune.grid_search is not searched by HyperOptSearch (only the default search crosses grids); "
            "use tune.choice([...]) over the values"
        )
    if isinstance(value, SampleFrom):
        raise ValueError(
            f"{label}: tune.sample_from cannot be searched by HyperOptSearch (it cannot model a function's values); "
            "use a tune.* distribution, or compute the value from the others in the trainable"
        )
    if isinstance(value, Constant):
        return plain(value.value)
    if isinstance(value, Uniform):
        return hp.uniform(label, value.low, value.high)
    if isinstance(value, QUniform):
        return hp.quniform(label, value.low, value.high, value.q)
    if isinstance(value, LogUniform):
        return hp.loguniform(label, math.log(value.low), math.log(value.high))
    if isinstance(value, Normal):
        return hp.normal(label, value.mean, value.sd)
    if isinstance(value, RandInt):
        return hp.uniformint(label, value.low, value.high - 1)  # tune.randint's upper bound is exclusive
    if isinstance(value, QRandInt):
        return scope.int(hp.quniform(label, value.low, value.high, value.q))
    if isinstance(value, Pow2):
        return hp.choice(label, value.enumerate())
    if isinstance(value, Choice):
        return hp.choice(label, [_converted(hpo, v, f"{label}/{i}") for i, v in enumerate(value.values)])
    if isinstance(value, list | tuple):
        return [_converted(hpo, v, f"{label}/{i}") for i, v in enumerate(value)]
    return plain(value)


def _point_values(space: Any, point: Any, label: str, where: str) -> dict[str, Any]:
    """A point in config values as HyperOpt's values by label (a choice by its category's index)."""
    if isinstance(space, Mapping) and not is_grid(space):
        if not isinstance(point, Mapping):
            raise ValueError(f"HyperOptSearch: {where} gives {point!r} for {label or 'the config'}, a dict of parameters")
        vals: dict[str, Any] = {}
        for key, value in point.items():
            for part in key.split("/")[:-1]:  # "a/b" keys, as the trials table shows them
                space = space.get(part, {}) if isinstance(space, Mapping) else {}
            inner = key.split("/")[-1]
            if not isinstance(space, Mapping) or inner not in space:
                vals[f"{label}/{key}" if label else key] = value  # refused by the caller: not in the space
                continue
            vals.update(_point_values(space[inner], value, f"{label}/{key}" if label else key, where))
        return vals
    if isinstance(space, Choice | Pow2):
        categories = space.enumerate() if isinstance(space, Pow2) else list(space.values)
        for index, category in enumerate(categories):
            if not isinstance(category, Mapping) and plain(category) == point:
                return {label: index}
            if isinstance(category, Mapping) and isinstance(point, Mapping):
                constants = {k: v for k, v in category.items() if not isinstance(v, _DOMAINS)}
                if all(point.get(k) == plain(v) for k, v in constants.items()):
                    nested = {k: v for k, v in point.items() if k not in constants}
                    return {label: index, **_point_values(category, nested, f"{label}/{index}", where)}
        raise ValueError(f"HyperOptSearch: {where} gives {label}={point!r}, which is not one of its categories {categories}")
    if isinstance(space, _DOMAINS):
        return {label: point}
    return {}  # a constant: not searched


def _active_labels(domain: Any, vals: Mapping[str, Any]) -> list[str]:
    """The labels a point must give: the top-level ones and, in a conditional branch it chose, the branch's."""
    labels = []
    for label in domain.params:
        parts = label.split("/")
        # a label inside choice branch k of parent p reads p/k/...: needed only when the point chose k
        inside = [(("/".join(parts[:i])), parts[i]) for i in range(1, len(parts)) if parts[i].isdigit()]
        if all(vals.get(parent) == int(index) for parent, index in inside):
            labels.append(label)
    return labels
