"""Ray Tune's search space helpers (``tune.choice``, ``loguniform``, ``grid_search``, ``sample_from`` ...) and the
sampler that searches a ``param_space`` with a ``search_alg`` (``SearchSampler``). Without one, a ``param_space`` is
resolved into trial configs the way Ray's ``BasicVariantGenerator`` does by the sweep's own ``RandomSampler``
(``sweepflow.tasks.sweep.samplers``, on ``parse_param_space``).

The helpers return the sweep's own domains (``sweepflow.tasks.sweep.space``): one vocabulary for a script's
``tune.run`` and a deployment's ``search_space`` data (``tune.loguniform(1e-4, 1e-1)`` is the domain that
``{"type": "loguniform", "low": 1e-4, "high": 1e-1}`` parses to). ``sample_from`` functions may read the values
already resolved for the trial (``spec.config.other_param``), as in Ray.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sweepflow.tasks.sweep.samplers import Sampler, TPESampler
from sweepflow.tasks.sweep.space import (
    RANDOM_DOMAINS,
    Choice,
    Constant,
    LogUniform,
    Normal,
    QRandInt,
    QUniform,
    RandInt,
    SampleFrom,
    SearchSpace,
    Uniform,
    config_leaves,
    grid_values,
    is_grid,
    set_leaf,
)

#: What a value drawn per trial is (``isinstance(value, Domain)``): every domain the helpers below return.
Domain = RANDOM_DOMAINS


def choice(categories: Sequence[Any]) -> Choice:
    """A value drawn per trial from ``categories``, each equally likely (Ray's ``tune.choice``).

    Returns the sweep's ``Choice`` domain rather than Ray's ``Categorical``: Ray's chaining methods
    (``.uniform()``, ``.quantized()``) are not there.

    Raises:
        ValueError: ``categories`` is empty.
    """
    if len(categories) == 0:
        raise ValueError("tune.choice needs at least one category")
    return Choice(tuple(categories))


def uniform(lower: float, upper: float) -> Uniform:
    """A float drawn per trial uniformly from [lower, upper) (Ray's ``tune.uniform``).

    Raises:
        ValueError: ``lower`` is not below ``upper``.
    """
    _check_range("uniform", lower, upper)
    return Uniform(float(lower), float(upper))


def quniform(lower: float, upper: float, q: float) -> QUniform:
    """A float drawn uniformly from [lower, upper] and rounded to a multiple of ``q`` (Ray's
    ``tune.quniform``).

    Raises:
        ValueError: ``lower`` is not below ``upper``, or ``q`` is not positive.
    """
    _check_range("quniform", lower, upper)
    if not q > 0:
        raise ValueError(f"tune.quniform(lower, upper, q) needs q > 0, got q={q}")
    return QUniform(float(lower), float(upper), float(q))


def loguniform(lower: float, upper: float, base: float = 10) -> LogUniform:
    """``base`` is accepted as in Ray; the distribution is the same for every base."""
    _check_range("loguniform", lower, upper)
    if lower <= 0:
        raise ValueError(f"tune.loguniform needs 0 < lower < upper, got lower={lower}")
    return LogUniform(float(lower), float(upper))


def randn(mean: float = 0.0, sd: float = 1.0) -> Normal:
    """A float drawn per trial from a normal distribution with ``mean`` and standard deviation ``sd`` (Ray's
    ``tune.randn``).

    Raises:
        ValueError: ``sd`` is not positive.
    """
    if not sd > 0:
        raise ValueError(f"tune.randn(mean, sd) needs sd > 0, got sd={sd}")
    return Normal(float(mean), float(sd))


def randint(lower: int, upper: int) -> RandInt:
    """An integer in [lower, upper) (upper exclusive, as Ray's)."""
    _check_range("randint", lower, upper)
    return RandInt(int(lower), int(upper))


def qrandint(lower: int, upper: int, q: int = 1) -> QRandInt:
    """A multiple of ``q`` in [lower, upper] (upper inclusive, as Ray's)."""
    _check_range("qrandint", lower, upper)
    if int(q) < 1:
        raise ValueError(f"tune.qrandint(lower, upper, q) needs q >= 1, got q={q}")
    return QRandInt(int(lower), int(upper), int(q))


def sample_from(func: Callable[..., Any]) -> SampleFrom:
    """A value computed per trial by ``func(spec)``; ``spec.config`` holds the trial's other resolved values."""
    if not callable(func):
        raise TypeError(f"tune.sample_from takes a function, got {type(func).__name__}")
    return SampleFrom(func)


def grid_search(values: Sequence[Any]) -> dict[str, list[Any]]:
    """Every value is tried (crossed with the other grids), in each of the ``num_samples`` repeats."""
    return {"grid_search": list(values)}


def _check_range(name: str, lower: float, upper: float) -> None:
    if not lower < upper:
        raise ValueError(f"tune.{name}(lower, upper) needs lower < upper, got {lower}, {upper}")


# ---------------------------------------------------------------------------------------- searching configs


class SearchSampler(Sampler):
    """A ``search_alg`` (e.g. ``OptunaSearch``) as the sweep's sampler: it proposes each config from the results
    told so far. Nested keys of the space are searched as ``"a/b"`` and given back nested.

    ``points_to_evaluate``: the first trials' configs (a point may leave searched parameters out: TPE proposes
    them); with ``evaluated_rewards`` they are not run but told to TPE with those results, as finished trials."""

    def __init__(
        self,
        param_space: Mapping[str, Any],
        *,
        num_samples: int,
        metric: str | None,
        mode: str | None,
        seed: int | None,
        n_startup_trials: int,
        points_to_evaluate: Sequence[Mapping[str, Any]] = (),
        evaluated_rewards: Sequence[float] = (),
        objectives: Sequence[tuple[str, str]] = (),
        optuna_sampler: Any = None,
    ):
        params: list[tuple[str, Any]] = []
        for path, value in config_leaves(dict(param_space)):
            if is_grid(value) or isinstance(value, SampleFrom):
                raise ValueError(
                    f"search_alg cannot search {'/'.join(path)!r} ({'grid_search' if is_grid(value) else 'sample_from'}): "
                    "a search algorithm proposes values itself; use tune.choice/uniform/loguniform/randint instead"
                )
            params.append(("/".join(path), value if isinstance(value, Domain) else Constant(value)))
        self._tpe = TPESampler(
            SearchSpace(tuple(params)),
            mode=mode,
            seed=seed,
            num_samples=num_samples,
            n_startup_trials=n_startup_trials,
            modes=[m for _, m in objectives],
            sampler=optuna_sampler,
        )
        self.objectives = tuple(objectives)
        self.total = num_samples
        names = {name for name, _ in params}
        points = [flat_point(point, names) for point in points_to_evaluate]
        for i, point in enumerate(points):
            unknown = sorted(set(point) - names)
            if unknown:
                raise ValueError(
                    f"points_to_evaluate[{i}] gives {unknown}, which the search space does not have (it has "
                    f"{sorted(names)}): name the space's parameters (nested keys as dicts, or 'a/b')"
                )
            try:
                self._tpe.optuna_params(point)  # a choice's value must be one of its categories
            except ValueError as exc:
                raise ValueError(f"points_to_evaluate[{i}]: {exc}") from exc
        self._points: deque[dict[str, Any]] = deque()
        if evaluated_rewards:
            for i, (point, reward) in enumerate(zip(points, evaluated_rewards, strict=True)):
                try:
                    self._tpe.add_evaluated(point, reward)
                except ValueError as exc:
                    raise ValueError(f"points_to_evaluate[{i}] with evaluated_rewards[{i}]: {exc}") from exc
        else:
            if len(points) > num_samples:
                raise ValueError(
                    f"{len(points)} points_to_evaluate, but num_samples={num_samples} trials: the last points would "
                    f"never run; raise num_samples to at least {len(points)} or give fewer points"
                )
            self._points.extend(points)

    def ask(self) -> tuple[int, dict[str, Any]]:
        """The next trial's (number, config): the next of ``points_to_evaluate`` first, then TPE's proposals,
        with ``"a/b"`` keys nested again.
        """
        if self._points:  # the points are the first trials, in the order given
            self._tpe.enqueue(self._points.popleft())
        number, flat = self._tpe.ask()
        config: dict[str, Any] = {}
        for key, value in flat.items():
            set_leaf(config, tuple(key.split("/")), value)
        return number, config

    def ask_known(self, config: dict[str, Any]) -> int:
        """A resumed experiment's trial that already ran with ``config``, recorded as the search's next proposal."""
        if self._points:  # it was proposed in a point's turn: the point is spent (config holds its values)
            self._points.popleft()
        return self._tpe.ask_known({"/".join(path): value for path, value in config_leaves(config)})

    def tell(self, number: int, value: float | None) -> None:
        """Tell TPE trial ``number``'s result: the best value of the metric it reached, or None if it failed.
        """
        self._tpe.tell(number, value)

    def tell_result(self, number: int, result: Any) -> None:
        """An ended trial: its best value of the metric, or (several objectives) each one's last value, as Ray's
        multi-objective ``OptunaSearch`` tells them."""
        if self.objectives:
            self._tpe.tell(number, [result.last.get(name) for name, _ in self.objectives] if result.status.selectable else None)
        else:
            super().tell_result(number, result)


def flat_point(point: Mapping[str, Any], names: set[str] | None = None, prefix: str = "") -> dict[str, Any]:
    """A config as ``{"a/b": value}``: nested dicts are opened down to the parameter names in ``names`` (a value
    that is itself a dict, e.g. one of a choice's categories, stays whole); without ``names``, all the way."""
    flat: dict[str, Any] = {}
    for key, value in point.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and (names is None or path not in names):
            flat.update(flat_point(value, names, f"{path}/"))
        else:
            flat[path] = value
    return flat


def space_as_data(param_space: Mapping[str, Any]) -> dict[str, Any]:
    """The top level of a ``param_space`` in the sweep's data form (what the sweep report draws its axes from):
    domains as their data, ``grid_search`` as a grid, ``sample_from`` by its kind (a function has no bounds),
    plain values as they are; nested dicts are left out (the report plots top-level parameters)."""
    data: dict[str, Any] = {}
    for key, value in param_space.items():
        if isinstance(value, SampleFrom):
            data[key] = {"type": "sample_from"}
        elif isinstance(value, Domain):
            data[key] = value.to_raw()
        elif is_grid(value):
            data[key] = {"type": "grid", "values": grid_values(value)}
        elif not isinstance(value, Mapping):
            data[key] = value
    return data
