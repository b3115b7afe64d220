"""Hyperparameter search spaces given as plain data (the samplers that draw from them: ``samplers.py``).

Search spaces arrive as Prefect deployment parameters, so they must be JSON/YAML-able data rather
than Python objects such as Ray's ``tune.loguniform(...)``. This module parses such a dict once,
up front (so a typo fails the flow before any GPU time is spent), into frozen domain dataclasses,
and generates the list of concrete configs that the sweep flow fans out over.

Space format: ``{param_name: constant | {"type": ..., ...}}``. Any non-dict value is a constant
and is passed through unchanged (use ``{"type": "constant", "value": {...}}`` for a dict-valued
constant). The domain types are::

    {"type": "choice", "values": [...]}            one value drawn at random per trial
    {"type": "grid", "values": [...]}              every value is tried (crossed with other grids)
    {"type": "uniform", "low": a, "high": b}       float in [a, b)
    {"type": "loguniform", "low": a, "high": b}    float in [a, b], log-uniform, needs 0 < a < b
    {"type": "randint", "low": a, "high": b}       int in [a, b) (high exclusive, like tune.randint)
    {"type": "qrandint", "low": a, "high": b, "q": q}
                                                   multiple of q in [a, b] (inclusive, like tune.qrandint)
    {"type": "pow2", "low": 4, "high": 256}        power of two in [low, high], uniform over exponents
    {"type": "quniform", "low": a, "high": b, "q": q}
                                                   float in [a, b) rounded to a multiple of q
    {"type": "randn", "mean": m, "sd": s}          float from a normal distribution

These domains are also what ``sweepflow.tune``'s ``tune.choice``/``uniform``/``loguniform``/``randint``/
``qrandint``/``quniform``/``randn`` return, so a script's space and a deployment's space are one vocabulary. Only
``tune.sample_from`` (:class:`SampleFrom`, a Python function) has no data form.

Grids: the canonical grid is the :class:`Grid` domain (what ``{"type": "grid", "values": [...]}`` parses to).
Ray's spelling ``{"grid_search": [...]}`` (what ``tune.grid_search`` returns) is accepted only in a Ray Tune
``param_space`` (:func:`parse_param_space`), where it becomes a ``Grid`` too; :func:`is_grid` recognises both.
A Tune ``param_space`` may nest dicts: its parameters are then named by paths (``("model", "lr")``).

This module deliberately imports nothing heavier than numpy, so that it can be used (and tested)
without Prefect, MLflow, torch or Dask.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from sweepflow.tasks.sweep.domain_specs import EXAMPLES, float_arg, int_arg, spec_kind

__all__ = [
    "Choice",
    "Constant",
    "Domain",
    "Grid",
    "LogUniform",
    "Normal",
    "ParamSpace",
    "Path",
    "Pow2",
    "QRandInt",
    "QUniform",
    "RandInt",
    "SampleFrom",
    "SearchSpace",
    "Uniform",
    "config_leaves",
    "grid_values",
    "is_grid",
    "parse_domain",
    "parse_param_space",
    "parse_space",
    "set_leaf",
]


# --------------------------------------------------------------------------------------------------
# Domains
# --------------------------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """Return ``value`` as plain Python data (numpy scalars unwrapped, containers copied).

    Configs are serialised to JSON (Prefect parameters, MLflow params), and numpy scalars such as
    ``np.int64`` are not JSON-serialisable; copying also keeps trials from sharing mutable lists.
    """
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return copy.deepcopy(value)


@dataclass(frozen=True)
class Constant:
    """A value passed through unchanged to every trial."""

    value: Any

    def to_raw(self) -> Any:
        if isinstance(self.value, Mapping):
            return {"type": "constant", "value": plain(self.value)}
        return plain(self.value)


@dataclass(frozen=True)
class Choice:
    """One of ``values``, drawn uniformly at random for each trial (enumerated by the grid sampler)."""

    values: tuple[Any, ...]

    def sample(self, rng: np.random.Generator) -> Any:
        return plain(self.values[int(rng.integers(len(self.values)))])

    def enumerate(self) -> list[Any]:
        return [plain(v) for v in self.values]

    def to_raw(self) -> dict[str, Any]:
        return {"type": "choice", "values": plain(list(self.values))}


@dataclass(frozen=True)
class Grid:
    """Every one of ``values`` is tried; several grids are crossed (Ray's ``tune.grid_search``)."""

    values: tuple[Any, ...]

    def enumerate(self) -> list[Any]:
        return [plain(v) for v in self.values]

    def to_raw(self) -> dict[str, Any]:
        return {"type": "grid", "values": plain(list(self.values))}


@dataclass(frozen=True)
class Uniform:
    """A float drawn uniformly from ``[low, high)``."""

    low: float
    high: float

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))

    def to_raw(self) -> dict[str, Any]:
        return {"type": "uniform", "low": self.low, "high": self.high}


@dataclass(frozen=True)
class LogUniform:
    """A float whose logarithm is uniform on ``[log(low), log(high)]``: for learning rates etc."""

    low: float
    high: float

    def sample(self, rng: np.random.Generator) -> float:
        value = math.exp(float(rng.uniform(math.log(self.low), math.log(self.high))))
        # exp(log(x)) can overshoot the bounds by one ulp; the documented range must hold exactly.
        return min(max(value, self.low), self.high)

    def to_raw(self) -> dict[str, Any]:
        return {"type": "loguniform", "low": self.low, "high": self.high}


@dataclass(frozen=True)
class RandInt:
    """An int drawn uniformly from ``[low, high)`` (high exclusive, like Ray's ``tune.randint``)."""

    low: int
    high: int

    def sample(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.low, self.high))

    def enumerate(self) -> list[int]:
        return list(range(self.low, self.high))

    def to_raw(self) -> dict[str, Any]:
        return {"type": "randint", "low": self.low, "high": self.high}


@dataclass(frozen=True)
class QRandInt:
    """A multiple of ``q`` drawn uniformly from ``[low, high]`` (inclusive, like ``tune.qrandint``)."""

    low: int
    high: int
    q: int

    @property
    def _k_range(self) -> tuple[int, int]:
        # Smallest and largest k such that k*q lies in [low, high].
        return -(-self.low // self.q), self.high // self.q

    def sample(self, rng: np.random.Generator) -> int:
        k_lo, k_hi = self._k_range
        return int(rng.integers(k_lo, k_hi + 1)) * self.q

    def enumerate(self) -> list[int]:
        k_lo, k_hi = self._k_range
        return [k * self.q for k in range(k_lo, k_hi + 1)]

    def to_raw(self) -> dict[str, Any]:
        return {"type": "qrandint", "low": self.low, "high": self.high, "q": self.q}


@dataclass(frozen=True)
class Pow2:
    """A power of two in ``[low, high]``, uniform over the exponent.

    This is the Ray Tune CIFAR tutorial's ``tune.sample_from(lambda _: 2 ** np.random.randint(2, 9))``
    written as data: ``{"type": "pow2", "low": 4, "high": 256}``.
    """

    low: int
    high: int

    @property
    def _exp_range(self) -> tuple[int, int]:
        # (low - 1).bit_length() is the smallest e with 2**e >= low; high.bit_length() - 1 the largest
        # e with 2**e <= high. Integer arithmetic avoids log2 rounding at exact powers of two.
        return (self.low - 1).bit_length(), self.high.bit_length() - 1

    def sample(self, rng: np.random.Generator) -> int:
        e_lo, e_hi = self._exp_range
        return 2 ** int(rng.integers(e_lo, e_hi + 1))

    def enumerate(self) -> list[int]:
        e_lo, e_hi = self._exp_range
        return [2**e for e in range(e_lo, e_hi + 1)]

    def to_raw(self) -> dict[str, Any]:
        return {"type": "pow2", "low": self.low, "high": self.high}


@dataclass(frozen=True)
class QUniform:
    """A float drawn uniformly from ``[low, high)``, rounded to a multiple of ``q`` (Ray's ``tune.quniform``)."""

    low: float
    high: float
    q: float

    def sample(self, rng: np.random.Generator) -> float:
        return float(np.round(float(rng.uniform(self.low, self.high)) / self.q) * self.q)

    def to_raw(self) -> dict[str, Any]:
        return {"type": "quniform", "low": self.low, "high": self.high, "q": self.q}


@dataclass(frozen=True)
class Normal:
    """A float from a normal distribution (Ray's ``tune.randn``)."""

    mean: float
    sd: float

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.normal(self.mean, self.sd))

    def to_raw(self) -> dict[str, Any]:
        return {"type": "randn", "mean": self.mean, "sd": self.sd}


@dataclass(frozen=True)
class SampleFrom:
    """A value a Python function computes for each trial (Ray's ``tune.sample_from``): it gets the trial's spec,
    whose ``spec.config`` holds the trial's other values. A function is not data, so it has no raw form."""

    func: Any  # Callable[[spec], Any]

    def sample(self, rng: np.random.Generator, spec: Any = None) -> Any:
        return self.func(spec)  # the function draws from wherever it likes

    def to_raw(self) -> dict[str, Any]:
        raise ValueError(
            f"tune.sample_from({getattr(self.func, '__name__', self.func)!r}) is a Python function: it cannot be "
            "written as data (a deployment parameter) or searched by a search algorithm; use a domain such as "
            '{"type": "pow2", ...} or {"type": "choice", ...} instead'
        )


Domain: TypeAlias = (
    Constant | Choice | Grid | Uniform | LogUniform | RandInt | QRandInt | Pow2 | QUniform | Normal | SampleFrom
)

RANDOM_DOMAINS = (Choice, Uniform, LogUniform, RandInt, QRandInt, Pow2, QUniform, Normal, SampleFrom)
CONTINUOUS_DOMAINS = (Uniform, LogUniform, QUniform, Normal, SampleFrom)


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space: ``(name, domain)`` pairs in the order they were given.

    Order is kept so that generated configs, trial names and the random draw sequence (and hence
    reproducibility by seed) do not depend on dict hashing.
    """

    params: tuple[tuple[str, Domain], ...]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.params]

    @property
    def varying_names(self) -> list[str]:
        """Names of the non-constant parameters: the useful keys for :func:`describe_trial`."""
        return [name for name, dom in self.params if not isinstance(dom, Constant)]

    @property
    def grid_names(self) -> list[str]:
        return [name for name, dom in self.params if isinstance(dom, Grid)]

    @property
    def num_grid_combinations(self) -> int:
        """How many configs one pass over the grid produces (1 if there are no grid params)."""
        return math.prod(len(dom.values) for _, dom in self.params if isinstance(dom, Grid))

    def __getitem__(self, name: str) -> Domain:
        for key, dom in self.params:
            if key == name:
                return dom
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """The raw (JSON-able) form; ``parse_space(space.to_dict()) == space``."""
        return {name: dom.to_raw() for name, dom in self.params}

    @property
    def leaves(self) -> tuple[tuple[Path, Domain], ...]:
        """The parameters as ``(path, domain)``, as a :class:`ParamSpace` gives them: each name is a path of one key."""
        return tuple(((name,), dom) for name, dom in self.params)


# --------------------------------------------------------------------------------------------------
# Nested configs: a Ray Tune param_space
# --------------------------------------------------------------------------------------------------

Path: TypeAlias = tuple[str, ...]


def is_grid(value: Any) -> bool:
    """A grid, in either spelling: a :class:`Grid` domain (canonical) or Ray's ``{"grid_search": [...]}``."""
    return isinstance(value, Grid) or (isinstance(value, Mapping) and set(value) == {"grid_search"})


def grid_values(value: Any) -> list[Any]:
    """The values of a grid (either spelling, see :func:`is_grid`)."""
    return list(value.values) if isinstance(value, Grid) else list(value["grid_search"])


def config_leaves(config: Mapping[str, Any], prefix: Path = ()) -> Iterator[tuple[Path, Any]]:
    """A nested config's leaves, ``(path, value)``, in the order written: nested dicts are opened (a dict that
    holds ``"grid_search"`` is a leaf); an empty nested dict has no leaves."""
    for key, value in config.items():
        if isinstance(value, Mapping) and "grid_search" not in value:
            yield from config_leaves(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def set_leaf(config: dict[str, Any], path: Path, value: Any) -> None:
    """``config[path[0]]...[path[-1]] = value``, making the nested dicts on the way."""
    node = config
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


@dataclass(frozen=True)
class ParamSpace:
    """A Ray Tune ``param_space`` (nested dicts of ``tune.*`` domains, grids and plain values) as its leaves,
    ``(path, domain)`` in the order written: the form the random sampler draws from, as ``SearchSpace.leaves``."""

    leaves: tuple[tuple[Path, Domain], ...]


def parse_param_space(param_space: Mapping[str, Any]) -> ParamSpace:
    """A Ray Tune ``param_space`` normalised: a grid in either spelling becomes a :class:`Grid`, a domain stays
    itself, any other value is a :class:`Constant` (passed to every trial as it is, copied)."""
    leaves: list[tuple[Path, Domain]] = []
    for path, value in config_leaves(param_space):
        if isinstance(value, Grid | Constant) or isinstance(value, RANDOM_DOMAINS):
            leaves.append((path, value))
        elif is_grid(value):
            leaves.append((path, Grid(tuple(grid_values(value)))))
        else:
            leaves.append((path, Constant(value)))
    return ParamSpace(tuple(leaves))


# --------------------------------------------------------------------------------------------------
# Parsing and validation
# --------------------------------------------------------------------------------------------------
# The written form's tables and argument checks are in domain_specs.py.


def _values_arg(name: str, kind: str, value: Any) -> tuple[Any, ...]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence) or len(value) == 0:
        raise ValueError(
            f"{name}: {kind} needs a non-empty list under 'values', got {value!r}; e.g. {EXAMPLES[kind]}"
        )
    return tuple(plain(v) for v in value)


def _parse_uniform(name: str, kind: str, raw: Mapping[str, Any]) -> Uniform | LogUniform:
    """``uniform`` or ``loguniform`` (``kind``)."""
    low = float_arg(name, kind, "low", raw["low"])
    high = float_arg(name, kind, "high", raw["high"])
    if kind == "loguniform" and not 0 < low < high:
        raise ValueError(
            f"{name}: loguniform needs 0 < low < high, got low={raw['low']!r}, high={raw['high']!r}; "
            f"the log of a bound <= 0 is undefined, use e.g. low=1e-5 instead of 0"
        )
    if not low < high:
        raise ValueError(
            f"{name}: uniform needs low < high, got low={raw['low']!r}, high={raw['high']!r}; "
            f"swap the bounds, or use a constant if the value is fixed"
        )
    return Uniform(low, high) if kind == "uniform" else LogUniform(low, high)


def _parse_quniform(name: str, raw: Mapping[str, Any]) -> QUniform:
    kind = "quniform"
    low = float_arg(name, kind, "low", raw["low"])
    high = float_arg(name, kind, "high", raw["high"])
    q = float_arg(name, kind, "q", raw["q"])
    if not low < high:
        raise ValueError(f"{name}: quniform needs low < high, got low={raw['low']!r}, high={raw['high']!r}")
    if not q > 0:
        raise ValueError(f"{name}: quniform needs q > 0 (values are rounded to multiples of q), got q={q}")
    return QUniform(low, high, q)


def _parse_randn(name: str, raw: Mapping[str, Any]) -> Normal:
    kind = "randn"
    mean = float_arg(name, kind, "mean", raw["mean"])
    sd = float_arg(name, kind, "sd", raw["sd"])
    if not sd > 0:
        raise ValueError(f"{name}: randn needs sd > 0, got sd={sd}")
    return Normal(mean, sd)


def _parse_randint(name: str, raw: Mapping[str, Any]) -> RandInt:
    kind = "randint"
    low = int_arg(name, kind, "low", raw["low"])
    high = int_arg(name, kind, "high", raw["high"])
    if not low < high:
        raise ValueError(
            f"{name}: randint needs low < high (high is exclusive), got low={low}, high={high}; "
            f"to include {high} set high={high + 1}"
        )
    return RandInt(low, high)


def _parse_qrandint(name: str, raw: Mapping[str, Any]) -> QRandInt:
    kind = "qrandint"
    low = int_arg(name, kind, "low", raw["low"])
    high = int_arg(name, kind, "high", raw["high"])
    q = int_arg(name, kind, "q", raw["q"])
    if q < 1:
        raise ValueError(f"{name}: qrandint needs q >= 1, got q={q}")
    if not low <= high:
        raise ValueError(f"{name}: qrandint needs low <= high (both inclusive), got low={low}, high={high}")
    dom = QRandInt(low, high, q)
    k_lo, k_hi = dom._k_range
    if k_lo > k_hi:
        raise ValueError(
            f"{name}: qrandint has no multiple of q={q} in [{low}, {high}]; widen the range or change q"
        )
    return dom


def _parse_pow2(name: str, raw: Mapping[str, Any]) -> Pow2:
    kind = "pow2"
    low = int_arg(name, kind, "low", raw["low"])
    high = int_arg(name, kind, "high", raw["high"])
    if low < 1:
        raise ValueError(
            f"{name}: pow2 needs low >= 1 (2**0 = 1 is the smallest power of two), got low={low}"
        )
    dom = Pow2(low, high)
    e_lo, e_hi = dom._exp_range
    if e_lo > e_hi:
        raise ValueError(
            f"{name}: pow2 has no power of two in [{low}, {high}]; "
            f"use bounds that are powers of two, e.g. low=4, high=256"
        )
    return dom


def parse_domain(name: str, raw: Any) -> Domain:
    """One parameter's spec (a constant, or a dict with a ``type`` key) as its domain; ``ValueError`` names
    ``name``, the problem and the fix."""
    if not isinstance(raw, Mapping):
        return Constant(plain(raw))
    kind = spec_kind(name, raw)
    if kind == "constant":
        return Constant(plain(raw["value"]))
    if kind == "choice":
        return Choice(_values_arg(name, kind, raw["values"]))
    if kind == "grid":
        return Grid(_values_arg(name, kind, raw["values"]))
    if kind in ("uniform", "loguniform"):
        return _parse_uniform(name, kind, raw)
    if kind == "quniform":
        return _parse_quniform(name, raw)
    if kind == "randn":
        return _parse_randn(name, raw)
    if kind == "randint":
        return _parse_randint(name, raw)
    if kind == "qrandint":
        return _parse_qrandint(name, raw)
    return _parse_pow2(name, raw)


def parse_space(raw: Mapping[str, Any] | SearchSpace) -> SearchSpace:
    """Validate a raw search-space dict and return the parsed :class:`SearchSpace`.

    All parameters are checked before anything runs, so a bad deployment parameter fails fast with
    a ``ValueError`` that names the parameter, the problem and the fix. A ``SearchSpace`` is returned
    unchanged, so callers can accept either form.
    """
    if isinstance(raw, SearchSpace):
        return raw
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"search space must be a dict of parameter name -> value or domain spec, got {type(raw).__name__}"
        )
    params: list[tuple[str, Domain]] = []
    for name, spec in raw.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"search space parameter names must be non-empty strings, got {name!r}")
        params.append((name, parse_domain(name, spec)))
    return SearchSpace(tuple(params))
