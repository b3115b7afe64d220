"""``sweepflow.tune.search.ax.AxSearch``: Ax's Bayesian optimisation (Sobol trials first, then a BoTorch Gaussian
process) proposes each trial's config (Ray Tune's ``AxSearch``, same module path, arguments and meaning). Needs the
``ax`` extra (``pip install 'sweepflow[ax]'``: Ax 1.0 or later, on its ``ax.api.Client``).

The space is a dict of ``tune.*`` domains (converted as Ray does: ``uniform``/``loguniform`` -> a float range,
``loguniform`` on a log scale, ``randint`` -> an int range, ``choice`` -> a choice; ``qrandint``/``quniform`` -> an
ordered choice of their multiples of ``q``, ``pow2`` of its powers; nested dicts are ``a/b`` parameters), or Ray's
list of Ax parameter dicts (``{"name": ..., "type": "range" | "choice" | "fixed", ...}``) or of Ax's own
``RangeParameterConfig``/``ChoiceParameterConfig``, given here or as the experiment's ``config``/``param_space``.

Differs from Ray: Ax deprecated ``AxClient`` (removed in Ax 1.4), so ``ax_client`` is Ax's ``ax.api.Client`` and
``ax_kwargs`` are its arguments (``random_seed``, ``storage_config``; ``verbose_logging=False`` quiets Ax's log;
others refused). ``qrandint``, ``quniform`` and ``pow2`` are ordered choices of their values (as Ax makes of a
range with a step; Ray's drops ``q``); ``randn`` and ``sample_from`` are refused with the fix. Constants stay out
of Ax's experiment (Ray's makes them fixed parameters). A failed trial, or a last report without a finite metric,
is marked failed in Ax (Ray's leaves a failed one running in Ax, and abandons a NaN). Ax's objective is set once
the searcher has its metric and mode, so a bad outcome constraint is refused before any trial. A resumed
experiment's trial that ran with another config than the one Ax proposes again is attached to Ax as it ran.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sweepflow.tasks.compat import ax_experiment
from sweepflow.tasks.sweep.space import (
    RANDOM_DOMAINS,
    Choice,
    LogUniform,
    Pow2,
    QRandInt,
    QUniform,
    RandInt,
    Uniform,
    config_leaves,
    is_grid,
    plain,
)
from sweepflow.tune.search.library_searcher import LibrarySearcher

__all__ = ["AxSearch"]

log = logging.getLogger(__name__)

#: What ``ax_kwargs`` may hold: ``ax.api.Client``'s arguments, and Ray's ``verbose_logging`` (Ax's log level).
_CLIENT_KWARGS = ("random_seed", "storage_config", "verbose_logging")
#: The keys of each type of Ray's Ax parameter dicts (besides ``name`` and ``type``).
#: The most values a quantized domain (``qrandint``, ``quniform``, ``pow2``) may have as Ax's ordered choice.
_MAX_ORDERED = 1000
_DICT_KEYS = {"range": {"bounds", "value_type", "log_scale"}, "choice": {"values", "value_type", "is_ordered"},
              "fixed": {"value", "value_type"}}


def _ax() -> Any:
    try:
        from ax.api import client, configs
    except ImportError as exc:
        raise ImportError(
            "AxSearch needs Ax 1.0 or later (its ax.api.Client), which is not installed: pip install "
            "'sweepflow[ax]' (or 'ax-platform>=1.0')"
        ) from exc
    return client, configs


class AxSearch(LibrarySearcher):
    """Ray's ``AxSearch``: ``space`` (``tune.*`` domains, Ray's list of Ax parameter dicts, or Ax's parameter
    configs; None: the experiment's ``config``/``param_space``), ``metric``/``mode`` (or the experiment's),
    ``points_to_evaluate`` (configs the first trials run, attached to Ax's experiment), ``parameter_constraints``
    (``"x1 + x2 <= 1"``), ``outcome_constraints`` (``"m2 <= 3"``: each trial's last report must hold ``m2``),
    ``ax_client`` (an ``ax.api.Client``; one with its experiment and optimization configured brings the space,
    metric and mode: then give none of ``space``, ``metric``, ``mode`` and the constraints) and ``**ax_kwargs``
    (for the ``Client`` made here: ``random_seed``, ``storage_config``, ``verbose_logging``).

    Ax runs a few Sobol trials, then fits a Gaussian process to the results; it suggests nothing (the trial waits
    for a running one to end) while it needs more results than it has. A failed trial, or one whose last report
    lacks the metric, is marked failed in Ax."""

    def __init__(
        self,
        space: Mapping[str, Any] | Sequence[Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: Sequence[Mapping[str, Any]] | None = None,
        parameter_constraints: Sequence[str] | None = None,
        outcome_constraints: Sequence[str] | None = None,
        ax_client: Any = None,
        **ax_kwargs: Any,
    ) -> None:
        if points_to_evaluate is not None and (
            isinstance(points_to_evaluate, Mapping) or not isinstance(points_to_evaluate, Sequence)
        ):
            raise ValueError("AxSearch(points_to_evaluate=...): pass a list of configs (dicts)")
        unknown = sorted(set(ax_kwargs) - set(_CLIENT_KWARGS))
        if unknown:
            raise ValueError(
                f"AxSearch({', '.join(f'{k}=...' for k in unknown)}): ax_kwargs are ax.api.Client's arguments "
                f"{list(_CLIENT_KWARGS)}; configure anything else on a Client and pass it as ax_client"
            )
        super().__init__(metric=metric, mode=mode)  # checks them
        client_module, self._configs = _ax()
        if ax_kwargs.pop("verbose_logging", True) is False:
            from ax.utils.common.logger import set_stderr_log_level

            set_stderr_log_level(logging.WARNING)  # Ax's own log handler: its INFO lines per trial are dropped
        self._client_kwargs = ax_kwargs
        self._parameter_constraints = list(parameter_constraints or ())
        self._outcome_constraints = list(outcome_constraints or ())
        self._points = [_flat(p) for p in points_to_evaluate or ()]
        self._given: Any = None  # the user's Client with no experiment yet (configured from the space)
        self._client: Any = None  # the Client whose experiment is set up
        self._optimizing = False  # its objective is configured
        self._fixed: dict[str, Any] = {}  # Ray's "fixed" parameters: merged into each suggestion
        self._outcomes: list[str] = []  # the metrics of the outcome constraints
        self._live: dict[str, int] = {}  # trial id -> Ax trial index
        if ax_client is not None:
            self._take_client(ax_client, client_module.Client, bool(ax_kwargs), space)
        if space and self._client is None:
            self._set_space(space)
        if self._client is not None and self._metric and self._mode:
            self._optimize()  # Ax's objective and outcome constraints checked here, as Ray's

    def _take_client(self, client: Any, client_class: type, has_kwargs: bool, space: Any) -> None:
        """Ray's ``ax_client``: a configured one brings the space, metric and mode; a bare one gets the space."""
        if not isinstance(client, client_class):
            raise ValueError(
                f"AxSearch(ax_client={type(client).__name__}(...)): give an ax.api.Client (Ax deprecated AxClient, "
                "removed in Ax 1.4), configured with configure_experiment and configure_optimization, or leave "
                "ax_client out and give space, metric and mode"
            )
        if has_kwargs:
            raise ValueError("AxSearch: ax_kwargs are for the Client AxSearch makes; give them to your ax_client")
        experiment = ax_experiment(client)
        if experiment is None:
            self._given = client
            return
        given = {"space": space, "metric": self._metric, "mode": self._mode,
                 "parameter_constraints": self._parameter_constraints, "outcome_constraints": self._outcome_constraints}
        if any(given.values()) or experiment.optimization_config is None:
            raise ValueError(
                f"AxSearch(ax_client=...): a Client with its experiment set brings the space, metric and mode; "
                f"leave out {[k for k, v in given.items() if v] or 'nothing'} and call its configure_optimization "
                "before passing it"
            )
        objective = experiment.optimization_config.objective
        names = _metric_names(objective)
        if len(names) != 1:
            raise ValueError(f"AxSearch(ax_client=...): its objective {names} is not one metric; AxSearch searches one")
        self._client, self._optimizing = client, True
        self._metric, self._mode = names[0], "min" if objective.minimize else "max"
        self._outcomes = _outcome_metrics(experiment)
        self._check_points(experiment)

    # ------------------------------------------------------------------------------------------ the experiment

    def _has_space(self) -> bool:
        return self._client is not None

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any) -> bool:
        """The experiment's metric, mode and space, unless the searcher was given a space (then False, as in Ray;
        the experiment's metric/mode still fill those the searcher lacks before Ax's objective is set)."""
        if self._has_space() and not self._optimizing:
            self._metric, self._mode = self._metric or metric, self._mode or mode
        # A searcher saved with its experiment (Tuner.restore) took that experiment's space: it takes it again.
        took = getattr(self, "_took_config", False) or super().set_search_properties(metric, mode, config, **spec)
        self._took_config = took
        if self._metric and self._mode:
            self._optimize()  # before any trial: Ax refuses a bad outcome constraint here
        return took

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        """A point to evaluate first (attached to Ax's experiment), then Ax's next trial; None while Ax waits for
        more results."""
        self._check_ready()
        self._optimize()
        from ax.exceptions.core import DataRequiredError
        from ax.exceptions.generation_strategy import MaxParallelismReachedException

        if self._points:
            point = self._points.pop(0)
            index, parameters = self._client.attach_trial(parameters=point), point
        else:
            try:
                trials = self._client.get_next_trials(max_trials=1)
            except (DataRequiredError, MaxParallelismReachedException) as exc:
                log.debug("AxSearch: Ax suggests no trial now (%s)", exc)
                return None
            if not trials:
                return None
            index, parameters = next(iter(trials.items()))
        self._live[trial_id] = index
        return plain({**self._fixed, **parameters})

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """Complete the trial in Ax with its metric (and the outcome constraints' metrics); a failure, or a last
        report without them, is marked failed."""
        index = self._live.pop(trial_id, None)
        if index is None:
            return
        index = self._ran_as(index, result)
        value = self._reached(result, error)
        if value is None:
            reason = "the trial failed" if error else f"its last report has no finite {self._metric!r}"
            self._client.mark_trial_failed(trial_index=index, failed_reason=reason)
            return
        raw = {self._metric: value}
        for name in self._outcomes:
            outcome = (result or {}).get(name)
            if not isinstance(outcome, int | float) or isinstance(outcome, bool):
                self._client.mark_trial_failed(
                    trial_index=index, failed_reason=f"its last report has no {name!r} (an outcome constraint's)"
                )
                return
            raw[name] = float(outcome)
        self._client.complete_trial(trial_index=index, raw_data=raw)

    def _ran_as(self, index: int, result: dict[str, Any] | None) -> int:
        """The Ax trial of the config the trial ran with: a resumed experiment asks again for each trial that
        already ran and keeps the config it ran with; when Ax proposed another, its trial is abandoned and the
        config that ran is attached."""
        ran = (result or {}).get("config")
        if not isinstance(ran, Mapping):
            return index
        experiment = ax_experiment(self._client)
        ran = {k: v for k, v in _flat(ran).items() if k in experiment.parameters}
        if set(ran) != set(experiment.parameters) or ran == dict(experiment.trials[index].arm.parameters):
            return index
        self._client.mark_trial_abandoned(trial_index=index)
        return self._client.attach_trial(parameters=ran)

    def get_state(self) -> dict[str, Any]:
        """What ``save`` pickles: Ax's Client (its experiment, trials and generation strategy) and the trials
        running."""
        return {key: getattr(self, key) for key in _STATE}

    def set_state(self, state: dict[str, Any]) -> None:
        """Take back what ``get_state`` returned (``restore``)."""
        for key in _STATE:
            setattr(self, key, state[key])

    # ---------------------------------------------------------------------------------------------- the space

    def _set_space(self, space: Any) -> None:
        parameters, self._fixed = _parameters(self._configs, space)
        client = self._given if self._given is not None else _ax()[0].Client(**self._client_kwargs)
        try:
            client.configure_experiment(parameters=parameters, parameter_constraints=self._parameter_constraints)
        except (ValueError, TypeError, KeyError, _user_error()) as exc:
            raise ValueError(f"AxSearch: Ax refuses the space or parameter_constraints: {exc}") from None
        self._client, self._given = client, None
        self._check_points(ax_experiment(client))

    def _optimize(self) -> None:
        """Set Ax's objective (the metric, negated for ``mode='min'``) and outcome constraints, once."""
        if self._optimizing:
            return
        objective = f"-{self._metric}" if self._mode == "min" else str(self._metric)
        try:
            self._client.configure_optimization(objective=objective, outcome_constraints=self._outcome_constraints)
        except (ValueError, TypeError, KeyError, _user_error()) as exc:
            raise ValueError(f"AxSearch: Ax refuses metric={self._metric!r} or outcome_constraints: {exc}") from None
        self._optimizing = True
        self._outcomes = _outcome_metrics(ax_experiment(self._client))

    def _check_points(self, experiment: Any) -> None:
        names = sorted(experiment.parameters)
        for i, point in enumerate(self._points):
            searched = {k: v for k, v in point.items() if k not in self._fixed}
            if sorted(searched) != names:
                raise ValueError(
                    f"AxSearch(points_to_evaluate=...): point {i} gives {sorted(searched)}; give exactly the "
                    f"space's parameters {names} ('a/b' for a nested key)"
                )
            try:
                experiment.search_space.check_membership(searched, raise_error=True)
            except ValueError as exc:
                raise ValueError(f"AxSearch(points_to_evaluate=...): point {i} is outside the space: {exc}") from None
            self._points[i] = searched


_STATE = ("_client", "_optimizing", "_fixed", "_outcomes", "_live", "_points", "_metric", "_mode")


def _user_error() -> type[Exception]:
    """Ax's error for a mistake in what it was given (not a ValueError in Ax 1.x)."""
    from ax.exceptions.core import UserInputError

    return UserInputError


def _flat(point: Mapping[str, Any]) -> dict[str, Any]:
    """A config with nested dicts as ``a/b`` keys (Ax's parameter names)."""
    return {"/".join(path): value for path, value in config_leaves(dict(point))}


def _metric_names(objective: Any) -> list[str]:
    names = getattr(objective, "metric_names", None)  # Ax 1.3; before: objective.metric
    return list(names) if names is not None else [objective.metric.name]


def _outcome_metrics(experiment: Any) -> list[str]:
    """The metrics the experiment's outcome constraints name (each trial's report must hold them)."""
    config = experiment.optimization_config
    names: list[str] = []
    for constraint in config.outcome_constraints if config is not None else ():
        names += _metric_names(constraint)
    return names


def _parameters(configs: Any, space: Any) -> tuple[list[Any], dict[str, Any]]:
    """Ax's parameter configs of a space, and its fixed values (merged into each suggestion)."""
    if isinstance(space, Mapping):
        parameters, fixed = _converted(configs, space), {}
    elif isinstance(space, Sequence) and not isinstance(space, str):
        parameters, fixed = [], {}
        for i, item in enumerate(space):
            if isinstance(item, configs.RangeParameterConfig | configs.ChoiceParameterConfig):
                parameters.append(item)
            elif isinstance(item, Mapping) and item.get("type") == "fixed":
                fixed[str(item.get("name"))] = item.get("value")
            elif isinstance(item, Mapping):
                parameters.append(_from_dict(configs, i, item))
            else:
                raise ValueError(
                    f"AxSearch(space=[...]): item {i} is {type(item).__name__}; give Ax parameter dicts "
                    "({'name': ..., 'type': 'range', 'bounds': [lo, hi]}) or RangeParameterConfig/ChoiceParameterConfig"
                )
    else:
        raise ValueError(
            f"AxSearch(space={type(space).__name__}): give a dict of tune.* domains or a list of Ax parameters"
        )
    if not parameters:
        raise ValueError("AxSearch: the space has nothing to search (no tune.* domains, no range or choice)")
    return parameters, fixed


def _from_dict(configs: Any, i: int, item: Mapping[str, Any]) -> Any:
    """Ray's (``AxClient``'s) parameter dict as Ax's parameter config."""
    kind, name = item.get("type"), item.get("name")
    extra = set(item) - {"name", "type"} - _DICT_KEYS.get(str(kind), set())
    if kind not in _DICT_KEYS or not isinstance(name, str) or extra:
        raise ValueError(
            f"AxSearch(space=[...]): item {i} ({dict(item)!r}) is not an Ax parameter AxSearch takes: a 'name', a "
            "'type' of 'range' (bounds, value_type, log_scale), 'choice' (values, value_type, is_ordered) or "
            "'fixed' (value)"
        )
    if kind == "range":
        low, high = item["bounds"]
        value_type = item.get("value_type") or ("int" if all(isinstance(b, int) for b in (low, high)) else "float")
        return configs.RangeParameterConfig(
            name=name, bounds=(low, high), parameter_type=value_type,
            scaling="log" if item.get("log_scale") else None,
        )
    values = list(item["values"])
    return configs.ChoiceParameterConfig(
        name=name, values=values, parameter_type=item.get("value_type") or _value_type(name, values),
        is_ordered=item.get("is_ordered"),
    )


def _converted(configs: Any, space: Mapping[str, Any]) -> list[Any]:
    """A ``tune.*`` space as Ax parameter configs of its searched leaves (``a/b`` names); constants are left to
    the experiment (the sweep merges them under each suggestion)."""
    parameters: list[Any] = []
    for path, value in config_leaves(dict(space)):
        label = "/".join(path)
        if is_grid(value):
            raise ValueError(f"{label}: tune.grid_search is not searched by AxSearch (as Ray's); use tune.choice([...])")
        if not isinstance(value, RANDOM_DOMAINS):  # a constant: the sweep merges it under each suggestion
            continue
        if isinstance(value, Uniform | LogUniform):
            parameters.append(configs.RangeParameterConfig(
                name=label, bounds=(float(value.low), float(value.high)), parameter_type="float",
                scaling="log" if isinstance(value, LogUniform) else None,
            ))
        elif isinstance(value, RandInt):  # tune.randint's upper bound is exclusive
            parameters.append(configs.RangeParameterConfig(
                name=label, bounds=(value.low, value.high - 1), parameter_type="int"
            ))
        elif isinstance(value, QRandInt | QUniform | Pow2 | Choice):
            values = _ordered(label, value) if not isinstance(value, Choice) else list(value.values)
            if len(set(map(repr, values))) < 2:
                raise ValueError(f"{label}: a choice of one value is a constant; give it as the value itself")
            parameters.append(configs.ChoiceParameterConfig(
                name=label, values=values, parameter_type=_value_type(label, values),
                is_ordered=not isinstance(value, Choice),  # tune.choice is categorical
            ))
        else:
            raise ValueError(
                f"{label}: {type(value).__name__} is not searched by AxSearch (it takes uniform, loguniform, "
                "randint, qrandint, quniform, pow2 and choice); use one of those, or give Ax parameters as the space"
            )
    return parameters


def _ordered(label: str, value: QRandInt | QUniform | Pow2) -> list[Any]:
    """The values of a quantized domain, for Ax's ordered choice (as Ax makes of a range with a step)."""
    if isinstance(value, QUniform):  # the multiples of q its samples round to
        low, high = round(value.low / value.q), round(value.high / value.q)
        values: list[Any] = [float(k * value.q) for k in range(low, high + 1)]
    else:
        values = value.enumerate()
    if len(values) > _MAX_ORDERED:
        raise ValueError(
            f"{label}: {len(values)} values are too many for Ax's ordered choice (at most {_MAX_ORDERED}); use "
            "tune.uniform or tune.randint over the range instead"
        )
    return values


def _value_type(label: str, values: Sequence[Any]) -> str:
    """Ax's type of a choice's values: all bool, all int, all numbers (float) or all str."""
    for kind, types in (("bool", bool), ("int", int), ("float", int | float), ("str", str)):
        if all(isinstance(v, types) and (kind == "bool" or not isinstance(v, bool)) for v in values):
            return kind
    raise ValueError(
        f"{label}: AxSearch chooses among values of one type (bool, int, float or str), not {list(values)!r}; "
        "choose among names and look the value up in the trainable"
    )
