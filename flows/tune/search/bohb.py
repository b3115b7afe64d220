"""``sweepflow.tune.search.bohb.TuneBOHB``: BOHB's model (hpbandster's ``BOHB`` config generator: kernel density
estimates of the good and the bad configs at the largest budget with enough results) proposes each trial's config
(Ray Tune's ``TuneBOHB``, same module path, arguments and meaning). Use it with
``sweepflow.tune.schedulers.HyperBandForBOHB``. Needs the ``bohb`` extra (``pip install 'sweepflow[bohb]'``:
hpbandster and ConfigSpace).

The space is a dict of ``tune.*`` domains, converted to a ``ConfigSpace.ConfigurationSpace`` as Ray does
(``uniform``/``loguniform`` -> ``UniformFloatHyperparameter``, ``randint`` -> ``UniformIntegerHyperparameter``
with its exclusive upper bound made inclusive, ``choice`` -> ``CategoricalHyperparameter``, ``randn`` ->
``NormalFloatHyperparameter``; nested dicts are ``a/b`` parameters), or a ``ConfigurationSpace`` of your own, used
as it is; given here or as the experiment's ``config``/``param_space``.

Differs from Ray: ConfigSpace 1.x has no quantized parameters (Ray passes ``q=``), so ``qrandint``/``quniform``
are categorical over their multiples of ``q`` (the same values; BOHB's model does not order them), and a normal
parameter needs bounds, so ``randn`` is cut at its mean +- 4 sd. Each report is told to BOHB at the budget of its
``training_iteration`` (Ray tells it at HyperBand's milestone, which is that count at the milestone; here the
searcher hears of a report before the scheduler, so every report is told, and BOHB models the largest budget
with enough results, as it does with Ray's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sweepflow.tasks.sweep.space import (
    RANDOM_DOMAINS,
    Choice,
    LogUniform,
    Normal,
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

__all__ = ["TuneBOHB"]

#: How far from its mean a ``tune.randn`` parameter is searched, in standard deviations (ConfigSpace 1.x needs
#: bounds for a normal parameter).
NORMAL_SDS = 4.0


def _bohb() -> tuple[Any, Any]:
    """(ConfigSpace, hpbandster's BOHB config generator class); one sentence naming the extra without them."""
    try:
        import ConfigSpace
        from hpbandster.optimizers.config_generators.bohb import BOHB
    except ImportError as exc:
        raise ImportError(
            "TuneBOHB needs hpbandster and ConfigSpace, which are not installed: pip install 'sweepflow[bohb]' (or "
            "'hpbandster>=0.7.4' 'ConfigSpace>=0.4.18')"
        ) from exc
    return ConfigSpace, BOHB


class _Job:
    """What hpbandster's ``new_result`` reads of a finished run: its loss, budget and config."""

    def __init__(self, loss: float, budget: float, config: dict[str, Any]) -> None:
        self.result = {"loss": loss}
        self.kwargs = {"budget": budget, "config": dict(config)}
        self.exception = None


class TuneBOHB(LibrarySearcher):
    """Ray's ``TuneBOHB``: ``space`` (``tune.*`` domains or a ``ConfigSpace.ConfigurationSpace``; None: the
    experiment's ``config``/``param_space``), ``bohb_config`` (hpbandster ``BOHB``'s arguments:
    ``min_points_in_model``, ``top_n_percent``, ``num_samples``, ``random_fraction``, ``bandwidth_factor``,
    ``min_bandwidth``), ``metric``/``mode`` (or the experiment's), ``points_to_evaluate`` (configs the first trials
    run, by the space's parameter names: ``a/b`` or nested dicts), ``seed`` (seeds the space's sampling, as in Ray;
    BOHB's model draws from NumPy's global state) and ``max_concurrent`` (0 only, see below).

    Each report is told to BOHB as ``(loss, budget, config)``: the metric (negated for ``mode="max"``), the report's
    ``training_iteration`` (or a ``hyperband_info["budget"]`` the report carries) and the trial's config; a non-finite
    metric counts as a bad config, as hpbandster does. An ended trial is not told again (as in Ray).

    Differs from Ray: ``max_concurrent`` > 0 is refused with the fix. Ray's limit counts running trials and not
    the ones HyperBandForBOHB paused; here a paused trial gives its slot back, so a ``ConcurrencyLimiter`` or
    ``max_concurrent_trials`` already counts running trials only."""

    def __init__(
        self,
        space: Any = None,
        bohb_config: Mapping[str, Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: Sequence[Mapping[str, Any]] | None = None,
        seed: int | None = None,
        max_concurrent: int = 0,
    ) -> None:
        if points_to_evaluate is not None and (
            isinstance(points_to_evaluate, Mapping) or not isinstance(points_to_evaluate, Sequence)
        ):
            raise ValueError("TuneBOHB(points_to_evaluate=...): pass a list of configs (dicts)")
        if max_concurrent:
            raise ValueError(
                f"TuneBOHB(max_concurrent={max_concurrent!r}): wrap it as ConcurrencyLimiter(TuneBOHB(...), "
                f"max_concurrent={max_concurrent!r}) or give max_concurrent_trials instead; a trial HyperBandForBOHB "
                "paused holds no slot here, so that limit counts running trials only, as Ray's max_concurrent does"
            )
        super().__init__(metric=metric, mode=mode)  # checks them
        self._cs, self._bohb_class = _bohb()
        self._bohb_config = dict(bohb_config or {})
        self._seed = seed
        self._points = [_flat(p) for p in points_to_evaluate or ()]
        self._space: Any = None
        self._bohber: Any = None
        self._live: dict[str, dict[str, Any]] = {}  # trial id -> its config, by the space's parameter names
        if space is not None and not (isinstance(space, Mapping) and not space):
            self._set_space(space)

    # ------------------------------------------------------------------------------------------ the experiment

    def _has_space(self) -> bool:
        return self._bohber is not None

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """A ``ConcurrencyLimiter``'s limit: True, as in Ray; the experiment runs no more than it at once, and a
        paused trial holds no slot, so BOHB's brackets can fill meanwhile."""
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        """The next point to evaluate, else BOHB's next config (at random until it has a model, then a share
        ``random_fraction`` at random)."""
        self._check_ready()
        if self._points:
            config = self._points.pop(0)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):  # statsmodels' KDE of a one-valued category
                config, _ = self._bohber.get_config(None)  # the budget is not used by hpbandster's BOHB
        config = plain(dict(config))
        self._live[trial_id] = config
        return dict(config)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """Tell BOHB the report: its metric (negated for ``mode='max'``) at the report's budget."""
        config = self._live.get(trial_id)
        value = result.get(self._metric) if self._metric else None
        info = result.get("hyperband_info")
        budget = info.get("budget") if isinstance(info, Mapping) else None
        budget = result.get("training_iteration") if budget is None else budget
        if config is None or not _number(value) or not _number(budget):
            return  # a report without the metric is the sweep's error to report (it stops at the first)
        loss = -float(value) if self._mode == "max" else float(value)
        with np.errstate(divide="ignore", invalid="ignore"):
            self._bohber.new_result(_Job(loss if math.isfinite(loss) else math.inf, float(budget), config))

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        """Forget the trial: BOHB learned from its reports (as in Ray)."""
        self._live.pop(trial_id, None)

    def get_state(self) -> dict[str, Any]:
        """What ``save`` pickles: BOHB (its space, results and models), the points left and the trials running."""
        return {
            "space": self._space,
            "bohber": self._bohber,
            "points": self._points,
            "live": self._live,
            "metric": self._metric,
            "mode": self._mode,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Take back what ``get_state`` returned (``restore``)."""
        self._space, self._bohber, self._points = state["space"], state["bohber"], state["points"]
        self._live, self._metric, self._mode = state["live"], state["metric"], state["mode"]

    # ---------------------------------------------------------------------------------------------- the space

    def _set_space(self, space: Any) -> None:
        cs = self._cs
        self._space = space if isinstance(space, cs.ConfigurationSpace) else _converted(cs, space)
        if self._seed is not None:
            self._space.seed(self._seed)
        try:
            self._bohber = self._bohb_class(self._space, **self._bohb_config)
        except TypeError as exc:
            raise ValueError(
                f"TuneBOHB(bohb_config={self._bohb_config!r}): {exc}; give only hpbandster BOHB's arguments "
                "(min_points_in_model, top_n_percent, num_samples, random_fraction, bandwidth_factor, min_bandwidth)"
            ) from None
        for point in self._points:
            try:
                cs.Configuration(self._space, values=point)
            except (
                ValueError,
                KeyError,
                TypeError,
            ) as exc:  # ConfigSpace's: an illegal, unknown or missing value
                raise ValueError(
                    f"TuneBOHB(points_to_evaluate=...): {point!r} does not fit the space ({exc}); give every "
                    f"parameter of {sorted(self._space.keys())} by name ('a/b' or a nested dict), within its range"
                ) from None


def _number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def _flat(point: Mapping[str, Any]) -> dict[str, Any]:
    """A point by the space's parameter names: nested dicts as ``a/b``."""
    if not isinstance(point, Mapping):
        raise ValueError(f"TuneBOHB(points_to_evaluate=...): {point!r} is not a config (a dict)")
    return {"/".join(path): plain(value) for path, value in config_leaves(dict(point))}


def _converted(cs: Any, space: Mapping[str, Any]) -> Any:
    """A ``tune.*`` space as a ``ConfigurationSpace`` of its searched leaves (``a/b`` names); constants are left
    to the experiment (the sweep merges them under each suggestion)."""
    params = []
    for path, value in config_leaves(dict(space)):
        label = "/".join(path)
        if is_grid(value):
            raise ValueError(
                f"{label}: tune.grid_search cannot be converted to a TuneBOHB search space (as in Ray); use "
                "tune.choice([...])"
            )
        param = _parameter(cs, label, value)
        if param is not None:
            params.append(param)
    if not params:
        raise ValueError("TuneBOHB: the space has nothing to search (no tune.* domains)")
    converted = cs.ConfigurationSpace()
    for param in params:
        (converted.add if hasattr(converted, "add") else converted.add_hyperparameter)(param)
    return converted


def _parameter(cs: Any, label: str, value: Any) -> Any:
    """One ``tune.*`` domain as a ConfigSpace hyperparameter; None for a constant."""
    if isinstance(value, Uniform | LogUniform):
        return cs.UniformFloatHyperparameter(
            label, lower=value.low, upper=value.high, log=isinstance(value, LogUniform)
        )
    if isinstance(value, RandInt):  # tune.randint's upper bound is exclusive
        return cs.UniformIntegerHyperparameter(label, lower=value.low, upper=value.high - 1)
    if isinstance(value, Choice):
        return cs.CategoricalHyperparameter(label, choices=list(value.values))
    if isinstance(value, QRandInt | Pow2):
        return cs.CategoricalHyperparameter(label, choices=value.enumerate())
    if isinstance(value, QUniform):  # Ray's bounds: the multiples of q within [low, high]
        first, last = math.ceil(value.low / value.q - 1e-9), math.floor(value.high / value.q + 1e-9)
        choices = sorted({plain(float(np.round(k * value.q, 12))) for k in range(first, last + 1)})
        if not 1 < len(choices) <= 1000:
            raise ValueError(
                f"{label}: tune.quniform({value.low}, {value.high}, {value.q}) has {len(choices)} multiples of q; "
                "TuneBOHB searches 2 to 1000 of them (ConfigSpace 1.x has no q): use tune.uniform and round in "
                "the trainable"
            )
        return cs.CategoricalHyperparameter(label, choices=choices)
    if isinstance(value, Normal):
        spread = NORMAL_SDS * value.sd
        return cs.NormalFloatHyperparameter(
            label, mu=value.mean, sigma=value.sd, lower=value.mean - spread, upper=value.mean + spread
        )
    if isinstance(value, RANDOM_DOMAINS):  # tune.sample_from: a function, not a distribution
        raise ValueError(
            f"{label}: {type(value).__name__} is not searched by TuneBOHB (Ray's converts uniform, loguniform, "
            "randint, quantized values, randn and choice); use one of those, or give a ConfigurationSpace"
        )
    return None
