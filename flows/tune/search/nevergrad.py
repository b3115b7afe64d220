"""``sweepflow.tune.search.nevergrad.NevergradSearch``: a Nevergrad optimizer proposes each trial's config (Ray
Tune's ``NevergradSearch``, same module path, arguments and meaning), on Nevergrad's own ask/tell. Needs the
``nevergrad`` extra (``pip install 'sweepflow[nevergrad]'``).

The space is a dict of ``tune.*`` domains (converted to ``ng.p`` parameters: ``uniform`` -> ``Scalar``,
``loguniform`` -> ``Log``, ``randint``/``qrandint`` -> an integer ``Scalar``, ``choice`` -> ``Choice``; nested
dicts are ``a/b`` parameters), or Nevergrad's own ``ng.p.Dict`` / keyword ``ng.p.Instrumentation``, given here or
as the experiment's ``config``/``param_space``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from sweepflow.tasks.sweep.space import (
    RANDOM_DOMAINS,
    Choice,
    LogUniform,
    QRandInt,
    RandInt,
    Uniform,
    config_leaves,
    is_grid,
    plain,
)
from sweepflow.tune.search.library_searcher import LibrarySearcher

__all__ = ["NevergradSearch"]


def _nevergrad() -> Any:
    try:
        import nevergrad
    except ImportError as exc:
        raise ImportError(
            "NevergradSearch needs Nevergrad, which is not installed: pip install 'sweepflow[nevergrad]' (or "
            "'nevergrad>=1.0')"
        ) from exc
    return nevergrad


class NevergradSearch(LibrarySearcher):
    """Ray's ``NevergradSearch``: ``optimizer`` (a Nevergrad optimizer class such as ``ng.optimizers.OnePlusOne``,
    a configured one such as ``ng.families.ParametrizedOnePlusOne(...)``, or an optimizer made with its own
    parametrization), ``optimizer_kwargs`` (given to the class with the parametrization, e.g. ``budget``),
    ``space`` (``tune.*`` domains or an ``ng.p.Dict``; None: the experiment's ``config``/``param_space``),
    ``metric``/``mode`` (or the experiment's) and ``points_to_evaluate`` (configs the first trials run).

    Nevergrad minimises: a ``mode="max"`` metric is told negated. A failed trial, or one whose last report lacks
    the metric, is not told (as in Ray)."""

    def __init__(
        self,
        optimizer: Any = None,
        optimizer_kwargs: Mapping[str, Any] | None = None,
        space: Any = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        if points_to_evaluate is not None and (
            isinstance(points_to_evaluate, Mapping) or not isinstance(points_to_evaluate, Sequence)
        ):
            raise ValueError("NevergradSearch(points_to_evaluate=...): pass a list of configs (dicts)")
        super().__init__(metric=metric, mode=mode)  # checks them
        self._ng = ng = _nevergrad()
        self._optimizer_kwargs = dict(optimizer_kwargs or {})
        self._points = [dict(p) for p in points_to_evaluate or ()]
        self._factory: Any = None
        self._opt: Any = None
        self._live: dict[str, Any] = {}  # trial id -> Nevergrad candidate
        self._keywords = False  # the parametrization is an ng.p.Instrumentation (else an ng.p.Dict)
        base = ng.optimization.base
        if isinstance(optimizer, base.Optimizer):
            if space is not None:
                raise ValueError(
                    "NevergradSearch: an optimizer made with its own parametrization searches that; leave space out"
                )
            if self._optimizer_kwargs:
                raise ValueError(
                    "NevergradSearch(optimizer_kwargs=...) are for an optimizer class; give them to the optimizer "
                    "you made, or pass its class"
                )
            self._set_optimizer(optimizer)
        elif (inspect.isclass(optimizer) and issubclass(optimizer, base.Optimizer)) or isinstance(
            optimizer, base.ConfiguredOptimizer
        ):
            self._factory = optimizer
            if space is not None:
                self._set_space(space)
        else:
            raise ValueError(
                f"NevergradSearch(optimizer={optimizer!r}): give a Nevergrad optimizer class (e.g. "
                "ng.optimizers.OnePlusOne), a configured optimizer, or an optimizer instance"
            )

    # ------------------------------------------------------------------------------------------ the experiment

    def _has_space(self) -> bool:
        return self._opt is not None

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        """The optimizer's next candidate (the points to evaluate first)."""
        self._check_ready()
        candidate = self._opt.ask()
        self._live[trial_id] = candidate
        return plain(candidate.kwargs if self._keywords else candidate.value)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """Tell the optimizer the trial's metric (negated for ``mode='max'``); a failure is not told."""
        candidate = self._live.pop(trial_id, None)
        value = self._reached(result, error)
        if candidate is not None and value is not None:
            self._opt.tell(candidate, -value if self._mode == "max" else value)

    def get_state(self) -> dict[str, Any]:
        """What ``save`` pickles: the optimizer (its parametrization and history) and the trials running."""
        return {
            "opt": self._opt, "live": self._live, "keywords": self._keywords, "metric": self._metric, "mode": self._mode
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Take back what ``get_state`` returned (``restore``)."""
        self._opt, self._live, self._keywords = state["opt"], state["live"], state["keywords"]
        self._metric, self._mode = state["metric"], state["mode"]

    # ---------------------------------------------------------------------------------------------- the space

    def _set_space(self, space: Any) -> None:
        ng = self._ng
        parametrization = space if isinstance(space, ng.p.Parameter) else _converted(ng, space)
        self._set_optimizer(self._factory(parametrization=parametrization, **self._optimizer_kwargs))

    def _set_optimizer(self, optimizer: Any) -> None:
        parametrization = optimizer.parametrization
        self._keywords = isinstance(parametrization, self._ng.p.Instrumentation)
        if (self._keywords and parametrization.args) or not (
            self._keywords or isinstance(parametrization, self._ng.p.Dict)
        ):
            raise ValueError(
                f"NevergradSearch: the optimizer's parametrization is {type(parametrization).__name__}, not "
                "ng.p.Dict(...) or an ng.p.Instrumentation of keyword parameters only: name each parameter as "
                "its config key"
            )
        self._opt = optimizer
        # Nevergrad asks suggested points last-in first-out: the first point is suggested last.
        for point in reversed(self._points):
            try:
                optimizer.suggest(**point) if self._keywords else optimizer.suggest(point)
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(
                    f"NevergradSearch(points_to_evaluate=...): {point!r} does not fit the space ({exc}); give each "
                    "parameter of the space by name ('a/b' for a nested key)"
                ) from None


def _converted(ng: Any, space: Mapping[str, Any]) -> Any:
    """A ``tune.*`` space as an ``ng.p.Dict`` of its searched leaves (``a/b`` names); constants are left to the
    experiment (the sweep merges them under each suggestion)."""
    params: dict[str, Any] = {}
    for path, value in config_leaves(dict(space)):
        label = "/".join(path)
        if is_grid(value):
            raise ValueError(f"{label}: tune.grid_search is not searched by NevergradSearch; use tune.choice([...])")
        if not isinstance(value, RANDOM_DOMAINS):  # a constant: the sweep merges it under each suggestion
            continue
        if isinstance(value, Uniform):
            params[label] = ng.p.Scalar(lower=value.low, upper=value.high)
        elif isinstance(value, LogUniform):
            params[label] = ng.p.Log(lower=value.low, upper=value.high)
        elif isinstance(value, RandInt):  # tune.randint's upper bound is exclusive
            params[label] = ng.p.Scalar(lower=value.low, upper=value.high - 1).set_integer_casting()
        elif isinstance(value, QRandInt):
            params[label] = ng.p.Choice(value.enumerate())  # its multiples of q in [low, high]
        elif isinstance(value, Choice):
            params[label] = ng.p.Choice(list(value.values))
        else:
            raise ValueError(
                f"{label}: {type(value).__name__} is not searched by NevergradSearch (Ray's converts uniform, "
                "loguniform, randint and choice); use one of those, or give an ng.p.Dict space"
            )
    if not params:
        raise ValueError("NevergradSearch: the space has nothing to search (no tune.* domains)")
    return ng.p.Dict(**params)
