"""Population Based Bandits (PB2; Parker-Holder et al., 2020, https://arxiv.org/abs/2002.02518) with Ray Tune's
arguments: PBT whose explore is chosen by a GP bandit instead of random perturbations.

The exploit is PBT's (``tasks/sweep/pbt.py``): every ``perturbation_interval`` a trial in the bottom
``quantile_fraction`` continues from a copy of a top trial's latest checkpoint. The new hyperparameters are
chosen as follows. Every result a trial reports adds an observation: the time, the reward it started from (its
previous result's, or its donor's after an exploit), its hyperparameters (scaled to ``[0, 1]`` by
``hyperparam_bounds``) and how fast the reward changed since (change / time passed). Ray's PB2 observes only at
the perturbation points; every result gives the GP more to learn from in the same time. A Gaussian process (scikit-learn's ``GaussianProcessRegressor``: an RBF kernel
over time, starting reward and every hyperparameter, plus white noise) is fit to the most recent observations, and
the point that maximises the upper confidence bound ``mean + kappa * std`` at the current time and the donor's
reward is taken (from 1,024 random candidates in the bounds plus the donor's own point). Points already given to
other trials in the same round are added to the GP used for ``std`` with its own prediction as their value, so a
round's choices spread out (Desautels et al., 2014), as PB2 does.

Before any trial has two observations there is nothing to fit: the new values are drawn uniformly within the
bounds. Randomness (the candidates, the GP's fits) comes from one generator seeded from Python's global one when
the scheduler is built, as PBT's: ``random.seed(...)`` before it makes a sweep repeatable.

Pure Python + numpy + scikit-learn (imported when the scheduler is built): no Prefect, MLflow or Dask.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sweepflow.tasks.sweep.pbt import Exploit, PopulationBasedTraining, _is_number
from sweepflow.tasks.sweep.space import Uniform

__all__ = ["PB2", "select_config"]

#: Observations the GP is fit to (the most recent ones): a GP's fit grows with the cube of their number.
WINDOW = 256
#: Random candidates the acquisition is maximised over (besides the donor's own point).
CANDIDATES = 1024

Path = tuple[str, ...]


@dataclass
class _Last:
    """A trial's previous observation point: when, at what signed reward, with which hyperparameters (scaled)."""

    time: float
    score: float | None
    point: np.ndarray


def _flat_bounds(bounds: Mapping[str, Any], prefix: Path = ()) -> dict[Path, tuple[float, float]]:
    out: dict[Path, tuple[float, float]] = {}
    for name, value in bounds.items():
        path = (*prefix, name)
        if isinstance(value, Mapping):
            out.update(_flat_bounds(value, path))
            continue
        if (
            not isinstance(value, list | tuple)
            or len(value) != 2
            or not all(_is_number(v) and math.isfinite(v) for v in value)
        ):
            raise ValueError(
                f"PB2: hyperparam_bounds[{'/'.join(path)!r}]={value!r}: give the continuous range as [low, high], "
                "e.g. {'lr': [1e-4, 1e-1]}"
            )
        low, high = float(value[0]), float(value[1])
        if not low < high:
            raise ValueError(f"PB2: hyperparam_bounds[{'/'.join(path)!r}]={value!r}: low must be below high")
        out[path] = (low, high)
    return out


def _as_mutations(bounds: Mapping[str, Any]) -> dict[str, Any]:
    """The bounds as PBT's ``hyperparam_mutations``: a value a trial's config lacks is drawn uniformly in them."""
    return {
        name: _as_mutations(value) if isinstance(value, Mapping) else Uniform(float(value[0]), float(value[1]))
        for name, value in bounds.items()
    }


def _get(config: Mapping[str, Any], path: Path) -> Any:
    value: Any = config
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _set(config: dict[str, Any], path: Path, value: Any) -> None:
    for key in path[:-1]:
        config = config.setdefault(key, {})
    config[path[-1]] = value


def select_config(
    observations: np.ndarray,
    changes: np.ndarray,
    *,
    now: np.ndarray,
    donor: np.ndarray,
    pending: np.ndarray | None = None,
    rng: np.random.Generator,
    candidates: int = CANDIDATES,
) -> np.ndarray:
    """The GP-UCB choice of new hyperparameters, all scaled to ``[0, 1]``.

    Args:
        observations: One row per observation: the fixed columns (time and starting reward, scaled to ``[0, 1]``)
            then the hyperparameters.
        changes: The reward's rate of change in each observation (higher is better).
        now: The fixed columns of the point being chosen for (the current time, the donor's reward), scaled.
        donor: The donor's hyperparameters (always a candidate).
        pending: Hyperparameters already chosen in this round (they lower ``std`` around them), or None.
        rng: Where the candidates and the GP optimiser's restarts come from.
        candidates: How many random candidates the upper confidence bound is maximised over.

    Returns:
        The chosen hyperparameters, each in ``[0, 1]``.
    """
    from threadpoolctl import threadpool_limits  # installed with scikit-learn

    # Small matrices: one BLAS thread is faster than several, many times over on a busy machine (and leaves the
    # flow's process its other cores).
    with threadpool_limits(limits=1):
        return _select_config(observations, changes, now=now, donor=donor, pending=pending, rng=rng,
                              candidates=candidates)


def _select_config(
    observations: np.ndarray,
    changes: np.ndarray,
    *,
    now: np.ndarray,
    donor: np.ndarray,
    pending: np.ndarray | None,
    rng: np.random.Generator,
    candidates: int,
) -> np.ndarray:
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    n, width = observations.shape
    fixed = now.size
    y = (changes - changes.mean()) / (changes.std() or 1.0)
    kernel = ConstantKernel(1.0, (1e-2, 1e2)) * RBF(np.ones(width), (5e-2, 1e2)) + WhiteKernel(0.1, (1e-4, 1.0))
    seed = int(rng.integers(2**31))
    gp = GaussianProcessRegressor(kernel=kernel, alpha=1e-8, random_state=seed)
    with warnings.catch_warnings():  # bounds reached while fitting: the fit is still usable
        warnings.simplefilter("ignore")
        gp.fit(observations, y)
    spread = gp
    if pending is not None and len(pending):
        at_pending = np.hstack([np.tile(now, (len(pending), 1)), pending])
        spread = GaussianProcessRegressor(kernel=gp.kernel_, alpha=1e-8, optimizer=None)
        spread.fit(np.vstack([observations, at_pending]), np.concatenate([y, gp.predict(at_pending)]))
    points = np.vstack([donor.reshape(1, -1), rng.uniform(0.0, 1.0, (candidates, width - fixed))])
    grid = np.hstack([np.tile(now, (len(points), 1)), points])
    mean = gp.predict(grid)
    _, std = spread.predict(grid, return_std=True)
    kappa = math.sqrt(0.2 + max(0.0, math.log(0.4 * n)))  # grows slowly with the data (PB2's beta_t)
    return points[int(np.argmax(mean + kappa * std))]


class PB2(PopulationBasedTraining):
    """Ray Tune's ``PB2``: PBT's exploit, with each exploited trial's new hyperparameters chosen by a GP bandit
    within ``hyperparam_bounds`` (the module's docstring says how).

    Args:
        time_attr: The reported attribute that measures progress (as in PBT).
        metric: The metric ranked by; None: the experiment's.
        mode: ``"min"`` or ``"max"``; None: the experiment's.
        perturbation_interval: How much of ``time_attr`` passes between a trial's exploits (and observations).
        hyperparam_bounds: Each explored hyperparameter's continuous range, ``{"lr": [1e-4, 1e-1]}`` (nested dicts
            for nested configs). A value is a float in the range (an int when the trial's config gave an int); a
            trial's config that lacks one gets it drawn uniformly in its range.
        quantile_fraction: The share of trials in the top and in the bottom (0 to 0.5).
        log_config: Accepted; each trial's config history is always recorded.
        require_attrs: Refuse results without ``time_attr`` or ``metric`` (else they are skipped).
        synch: Wait for every running trial at each interval and perturb them together.
        custom_explore_fn: Applied to the GP's chosen config, as in Ray.
    """

    stop_reason = "PB2"

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        perturbation_interval: float = 60.0,
        hyperparam_bounds: Mapping[str, Any] | None = None,
        quantile_fraction: float = 0.25,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
        custom_explore_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        if not hyperparam_bounds or not isinstance(hyperparam_bounds, Mapping):
            raise ValueError(
                f"PB2 needs hyperparam_bounds, the continuous range of each hyperparameter it explores, e.g. "
                f"{{'lr': [1e-4, 1e-1]}}; got {hyperparam_bounds!r}"
            )
        self.bounds = _flat_bounds(hyperparam_bounds)
        try:
            import sklearn  # noqa: F401 - the GP
        except ImportError as exc:
            raise ImportError("PB2 needs scikit-learn: pip install scikit-learn") from exc
        super().__init__(
            time_attr=time_attr,
            metric=metric,
            mode=mode,
            perturbation_interval=perturbation_interval,
            hyperparam_mutations=_as_mutations(hyperparam_bounds),
            quantile_fraction=quantile_fraction,
            resample_probability=0.0,
            custom_explore_fn=custom_explore_fn,
            log_config=log_config,
            require_attrs=require_attrs,
            synch=synch,
        )
        self.hyperparam_bounds = copy.deepcopy(dict(hyperparam_bounds))
        self._last: dict[str, _Last] = {}
        self._rows: list[np.ndarray] = []  # time, starting score, scaled hyperparameters
        self._changes: list[float] = []  # the score's change per unit of time over the interval
        self._round: tuple[float, list[np.ndarray]] = (-math.inf, [])  # this round's time and its choices

    # --------------------------------------------------------------------------- observations

    def _scaled(self, config: Mapping[str, Any]) -> np.ndarray:
        out = []
        for path, (low, high) in self.bounds.items():
            value = _get(config, path)
            out.append((float(value) - low) / (high - low) if _is_number(value) else 0.5)
        return np.clip(np.array(out, dtype=float), 0.0, 1.0)

    def on_trial_result(self, trial_id: str, result: Mapping[str, Any]) -> Any:
        """Record an observation (the reward's change since the trial's previous result), then decide as PBT does.

        Raises:
            ValueError: the result lacks the numeric metric or ``time_attr`` and ``require_attrs`` is True.
        """
        point = self._point(trial_id, result)
        if point is not None:
            time, _, score = point
            with self._lock:
                state = self._trials.get(trial_id)
                if state is not None:
                    self._observe(trial_id, time, score, state.config)
        return super().on_trial_result(trial_id, result)

    def _observe(self, trial_id: str, time: float, score: float, config: Mapping[str, Any]) -> None:
        last = self._last.get(trial_id)
        point = self._scaled(config)
        if last is not None and last.score is not None and time > last.time and math.isfinite(score):
            self._rows.append(np.concatenate([[last.time, last.score], last.point]))
            self._changes.append((score - last.score) / (time - last.time))
            del self._rows[:-WINDOW], self._changes[:-WINDOW]
        self._last[trial_id] = _Last(time, score if math.isfinite(score) else None, point)

    def take_exploit(self, trial_id: str) -> Exploit | None:
        """The plan an ``EXPLOIT`` decision stands for (once); the trial's next interval starts from the donor's
        reward with the new config."""
        plan = super().take_exploit(trial_id)
        if plan is not None:
            sign = 1.0 if self.mode == "max" else -1.0
            with self._lock:
                self._last[trial_id] = _Last(plan.at, sign * plan.donor_score, self._scaled(plan.config))
        return plan

    # --------------------------------------------------------------------------- explore

    def _new_config(self, donor: str, recipient: str, time: float) -> dict[str, Any]:
        donor_state = self._trials[donor]
        config = copy.deepcopy(donor_state.config)
        chosen = self._choose(time, donor_state.last_score, self._scaled(config))
        for (path, (low, high)), x in zip(self.bounds.items(), chosen, strict=True):
            value = low + float(x) * (high - low)
            old = _get(config, path)
            _set(config, path, int(round(value)) if isinstance(old, int | np.integer) and not isinstance(old, bool) else value)
        if self.custom_explore_fn is not None:
            config = self.custom_explore_fn(config)
            if not isinstance(config, Mapping):
                raise TypeError(f"PB2: custom_explore_fn must return the new config (a dict), got {config!r}")
        return dict(config)

    def _choose(self, time: float, donor_score: float | None, donor: np.ndarray) -> np.ndarray:
        """New scaled hyperparameters: the GP's choice, or uniform draws while there is too little data."""
        when, chosen = self._round
        if time > when:  # a new round: the last one's choices no longer count as pending
            self._round = (time, [])
        if len(self._rows) < 2 or donor_score is None:
            pick = self._np.uniform(0.0, 1.0, len(self.bounds))
        else:
            rows = np.array(self._rows)
            fixed = rows[:, :2]
            low, high = fixed.min(axis=0), fixed.max(axis=0)
            span = np.where(high > low, high - low, 1.0)
            observations = np.hstack([(fixed - low) / span, rows[:, 2:]])
            now = (np.array([time, donor_score]) - low) / span
            pending = np.array(self._round[1]) if self._round[1] else None
            pick = select_config(
                observations, np.array(self._changes), now=now, donor=donor, pending=pending, rng=self._np
            )
        self._round[1].append(pick)
        return pick

    def explore(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """New values for ``config``'s bounded hyperparameters: the GP's choice at the latest observed time and
        the best reward seen (what an exploit at that point would get)."""
        with self._lock:
            times = [row[0] for row in self._rows]
            scores = [s.last_score for s in self._trials.values() if s.last_score is not None]
            time = max(times) if times else 0.0
            best = max(scores) if scores else None
        chosen = self._choose(time, best, self._scaled(config))
        new = copy.deepcopy(dict(config))
        for (path, (low, high)), x in zip(self.bounds.items(), chosen, strict=True):
            _set(new, path, low + float(x) * (high - low))
        return new

    def debug_string(self) -> str:
        """``"PB2: <n> perturbs"``."""
        with self._lock:
            return f"PB2: {self.num_perturbations} perturbs"

    def __repr__(self) -> str:
        bounds = {"/".join(p): [lo, hi] for p, (lo, hi) in self.bounds.items()}
        return (
            f"PB2(time_attr={self.time_attr!r}, metric={self.metric!r}, mode={self.mode!r}, "
            f"perturbation_interval={self.perturbation_interval:g}, quantile_fraction={self.quantile_fraction}, "
            f"hyperparam_bounds={bounds}, synch={self.synch})"
        )
