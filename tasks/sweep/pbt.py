"""Population Based Training (Jaderberg et al., 2017, https://arxiv.org/abs/1711.09846) with Ray Tune's arguments.

Trials train side by side. Every ``perturbation_interval`` of a trial's ``time_attr`` (after ``burn_in_period``), it
is ranked against the other running trials by its latest ``metric``. A trial in the bottom ``quantile_fraction``
*exploits* one drawn from the top: it stops, then continues from a copy of that trial's latest checkpoint with
that trial's config *explored* (each hyperparameter in ``hyperparam_mutations`` resampled with probability
``resample_probability``, else perturbed: a number times one of ``perturbation_factors``, a list entry shifted to
a neighbour), then ``custom_explore_fn`` applied. ``synch=True`` waits until every running trial has reached the
interval and perturbs them together (Ray's synchronous PBT).

The scheduler decides; the trial carries the decision out (``tasks/sweep/trial.py``: it stops its group, copies
the donor's checkpoint into its own storage, and starts a group from it with the new config, in the same task
run and MLflow run). A trial learns the plan with :meth:`take_exploit` after an ``EXPLOIT`` decision and confirms
it with :meth:`on_trial_config` once its group runs the new config.

As in Ray, only running trials form the population: a finished trial is no donor (its checkpoint is from the end of
training, not from the time the recipient is at). The population is the trials that run at once: give the
experiment room for all ``num_samples`` (``max_concurrent_trials``, the cluster's size) for a full population;
``synch=True`` requires it.

Pure Python + numpy, like the other schedulers (runs in the flow's process, called from every trial's thread).
"""

from __future__ import annotations

import copy
import math
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sweepflow.tasks.sweep.space import Choice, Grid, parse_domain
from sweepflow.tasks.sweep.trial_scheduler import CONTINUE, Decision, TrialScheduler, merge_search_properties

__all__ = ["Exploit", "PopulationBasedTraining"]


@dataclass(frozen=True)
class Exploit:
    """What a trial in the bottom quantile does: continue from ``donor``'s latest checkpoint with ``config``."""

    donor: str  # the trial id whose checkpoint is copied
    config: dict[str, Any]  # the donor's config, explored
    at: float  # the recipient's time_attr when it was decided
    donor_score: float  # the donor's latest metric (its own sign)
    score: float  # the recipient's latest metric (its own sign)


@dataclass
class _TrialState:
    config: dict[str, Any] = field(default_factory=dict)
    last_score: float | None = None  # signed: higher is better
    last_value: float | None = None  # as reported
    last_perturbation_time: float = 0.0
    last_time: float = 0.0
    live: bool = True


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool | np.bool_)


class PopulationBasedTraining(TrialScheduler):
    """Ray Tune's ``PopulationBasedTraining``: same arguments, same defaults, same exploit/explore rules."""

    stop_reason = "PBT"

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        perturbation_interval: float = 60.0,
        burn_in_period: float = 0.0,
        hyperparam_mutations: Mapping[str, Any] | None = None,
        quantile_fraction: float = 0.25,
        resample_probability: float = 0.25,
        perturbation_factors: Sequence[float] = (1.2, 0.8),
        custom_explore_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
    ) -> None:
        """Every argument is checked here, before any trial runs. ``log_config`` is accepted: each trial's config
        history is always recorded (its MLflow run: tags, ``hparam/<name>`` metrics, ``pbt/config_history.json``)."""
        super().__init__()
        if not hyperparam_mutations and custom_explore_fn is None:
            raise ValueError(
                "PopulationBasedTraining needs hyperparam_mutations (e.g. {'lr': tune.loguniform(1e-4, 1e-1)}) "
                "or custom_explore_fn: otherwise an exploited trial would copy its donor's config unchanged"
            )
        if hyperparam_mutations is not None and not isinstance(hyperparam_mutations, Mapping):
            raise TypeError(
                f"PopulationBasedTraining: hyperparam_mutations must be a dict of name -> list, search-space "
                f"domain, function or nested dict, got {type(hyperparam_mutations).__name__}"
            )
        if custom_explore_fn is not None and not callable(custom_explore_fn):
            raise TypeError(f"PopulationBasedTraining: custom_explore_fn must be a function, got {custom_explore_fn!r}")
        self._check_time_attr_and_mode(time_attr, mode)
        if not _is_number(perturbation_interval) or perturbation_interval <= 0:
            raise ValueError(
                f"PopulationBasedTraining: perturbation_interval must be > 0 (in units of {time_attr!r}), "
                f"got {perturbation_interval!r}"
            )
        if not _is_number(burn_in_period) or burn_in_period < 0:
            raise ValueError(f"PopulationBasedTraining: burn_in_period must be >= 0, got {burn_in_period!r}")
        if not _is_number(quantile_fraction) or not 0 <= quantile_fraction <= 0.5:
            raise ValueError(
                f"PopulationBasedTraining: quantile_fraction must be between 0 and 0.5 (the share of trials in "
                f"the top and in the bottom), got {quantile_fraction!r}"
            )
        if not _is_number(resample_probability) or not 0 <= resample_probability <= 1:
            raise ValueError(
                f"PopulationBasedTraining: resample_probability must be between 0 and 1, got {resample_probability!r}"
            )
        factors = tuple(perturbation_factors)
        if not factors or not all(_is_number(f) and f > 0 for f in factors):
            raise ValueError(
                f"PopulationBasedTraining: perturbation_factors must be positive numbers, e.g. (1.2, 0.8), got "
                f"{perturbation_factors!r}"
            )
        self.time_attr, self.metric, self.mode = time_attr, metric, mode
        self.perturbation_interval = float(perturbation_interval)
        self.burn_in_period = float(burn_in_period)
        self.hyperparam_mutations = _normalised(dict(hyperparam_mutations or {}), "hyperparam_mutations")
        self.quantile_fraction = float(quantile_fraction)
        self.resample_probability = float(resample_probability)
        self.perturbation_factors = factors
        self.custom_explore_fn = custom_explore_fn
        self.log_config = log_config
        self.require_attrs = require_attrs
        self.synch = bool(synch)
        # Seeded from Python's global generator when built: random.seed(...) before it makes a sweep repeatable.
        self._random = random.Random(random.getrandbits(64))
        self._np = np.random.default_rng(self._random.getrandbits(64))
        self._cond = threading.Condition(self._lock)
        self._trials: dict[str, _TrialState] = {}
        self._plans: dict[str, Exploit] = {}
        self._next_sync = self.perturbation_interval  # synch: the time every trial waits for the others at
        self.num_perturbations = 0

    # --------------------------------------------------------------------------- the experiment's settings

    def set_search_properties(self, metric: str | None, mode: str | None) -> None:
        """Fill in the experiment's metric and mode where the scheduler was built without them.

        Raises:
            ValueError: they differ from the ones the scheduler was given, or neither has them.
        """
        own = (self.metric, self.mode)
        self.metric, self.mode = merge_search_properties("PopulationBasedTraining", own, (metric, mode))

    def checkpoint_every(self) -> int | None:
        """Every perturbation interval when it counts reports, else every report."""
        if self.time_attr == "training_iteration":
            return max(int(self.perturbation_interval), 1)
        return 1

    def check_room(self, *, trials: int, at_once: int) -> None:
        """Synchronous PBT holds every trial at each interval until all of them get there: they must all run at
        once."""
        if self.synch and at_once < trials:
            raise ValueError(
                f"PopulationBasedTraining(synch=True) waits for all {trials} trials at every interval, but only "
                f"{at_once} can run at once here (the cluster's room or max_concurrent_trials): make the search "
                f"propose at most {at_once} trials (num_samples x the grid's combinations), give the cluster more "
                "workers, or use synch=False"
            )

    # --------------------------------------------------------------------------- configs

    def on_trial_config(self, trial_id: str, config: dict[str, Any]) -> dict[str, Any]:
        """A trial's config as it starts (mutated names it lacks are sampled from their mutations, as in Ray),
        or as it continues after an exploit (recorded as its config)."""
        filled = copy.deepcopy(config)
        with self._lock:
            _fill_missing(filled, self.hyperparam_mutations, self._sample)
            self._trials.setdefault(trial_id, _TrialState()).config = copy.deepcopy(filled)
        return filled

    # --------------------------------------------------------------------------- the scheduler's calls

    def on_trial_add(self, trial_id: str) -> None:
        """Mark the trial live (a trial going on after an exploit keeps its state)."""
        with self._lock:
            state = self._trials.setdefault(trial_id, _TrialState())
            state.live = True

    def _point(self, trial_id: str, result: Mapping[str, Any]) -> tuple[float, float, float] | None:
        if self.metric is None or self.mode is None:
            self.set_search_properties(None, None)  # raises, with the fix
        missing = [k for k in (self.time_attr, self.metric) if k not in result or not _is_number(result[k])]
        if missing:
            if not self.require_attrs:
                return None
            raise ValueError(
                f"PopulationBasedTraining: result for trial {trial_id!r} has no numeric {missing[0]!r}; reported "
                f"keys: {sorted(result)}. Report it, configure the scheduler with a name that is reported, or pass "
                "require_attrs=False to skip such results"
            )
        value = float(result[self.metric])  # type: ignore[index]
        sign = 1.0 if self.mode == "max" else -1.0
        return float(result[self.time_attr]), value, sign * value

    def on_trial_result(self, trial_id: str, result: Mapping[str, Any]) -> Decision:
        """``EXPLOIT`` when the trial, at a perturbation point, is in the bottom quantile and is to continue
        from a top trial's checkpoint, else ``CONTINUE``.

        With ``synch=True`` the call blocks until every running trial reached the same perturbation point.

        Raises:
            ValueError: the result lacks the numeric metric or ``time_attr`` and ``require_attrs`` is True
                (Ray's default), or no metric/mode was ever given.
        """
        point = self._point(trial_id, result)
        if point is None:
            return CONTINUE
        time, value, score = point
        with self._cond:
            state = self._trials.setdefault(trial_id, _TrialState())
            state.last_time = time
            if time < self.burn_in_period or time - state.last_perturbation_time < self.perturbation_interval:
                return CONTINUE
            if math.isfinite(score):
                state.last_score, state.last_value = score, value
            if not self.synch:
                state.last_perturbation_time = time
                self._perturb([trial_id], time)
            else:
                self._wait_for_the_others(trial_id, time)
            return Decision.EXPLOIT if trial_id in self._plans else CONTINUE

    def _wait_for_the_others(self, trial_id: str, time: float) -> None:
        """Synchronous PBT: hold until every running trial reached the sync point, then perturb them together
        (done by the last to arrive). Called with the lock held."""
        if time < self._next_sync:
            return  # not yet at the sync point (it got there by a smaller step than the others)
        sync = self._next_sync
        if all(not s.live or s.last_time >= sync for s in self._trials.values()):
            self._sync_round(time)
            self._cond.notify_all()
            return
        while self._next_sync == sync:
            self._cond.wait(timeout=1.0)

    def _sync_round(self, time: float) -> None:
        """Perturb every live trial; then the next sync point is one interval on (or the furthest trial's time)."""
        live = [tid for tid, s in self._trials.items() if s.live]
        for tid in live:
            self._trials[tid].last_perturbation_time = time
        self._perturb(live, time)
        furthest = max(s.last_time for s in self._trials.values())
        self._next_sync = max(self._next_sync + self.perturbation_interval, furthest)

    def _quantiles(self) -> tuple[list[str], list[str]]:
        """(bottom, top) of the running trials with a score, Ray's ``_quantiles``: each ceil(n * fraction), at
        most half of them."""
        ranked = sorted(
            (tid for tid, s in self._trials.items() if s.live and s.last_score is not None),
            key=lambda tid: self._trials[tid].last_score,  # type: ignore[arg-type, return-value]
        )
        if len(ranked) <= 1:
            return [], []
        n = int(math.ceil(len(ranked) * self.quantile_fraction))
        if n > len(ranked) / 2:
            n = int(math.floor(len(ranked) / 2))
        return ranked[:n], ranked[len(ranked) - n :]

    def _perturb(self, trial_ids: list[str], time: float) -> None:
        bottom, top = self._quantiles()
        for tid in trial_ids:
            if tid not in bottom or not top:
                continue
            donor = self._random.choice(top)
            donor_state, state = self._trials[donor], self._trials[tid]
            self._plans[tid] = Exploit(
                donor=donor,
                config=self._new_config(donor, tid, time),
                at=time,
                donor_score=float(donor_state.last_value),  # type: ignore[arg-type]
                score=float(state.last_value),  # type: ignore[arg-type]
            )
            self.num_perturbations += 1

    def _new_config(self, donor: str, recipient: str, time: float) -> dict[str, Any]:
        """The config ``recipient`` continues with from ``donor``'s checkpoint: the donor's, explored (PB2 chooses
        it with its GP instead). Called with the lock held."""
        return self.explore(self._trials[donor].config)

    def take_exploit(self, trial_id: str) -> Exploit | None:
        """The plan an ``EXPLOIT`` decision stands for (once)."""
        with self._lock:
            return self._plans.pop(trial_id, None)

    def _end(self, trial_id: str) -> None:
        with self._cond:
            state = self._trials.get(trial_id)
            if state is not None:
                state.live = False
            self._plans.pop(trial_id, None)
            # Synchronous PBT: the others may have been waiting only for this one.
            if self.synch and any(s.live for s in self._trials.values()):
                waiting = [s for s in self._trials.values() if s.live]
                if all(s.last_time >= self._next_sync for s in waiting):
                    self._sync_round(max(s.last_time for s in waiting))
            self._cond.notify_all()

    def on_trial_complete(self, trial_id: str, result: Mapping[str, Any] | None) -> None:
        """The trial leaves the population; with ``synch``, the others may now perturb without it."""
        self._end(trial_id)

    def on_trial_error(self, trial_id: str) -> None:
        """The trial leaves the population; with ``synch``, the others may now perturb without it."""
        self._end(trial_id)

    # --------------------------------------------------------------------------- explore

    def _sample(self, mutation: Any) -> Any:
        if isinstance(mutation, list | tuple):
            return self._random.choice(list(mutation))
        sample = getattr(mutation, "sample", None)
        if callable(sample):  # a search-space domain (tune.uniform, tune.loguniform, tune.sample_from, ...)
            return sample(self._np)
        return mutation()

    def explore(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """A new config from ``config``: Ray's explore (resample or perturb each mutated name), then
        ``custom_explore_fn``."""
        new = _explored(
            copy.deepcopy(dict(config)),
            self.hyperparam_mutations,
            resample_probability=self.resample_probability,
            factors=self.perturbation_factors,
            rng=self._random,
            sample=self._sample,
        )
        if self.custom_explore_fn is not None:
            new = self.custom_explore_fn(new)
            if not isinstance(new, Mapping):
                raise TypeError(
                    f"PopulationBasedTraining: custom_explore_fn must return the new config (a dict), got {new!r}"
                )
        return dict(new)

    def debug_string(self) -> str:
        """``"PopulationBasedTraining: <n> perturbs"``."""
        with self._lock:
            return f"PopulationBasedTraining: {self.num_perturbations} perturbs"

    def __repr__(self) -> str:
        return (
            f"PopulationBasedTraining(time_attr={self.time_attr!r}, metric={self.metric!r}, mode={self.mode!r}, "
            f"perturbation_interval={self.perturbation_interval:g}, quantile_fraction={self.quantile_fraction}, "
            f"mutations={sorted(self.hyperparam_mutations)}, synch={self.synch})"
        )


def mutations_from_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``hyperparam_mutations`` written as data (a pipeline's YAML): a list of values stays a list, a
    search-space spec (``{"type": "loguniform", "low": 1e-4, "high": 1e-1}``) becomes its domain (a choice its
    list of values, so an exploit moves to a neighbour as with a list), a dict without ``type`` is a nested
    config's mutations. ``ValueError`` names the parameter and the fix."""
    out: dict[str, Any] = {}
    for name, value in spec.items():
        if isinstance(value, Mapping) and "type" not in value:
            out[name] = mutations_from_spec(value)
        elif isinstance(value, list | tuple):
            out[name] = list(value)
        elif isinstance(value, Mapping):
            domain = parse_domain(f"hyperparam_mutations.{name}", value)
            if isinstance(domain, Choice | Grid):
                out[name] = list(domain.enumerate())
            elif callable(getattr(domain, "sample", None)):
                out[name] = domain
            else:
                raise ValueError(
                    f"hyperparam_mutations.{name}: a {value['type']} cannot be mutated; give a list of values or "
                    "a distribution such as {type: loguniform, low: 1e-4, high: 1e-1}"
                )
        else:
            raise ValueError(
                f"hyperparam_mutations.{name}={value!r}: give a list of values or a search-space spec such as "
                "{type: loguniform, low: 1e-4, high: 1e-1}"
            )
    return out


def _normalised(mutations: dict[str, Any], where: str) -> dict[str, Any]:
    """Ray's accepted mutation kinds: a list (or tuple), a domain (a choice becomes its list), a function, or a
    nested dict of those; anything else is refused now rather than at the first perturbation."""
    out: dict[str, Any] = {}
    for name, mutation in mutations.items():
        categories = getattr(mutation, "categories", None)
        if isinstance(mutation, Mapping):
            out[name] = _normalised(dict(mutation), f"{where}[{name!r}]")
        elif isinstance(categories, list | tuple):
            out[name] = list(categories)
        elif isinstance(mutation, list | tuple):
            if not mutation:
                raise ValueError(f"PopulationBasedTraining: {where}[{name!r}] is an empty list: give the values to try")
            out[name] = list(mutation)
        elif callable(getattr(mutation, "sample", None)) or callable(mutation):
            out[name] = mutation
        else:
            raise TypeError(
                f"PopulationBasedTraining: {where}[{name!r}]={mutation!r}: give a list of values, a search-space "
                "domain (tune.uniform, tune.loguniform, tune.choice, ...), a function returning a value, or a dict"
            )
    return out


def _fill_missing(config: dict[str, Any], mutations: Mapping[str, Any], sample: Callable[[Any], Any]) -> None:
    for name, mutation in mutations.items():
        if isinstance(mutation, Mapping):
            _fill_missing(config.setdefault(name, {}), mutation, sample)
        elif name not in config:
            config[name] = sample(mutation)


def _explored(
    config: dict[str, Any],
    mutations: Mapping[str, Any],
    *,
    resample_probability: float,
    factors: Sequence[float],
    rng: random.Random,
    sample: Callable[[Any], Any],
) -> dict[str, Any]:
    for name, mutation in mutations.items():
        if isinstance(mutation, Mapping):
            config[name] = _explored(
                dict(config.get(name) or {}), mutation,
                resample_probability=resample_probability, factors=factors, rng=rng, sample=sample,
            )
            continue
        old = config.get(name)
        if isinstance(mutation, list):
            if rng.random() < resample_probability or old not in mutation:
                config[name] = rng.choice(mutation)
            else:  # a neighbour in the list (as in Ray: the list's order is the scale)
                i = mutation.index(old) + rng.choice([-1, 1])
                config[name] = mutation[min(max(i, 0), len(mutation) - 1)]
        elif rng.random() < resample_probability or not _is_number(old):
            config[name] = sample(mutation)
        else:
            new = old * rng.choice(list(factors))
            config[name] = int(new) if isinstance(old, int | np.integer) else new
    return config
