"""Samplers: where a sweep's trial configs come from (``Sampler.ask``/``tell``), behind random, grid and TPE.

Imports nothing heavier than numpy (Optuna only when TPE is used).
"""

from __future__ import annotations

import copy
import itertools
import math
import numbers
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from sweepflow.tasks.sweep.space import (
    CONTINUOUS_DOMAINS,
    Choice,
    Constant,
    Grid,
    LogUniform,
    ParamSpace,
    Path,
    Pow2,
    QRandInt,
    RandInt,
    SampleFrom,
    SearchSpace,
    Uniform,
    parse_space,
    plain,
    set_leaf,
)

__all__ = [
    "SAMPLERS",
    "GridSampler",
    "RandomSampler",
    "Sampler",
    "SamplerExhausted",
    "TPESampler",
    "generate_trials",
    "make_sampler",
]


# --------------------------------------------------------------------------------------------------
# Samplers
# --------------------------------------------------------------------------------------------------


class SamplerExhausted(Exception):
    """``ask()`` was called after the sampler proposed all its trials (or its searcher said it has no more:
    then ``total`` is lowered to the trials it proposed)."""


class SamplerWaiting(Exception):
    """``ask()`` has no config now (a searcher waiting for results, as a Ray ``Searcher.suggest`` returning
    None): the sweep asks again once a running trial ends."""


class Sampler(ABC):
    """Where a sweep's trial configs come from, one at a time: ``ask()`` the next trial's config, ``tell()`` it
    that trial's result. Random and grid samplers ignore results (the random sampler's sequence is reproducible
    from its seed); TPE proposes each config from the results told so far.

    ``total`` is how many trials the sampler proposes; the ``number`` ``ask`` returns identifies the trial to
    ``tell`` (trials finish out of order).
    """

    total: int

    @abstractmethod
    def ask(self) -> tuple[int, dict[str, Any]]:
        """(number, config) of the next trial; raises ``SamplerExhausted`` after ``total`` trials."""

    def tell(self, number: int, value: float | None) -> None:  # noqa: B027 - optional for list samplers
        """The trial's result: the best value its selection metric reached, or None if it failed."""

    def tell_result(self, number: int, result: Any) -> None:
        """An ended trial's ``TrialResult``: by default ``tell`` gets the best value of the selection metric it
        reached (None if it failed); a multi-objective search reads every objective's last value from it."""
        self.tell(number, result.best if result.status.selectable else None)

    def ask_known(self, config: dict[str, Any]) -> int:
        """The next trial is ``config``, which a resumed sweep's trial already ran with; returns its number
        for ``tell``. Random (seeded) and grid samplers propose the same sequence again, so this is the config they
        would propose; TPE records it as its next proposal."""
        number, _ = self.ask()
        return number

    def started(self, number: int, trial_id: str) -> None:  # noqa: B027 - optional: only searchers use it
        """Proposal ``number`` runs as the sweep's trial ``trial_id`` (its reports reach ``on_report`` by it)."""

    def on_report(self, trial_id: str, metrics: dict[str, Any]) -> None:  # noqa: B027 - optional, as above
        """A running trial's report (called from the trial's thread, as the scheduler's ``on_trial_result``)."""


class _ListSampler(Sampler):
    """A sampler whose configs are a list made up front (by ``generate``)."""

    def __init__(self, num_samples: int) -> None:
        _check_num_samples(num_samples)
        self._num_samples = num_samples
        self._configs: list[dict[str, Any]] | None = None
        self._asked = 0

    def generate(self, num_samples: int) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _planned(self) -> list[dict[str, Any]]:
        if self._configs is None:
            self._configs = self.generate(self._num_samples)
        return self._configs

    @property
    def total(self) -> int:  # type: ignore[override]
        return len(self._planned())

    def ask(self) -> tuple[int, dict[str, Any]]:
        configs = self._planned()
        if self._asked >= len(configs):
            raise SamplerExhausted(f"all {len(configs)} planned trials were proposed")
        self._asked += 1
        return self._asked - 1, configs[self._asked - 1]


def _check_num_samples(num_samples: int) -> None:
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")


class RandomSampler(Sampler):
    """Random search crossed with grids, as Ray Tune's ``BasicVariantGenerator``: the sampler of the pipeline's
    ``sampler="random"`` and of ``tune.run``/``Tuner`` without a ``search_alg``.

    ``space``: a sweep's search space (data, or parsed: ``SearchSpace``), or a Ray Tune ``param_space`` parsed by
    ``parse_param_space`` (nested dicts, ``{"grid_search": [...]}``, ``tune.sample_from``). Both come down to
    ``(path, domain)`` leaves, every grid a ``Grid``.

    The trials are ``num_samples`` passes over the cartesian product of the grids (so grids of 2 and 3 values and
    ``num_samples=4`` give 4 * 2 * 3 = 24 trials, as ``tune.run(num_samples=4)`` would). In each config, made when
    asked: the random domains are drawn in the space's order, then the ``sample_from`` functions are called in
    order with ``spec.config`` (nested namespaces) holding the values resolved so far; the config's keys are in
    the space's order, its values plain Python (copies). With ``seed`` every draw comes from one
    ``numpy.random.Generator`` seeded with it (the same space and seed always give the same sequence); without,
    each config's draws come from NumPy's global state, as Ray's do (``np.random.seed`` reproduces them).
    ``sample_from`` functions draw from wherever they like.
    """

    def __init__(
        self, space: Mapping[str, Any] | SearchSpace | ParamSpace, seed: int | None = None, *, num_samples: int = 1
    ) -> None:
        _check_num_samples(num_samples)
        self.space = space if isinstance(space, ParamSpace) else parse_space(space)
        self.seed = seed
        self._seeded = None if seed is None else np.random.default_rng(seed)
        leaves = self.space.leaves
        self._paths = [path for path, _ in leaves]
        self._values = [(path, dom) for path, dom in leaves if not isinstance(dom, SampleFrom)]
        self._functions = [(path, dom) for path, dom in leaves if isinstance(dom, SampleFrom)]
        grids = [(path, dom) for path, dom in leaves if isinstance(dom, Grid)]
        self._combos = [
            dict(zip((path for path, _ in grids), combo, strict=True))
            for combo in itertools.product(*(dom.values for _, dom in grids))
        ]
        self.total = num_samples * len(self._combos)
        self._asked = 0

    def ask(self) -> tuple[int, dict[str, Any]]:
        if self._asked >= self.total:
            raise SamplerExhausted(f"all {self.total} trials were proposed")
        config = self._config(self._combos[self._asked % len(self._combos)])
        self._asked += 1
        return self._asked - 1, config

    def generate(self, num_samples: int) -> list[dict[str, Any]]:
        """``num_samples`` passes over the grids' combinations, continuing this sampler's draws (``ask``'s count
        is left alone)."""
        _check_num_samples(num_samples)
        return [self._config(combo) for _ in range(num_samples) for combo in self._combos]

    def _config(self, combo: dict[Path, Any]) -> dict[str, Any]:
        # Unseeded, each config's draws come from NumPy's global state (as in Ray: np.random.seed reproduces them).
        rng = self._seeded or np.random.default_rng(np.random.randint(2**32, dtype=np.uint64))
        resolved: dict[Path, Any] = {}
        config: dict[str, Any] = {}
        for path, dom in self._values:  # in the space's order: the random domains draw in that order
            if isinstance(dom, Grid):
                resolved[path] = plain(combo[path])
            elif isinstance(dom, Constant):
                resolved[path] = plain(dom.value)
            else:
                resolved[path] = dom.sample(rng)
            set_leaf(config, path, resolved[path])
        if not self._functions:
            return config
        for path, dom in self._functions:  # dependent values last: they may read the others
            resolved[path] = plain(dom.sample(rng, SimpleNamespace(config=_namespace(config))))
            set_leaf(config, path, resolved[path])
        ordered: dict[str, Any] = {}  # the functions' values in their places
        for path in self._paths:
            set_leaf(ordered, path, resolved[path])
        return ordered


def _namespace(config: Mapping[str, Any]) -> SimpleNamespace:
    """A config as ``sample_from``'s ``spec.config``: nested namespaces (``spec.config.model.width``)."""
    return SimpleNamespace(**{k: _namespace(v) if isinstance(v, Mapping) else v for k, v in config.items()})


class GridSampler(_ListSampler):
    """Exhaustive search: the cartesian product of every discrete domain.

    Grid and choice values are enumerated, and so are the finite integer domains (randint, qrandint,
    pow2), which lets one space serve both random and grid sweeps. Continuous domains cannot be
    enumerated and are rejected. ``max_combinations`` guards against an accidental huge product
    (e.g. randint over 0..10**6), which would otherwise create that many Prefect task runs.
    """

    def __init__(
        self, space: Mapping[str, Any] | SearchSpace, max_combinations: int = 10_000, *, num_samples: int = 1
    ) -> None:
        super().__init__(num_samples)
        self.space = parse_space(space)
        continuous = [name for name, dom in self.space.params if isinstance(dom, CONTINUOUS_DOMAINS)]
        if continuous:
            raise ValueError(
                f"grid sampler cannot enumerate continuous parameters {continuous}; "
                f"use sampler='random', or replace them with "
                f'{{"type": "choice", "values": [...]}} / {{"type": "grid", "values": [...]}}'
            )
        self._axes: list[tuple[str, list[Any]]] = []
        for name, dom in self.space.params:
            if isinstance(dom, Constant):
                self._axes.append((name, [dom.value]))
            else:
                self._axes.append((name, dom.enumerate()))
        self.num_combinations = math.prod(len(values) for _, values in self._axes)
        if self.num_combinations > max_combinations:
            sizes = {name: len(values) for name, values in self._axes if len(values) > 1}
            raise ValueError(
                f"grid sampler would generate {self.num_combinations} configs (axis sizes {sizes}), "
                f"more than max_combinations={max_combinations}; narrow the ranges or use sampler='random'"
            )

    def generate(self, num_samples: int = 1) -> list[dict[str, Any]]:
        """Every combination, repeated ``num_samples`` times (repeats are useful to measure noise)."""
        _check_num_samples(num_samples)
        names = [name for name, _ in self._axes]
        configs = []
        for _ in range(num_samples):
            for combo in itertools.product(*(values for _, values in self._axes)):
                configs.append({name: plain(value) for name, value in zip(names, combo, strict=True)})
        return configs


class TPESampler(Sampler):
    """Adaptive search with Optuna's TPE (Tree-structured Parzen Estimator), like Ray Tune's ``OptunaSearch``:
    each new trial's config is proposed from the results of the trials finished so far (``ask``/``tell``).

    Domains map onto Optuna distributions: uniform/loguniform -> floats (log scale for loguniform),
    randint/qrandint/pow2 -> integers (of the multiple or the exponent), choice -> a categorical over the
    values' positions (so values may be lists), constants stay fixed; grid domains are rejected (a grid is
    exhaustive by definition: use the grid or random sampler). With several trials running at once, Optuna's
    "constant liar" keeps concurrent proposals from piling onto the same point. ``seed`` makes the sequence
    reproducible for the same sequence of results.
    """

    def __init__(
        self,
        space: Mapping[str, Any] | SearchSpace,
        *,
        mode: str,
        seed: int | None = None,
        n_startup_trials: int = 4,
        num_samples: int | None = None,
        modes: Sequence[str] = (),
        sampler: Any = None,
    ) -> None:
        """``modes``: one ``"min"``/``"max"`` per objective of a multi-objective study (``mode`` is then unused and
        ``tell`` takes a list of values); ``sampler``: an Optuna sampler to use instead of TPE."""
        if num_samples is not None:
            _check_num_samples(num_samples)
        self.total = num_samples  # type: ignore[assignment]  # None: asks are not limited
        self._asked = 0
        try:
            import optuna
        except ImportError as exc:
            raise ImportError("sampler='tpe' needs Optuna: pip install 'optuna>=4'") from exc
        if any(m not in ("min", "max") for m in (*modes, *(() if modes else (mode,)))):
            raise ValueError(f"mode must be 'min' or 'max', got {list(modes) or mode!r}")
        self.space = parse_space(space)
        grids = self.space.grid_names
        if grids:
            raise ValueError(
                f"sampler='tpe' cannot search grid parameters {grids}: a grid is tried exhaustively; use "
                f'{{"type": "choice", "values": [...]}} for TPE, or sampler="grid"/"random"'
            )
        self._optuna = optuna
        self._distributions: dict[str, Any] = {}
        for name, dom in self.space.params:
            if isinstance(dom, Uniform):
                self._distributions[name] = optuna.distributions.FloatDistribution(dom.low, dom.high)
            elif isinstance(dom, LogUniform):
                self._distributions[name] = optuna.distributions.FloatDistribution(
                    dom.low, dom.high, log=True
                )
            elif isinstance(dom, RandInt):
                self._distributions[name] = optuna.distributions.IntDistribution(dom.low, dom.high - 1)
            elif isinstance(dom, QRandInt):
                self._distributions[name] = optuna.distributions.IntDistribution(*dom._k_range)
            elif isinstance(dom, Pow2):
                self._distributions[name] = optuna.distributions.IntDistribution(*dom._exp_range)
            elif isinstance(dom, Choice):
                self._distributions[name] = optuna.distributions.CategoricalDistribution(
                    range(len(dom.values))
                )
            elif not isinstance(dom, Constant):
                raise ValueError(
                    f"{name}: {type(dom).__name__} cannot be searched by TPE (OptunaSearch); use "
                    "choice/uniform/loguniform/randint/qrandint/pow2, or the random sampler"
                )
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._study = optuna_study(optuna, mode=mode, modes=modes, seed=seed, n_startup_trials=n_startup_trials,
                                   sampler=sampler)

    def ask(self) -> tuple[int, dict[str, Any]]:
        """(trial number for ``tell``, the config)."""
        if self.total is not None and self._asked >= self.total:
            raise SamplerExhausted(f"all {self.total} trials were proposed")
        self._asked += 1
        trial = self._study.ask(self._distributions)
        config: dict[str, Any] = {}
        for name, dom in self.space.params:
            value = trial.params.get(name)
            if isinstance(dom, Constant):
                config[name] = plain(dom.value)
            elif isinstance(dom, QRandInt):
                config[name] = int(value) * dom.q
            elif isinstance(dom, Pow2):
                config[name] = 2 ** int(value)
            elif isinstance(dom, Choice):
                config[name] = plain(dom.values[int(value)])
            else:
                config[name] = plain(value)
        return trial.number, config

    def ask_known(self, config: dict[str, Any]) -> int:
        """Propose ``config`` (a resumed sweep's trial) as the next trial, in Optuna's own terms."""
        self.enqueue(config)
        number, _ = self.ask()
        return number

    def enqueue(self, config: Mapping[str, Any]) -> None:
        """The next ``ask`` proposes ``config``'s values (Optuna's ``enqueue_trial``); the searched parameters it
        leaves out are proposed as usual."""
        self._study.enqueue_trial(self.optuna_params(config), skip_if_exists=False)

    def add_evaluated(self, config: Mapping[str, Any], value: float) -> None:
        """A config evaluated elsewhere, with its result: TPE learns from it as from a finished trial (nothing
        runs it). ``config`` must give every searched parameter."""
        missing = [name for name in self._distributions if name not in config]
        if missing:
            raise ValueError(f"an evaluated config must give every searched parameter; {config} lacks {missing}")
        if not math.isfinite(value):
            raise ValueError(f"the result of the evaluated config {config} must be a finite number, got {value!r}")
        internal = self.optuna_params(config)
        self._study.add_trial(
            self._optuna.trial.create_trial(
                params={name: internal[name] for name in self._distributions},
                distributions=self._distributions,
                value=float(value),
            )
        )

    def optuna_params(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config``'s searched values as the Optuna parameters ``ask`` turns into them (a choice's position, a
        multiple's factor, a power of two's exponent)."""
        internal: dict[str, Any] = {}
        for name, dom in self.space.params:
            value = config.get(name)
            if isinstance(dom, Constant) or name not in config:
                continue
            if isinstance(dom, QRandInt):
                internal[name] = int(value) // dom.q
            elif isinstance(dom, Pow2):
                internal[name] = int(value).bit_length() - 1
            elif isinstance(dom, Choice):
                matches = [i for i, v in enumerate(dom.values) if plain(v) == value]
                if not matches:
                    raise ValueError(f"{name}={value!r} is not one of the choices {dom.values}")
                internal[name] = matches[0]
            else:
                internal[name] = value
        return internal

    def tell(self, number: int, value: float | Sequence[float] | None) -> None:
        """The trial's result (its best metric value; a multi-objective study's: one value per objective), or
        None if it failed."""
        tell_study(self._study, number, value)


_LOCKS = {type(threading.Lock()): threading.Lock, type(threading.RLock()): threading.RLock}


def _own_copy(sampler: Any) -> Any:
    """A deep copy of a user's Optuna sampler, with fresh locks where it holds its own: Optuna 5.1's genetic
    samplers (``NSGAIISampler``, ``NSGAIIISampler``: ``BaseGASampler._thread_lock``) hold a ``threading.Lock``,
    which ``copy.deepcopy`` refuses."""
    held = getattr(sampler, "__dict__", {}).values()
    memo = {id(value): _LOCKS[type(value)]() for value in held if type(value) in _LOCKS}
    return copy.deepcopy(sampler, memo)


def optuna_study(
    optuna: Any, *, mode: str, modes: Sequence[str] = (), seed: int | None, n_startup_trials: int, sampler: Any = None
) -> Any:
    """An Optuna study to ask/tell: one direction (``mode``) or one per objective (``modes``), on ``sampler`` or,
    by default, TPE (multi-objective TPE for several objectives, as Ray's default) with the constant liar, so
    concurrent proposals do not pile onto one point."""
    if sampler is None:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials, constant_liar=True)
    else:
        sampler = _own_copy(sampler)  # each experiment's study learns on its own copy
    if modes:
        return optuna.create_study(directions=["maximize" if m == "max" else "minimize" for m in modes], sampler=sampler)
    return optuna.create_study(direction="maximize" if mode == "max" else "minimize", sampler=sampler)


def tell_study(study: Any, number: int, value: float | Sequence[float] | None) -> None:
    """Tell an Optuna study trial ``number``'s result: a value, or a list (one per objective); None or any value
    that is not a finite number marks the trial failed."""
    import optuna

    values = list(value) if isinstance(value, Sequence) else [value]
    if not values or any(not isinstance(v, numbers.Real) or not math.isfinite(v) for v in values):
        study.tell(number, state=optuna.trial.TrialState.FAIL)
    elif isinstance(value, Sequence):
        study.tell(number, [float(v) for v in values])
    else:
        study.tell(number, float(values[0]))


SAMPLERS = ("random", "grid", "tpe")


def make_sampler(
    kind: str, space: Mapping[str, Any] | SearchSpace, *, num_samples: int, seed: int | None, mode: str
) -> Sampler:
    """The sampler a sweep config names: ``random`` (seeded), ``grid`` (exhaustive) or ``tpe`` (adaptive)."""
    if kind == "random":
        return RandomSampler(space, seed=seed, num_samples=num_samples)
    if kind == "grid":
        return GridSampler(space, num_samples=num_samples)
    if kind == "tpe":
        return TPESampler(space, mode=mode, seed=seed, num_samples=num_samples)
    raise ValueError(f"unknown sampler {kind!r}; valid samplers: {', '.join(SAMPLERS)}")


def generate_trials(
    space: Mapping[str, Any] | SearchSpace,
    *,
    sampler: str = "random",
    num_samples: int,
    seed: int | None = None,
) -> list[dict[str, Any]]:
    """Return the concrete trial configs for a sweep (plain Python values, JSON-serialisable).

    ``sampler="random"``: ``num_samples`` x (number of grid combinations) configs, like Ray Tune.
    ``sampler="grid"``: ``num_samples`` x (product of all discrete domain sizes) configs; ``seed`` is
    unused since nothing is random.
    """
    if sampler == "random":
        return RandomSampler(space, seed=seed).generate(num_samples)
    if sampler == "grid":
        return GridSampler(space).generate(num_samples)
    if sampler == "tpe":
        raise ValueError("sampler='tpe' is adaptive: use TPESampler.ask/tell as results arrive")
    raise ValueError(f"unknown sampler {sampler!r}; valid samplers: {', '.join(SAMPLERS)}")
