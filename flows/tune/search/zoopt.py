"""``sweepflow.tune.search.zoopt.ZOOptSearch``: ZOOpt's sequential randomized coordinate shrinking (SRacos, the
``zoopt`` package's Tune optimizer) proposes each trial's config (Ray Tune's ``ZOOptSearch``, same module path,
arguments and meaning). Needs the ``zoopt`` extra (``pip install 'sweepflow[zoopt]'``).

The space is a dict of ``tune.*`` domains, converted as Ray does: ``uniform`` -> a continuous dimension (to 12
decimals), ``quniform`` -> a continuous one rounded to a multiple of ``q``, ``randint`` -> an ordered discrete
one over its integers, ``choice`` -> a grid (unordered) dimension; ``qrandint`` is an ordered discrete one over
its multiples of ``q``. Nested dicts are ``a/b`` parameters. Or ZOOpt's own ``dim_dict`` of
``(ValueType.CONTINUOUS, [low, high], precision)``, ``(ValueType.DISCRETE, [low, high], ordered)`` and
``(ValueType.GRID, [values])`` tuples (``tune.*`` domains may be mixed in), given here; else the experiment's
``config``/``param_space``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import cloudpickle

from sweepflow.tasks.sweep.space import (
    RANDOM_DOMAINS,
    Choice,
    QRandInt,
    QUniform,
    RandInt,
    Uniform,
    config_leaves,
    is_grid,
    plain,
)
from sweepflow.tune.search.library_searcher import LibrarySearcher
from sweepflow.tune.search.searcher import Searcher

__all__ = ["ZOOptSearch"]

#: ZOOpt's ``Parameter`` options its Tune optimizer reads, taken as ``**kwargs``.
_PARAMETER_KWARGS = ("exploration_rate", "uncertain_bits")
#: How many times ZOOpt is asked when it finds no new point in the region it chose (it chooses anew each time)
#: before the search is FINISHED.
_TRIES = 5
#: What a failed trial, or one whose last report lacks the metric, is told (ZOOpt minimises: the worst value).
_WORST = math.inf


def _zoopt() -> SimpleNamespace:
    try:
        import zoopt
        from zoopt.algos.opt_algorithms.racos.sracos import SRacosTune
        from zoopt.utils.zoo_global import gl
    except ImportError as exc:
        raise ImportError(
            "ZOOptSearch needs ZOOpt, which is not installed: pip install 'sweepflow[zoopt]' (or 'zoopt>=0.4.1')"
        ) from exc
    return SimpleNamespace(zoopt=zoopt, SRacosTune=SRacosTune, gl=gl, ValueType=zoopt.ValueType)


@dataclass(frozen=True)
class _Dim:
    """One searched parameter: ZOOpt's dimension tuple, and how ZOOpt's value of it maps to the config's.

    ``kind``: ``"float"`` (rounded to a multiple of ``q`` when given), ``"int"`` (ZOOpt's integer times ``q``),
    ``"choice"`` (ZOOpt's grid holds the index into ``values``) or ``"given"`` (a ``dim_dict`` tuple: as is)."""

    name: str
    zoopt: tuple[Any, ...]
    kind: str
    q: Any = None  # quniform's / qrandint's step
    values: tuple[Any, ...] = ()

    def decoded(self, x: Any) -> Any:
        """The config's value of ZOOpt's ``x``."""
        if self.kind == "float":
            return float(round(x / self.q) * self.q) if self.q else float(x)
        if self.kind == "int":
            return int(x) * (self.q or 1)
        if self.kind == "choice":
            return plain(self.values[int(x)])
        return plain(x)

    def encoded(self, value: Any) -> Any:
        """ZOOpt's ``x`` of a config's value (a point to evaluate); ValueError if the value is not in the space."""
        if self.kind == "given":
            return value
        if self.kind == "choice":
            for i, option in enumerate(self.values):
                if option == value and isinstance(option, bool) == isinstance(value, bool):
                    return i
            raise ValueError(f"{value!r} is not one of {list(self.values)!r}")
        low, high = self.zoopt[1]
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"{value!r} is not a number")
        if self.kind == "int":
            q = self.q or 1
            if value != int(value) or int(value) % q or not low <= int(value) // q <= high:
                raise ValueError(f"{value!r} is not an integer of the space ({self._integers()})")
            return int(value) // q
        if not low <= value <= high:
            raise ValueError(f"{value!r} is not in [{low}, {high}]")
        return float(value)

    def _integers(self) -> str:
        low, high = self.zoopt[1]
        q = self.q or 1
        return f"{low * q} to {high * q}" + (f" in steps of {q}" if q != 1 else "")


class ZOOptSearch(LibrarySearcher):
    """Ray's ``ZOOptSearch``: ``algo`` (``"asracos"`` or ``"sracos"``: ZOOpt's Tune optimizer either way, as in
    Ray), ``budget`` (how many configs it proposes: set ``num_samples`` to it; it returns ``FINISHED`` once they
    are proposed), ``dim_dict`` (ZOOpt's dimensions or ``tune.*`` domains; None: the experiment's
    ``config``/``param_space``), ``metric``/``mode`` (or the experiment's), ``points_to_evaluate`` (configs the
    first trials run, at most as many as ZOOpt's first phase samples: 4 for a budget up to 50, 6 up to 100, 12 up
    to 1000, else 22) and ``parallel_num`` (how many of its proposals run at once after that first phase; more
    asks wait for a result). ``**kwargs``: ZOOpt's ``Parameter`` options its optimizer reads, ``exploration_rate``
    (default 0.01) and ``uncertain_bits``.

    ZOOpt minimises: a ``mode="max"`` metric is told negated. ZOOpt draws from NumPy's global random state
    (``np.random.seed`` makes a search repeatable).

    Differs from Ray: a failed trial, or one whose last report lacks the metric, is told to ZOOpt as the worst
    value (Ray's tells nothing, or fails on the missing key, and ZOOpt then waits for it forever); ``budget`` is
    where the search ends (Ray's relies on ``num_samples``); every point to evaluate runs (ZOOpt takes its init
    samples only until its first result, so results are told once the points are proposed; Ray's runs the first); ``quniform`` values are multiples of ``q`` (Ray's
    gives ZOOpt only ``q``'s decimals) and ``qrandint`` ones too (Ray's drops ``q``); ``**kwargs`` other than the
    two above are refused (Ray's passes them on, where ZOOpt ignores them); when ZOOpt finds no new point in the
    region it chose it is asked again, up to 5 times, before the search is ``FINISHED`` (Ray's ends there)."""

    def __init__(
        self,
        algo: str = "asracos",
        budget: int | None = None,
        dim_dict: Mapping[str, Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: Sequence[Mapping[str, Any]] | None = None,
        parallel_num: int = 1,
        **kwargs: Any,
    ) -> None:
        if not isinstance(algo, str) or algo.lower() not in ("asracos", "sracos"):
            raise ValueError(
                f"ZOOptSearch(algo={algo!r}): give 'asracos' or 'sracos' (ZOOpt's Tune optimizers)"
            )
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 3:
            raise ValueError(
                f"ZOOptSearch(budget={budget!r}): give the number of configs to propose, an integer >= 3 (ZOOpt "
                "exits the process below that), and num_samples to match"
            )
        if isinstance(parallel_num, bool) or not isinstance(parallel_num, int) or parallel_num < 1:
            raise ValueError(f"ZOOptSearch(parallel_num={parallel_num!r}): give an integer >= 1")
        if unknown := sorted(set(kwargs) - set(_PARAMETER_KWARGS)):
            raise ValueError(
                f"ZOOptSearch(**{ {k: kwargs[k] for k in unknown}!r}): ZOOpt's Tune optimizer reads only "
                f"{', '.join(_PARAMETER_KWARGS)} of its options; give those, or leave the others out"
            )
        if points_to_evaluate is not None and (
            isinstance(points_to_evaluate, Mapping) or not isinstance(points_to_evaluate, Sequence)
        ):
            raise ValueError("ZOOptSearch(points_to_evaluate=...): pass a list of configs (dicts)")
        super().__init__(metric=metric, mode=mode)  # checks them
        self._z = _zoopt()
        self._algo, self._budget = algo.lower(), budget
        self._parallel_num, self._kwargs = parallel_num, dict(kwargs)
        self._points = [dict(p) for p in points_to_evaluate or ()]
        self._opt: Any = None
        self._dims: list[_Dim] = []
        self._precisions: list[int | None] = []  # ZOOpt keeps its dimensions' precisions in a global: ours
        self._live: dict[str, Any] = {}  # trial id -> ZOOpt solution
        # ZOOpt proposes its init samples only until its first result: results are held until the points are out.
        self._points_left = len(self._points)
        self._held: list[tuple[Any, float]] = []
        self._given = 0  # configs proposed (the budget's count)
        if dim_dict:
            self._set_space(dim_dict)

    # ------------------------------------------------------------------------------------------ the experiment

    def _has_space(self) -> bool:
        return self._opt is not None

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """A point to evaluate first, then ZOOpt's proposal; None while ZOOpt waits for running trials' results
        (after its first phase, or ``parallel_num`` running); ``FINISHED`` once ``budget`` configs were proposed
        or ZOOpt finds no new point (asked again, up to 5 times)."""
        self._check_ready()
        if self._given >= self._budget:
            return Searcher.FINISHED
        solution = self._ask()
        if isinstance(solution, str):  # ZOOpt's "FINISHED": no point it has not proposed yet
            return Searcher.FINISHED
        if solution is None:  # it waits for a running trial; with none running it has nothing more
            return None if self._live else Searcher.FINISHED
        self._given += 1
        self._live[trial_id] = solution
        if self._points_left:
            self._points_left -= 1
            if not self._points_left:
                self._tell()
        return {dim.name: dim.decoded(x) for dim, x in zip(self._dims, solution.get_x(), strict=True)}

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        """Tell ZOOpt the trial's metric (negated for ``mode='max'``); a failed trial is told the worst value."""
        solution = self._live.pop(trial_id, None)
        if solution is None:
            return
        value = self._reached(result, error)
        self._held.append((solution, _WORST if value is None else (-value if self._mode == "max" else value)))
        if not self._points_left:
            self._tell()

    def get_state(self) -> dict[str, Any]:
        """What ``save`` pickles: ZOOpt's optimizer (its samples and results), the space and the trials running,
        cloudpickled (ZOOpt's ``Parameter`` holds a lambda, which ``pickle`` refuses)."""
        return {"zoopt": cloudpickle.dumps({key: getattr(self, key) for key in _STATE})}

    def set_state(self, state: dict[str, Any]) -> None:
        """Take back what ``get_state`` returned (``restore``)."""
        for key, value in cloudpickle.loads(state["zoopt"]).items():
            setattr(self, key, value)

    # ---------------------------------------------------------------------------------------------- ZOOpt

    def _tell(self) -> None:
        self._own_precisions()
        for solution, value in self._held:
            self._opt.complete(solution, value)
        self._held = []

    def _own_precisions(self) -> None:
        self._z.gl.float_precisions = list(self._precisions)

    def _ask(self) -> Any:
        self._own_precisions()
        opt = self._opt
        # ZOOpt's "FINISHED": 100 draws from the region it chose were all proposed before; it chooses anew.
        for _ in range(_TRIES):
            solution = opt.suggest()
            if (
                solution is None
                and opt.semaphore == 0
                and opt.complete_num >= opt.get_parameters().get_train_size()
            ):
                # ZOOpt 0.4 closes its gate when its first phase is proposed and opens it on that phase's last
                # result: if that result came first, the gate would stay closed. It has every result: open it.
                opt.semaphore = 1
                solution = opt.suggest()
            if not isinstance(solution, str):
                break
        return solution

    def _set_space(self, space: Mapping[str, Any]) -> None:
        z = self._z
        self._dims = _dims(z.ValueType, space)
        dimension = z.zoopt.Dimension2([dim.zoopt for dim in self._dims])
        self._precisions = list(z.gl.float_precisions)  # what Dimension2 just set
        init_samples = [z.zoopt.Solution(x=self._encoded(i, p)) for i, p in enumerate(self._points)] or None
        parameter = z.zoopt.Parameter(budget=self._budget, init_samples=init_samples, **self._kwargs)
        if len(self._points) > parameter.get_train_size():
            raise ValueError(
                f"ZOOptSearch(points_to_evaluate=...): {len(self._points)} points, and ZOOpt runs at most "
                f"{parameter.get_train_size()} (its first phase, for budget={self._budget}); give at most that many"
            )
        self._opt = z.SRacosTune(dimension=dimension, parameter=parameter, parallel_num=self._parallel_num)

    def _encoded(self, index: int, point: Mapping[str, Any]) -> list[Any]:
        flat = {"/".join(path): value for path, value in config_leaves(dict(point))}
        names = [dim.name for dim in self._dims]
        if set(flat) != set(names):
            raise ValueError(
                f"ZOOptSearch(points_to_evaluate=...): point {index} gives {sorted(flat)}; give exactly the space's "
                f"parameters {sorted(names)} ('a/b' for a nested key)"
            )
        x = []
        for dim in self._dims:
            try:
                x.append(dim.encoded(flat[dim.name]))
            except ValueError as exc:
                raise ValueError(
                    f"ZOOptSearch(points_to_evaluate=...): point {index}'s {dim.name}: {exc}; give a value of the "
                    "space"
                ) from None
        return x


_STATE = (
    "_opt",
    "_dims",
    "_precisions",
    "_live",
    "_points_left",
    "_held",
    "_given",
    "_budget",
    "_metric",
    "_mode",
)


def _dims(value_type: Any, space: Mapping[str, Any]) -> list[_Dim]:
    """A space's searched parameters, by ``a/b`` name: ``dim_dict`` tuples as given, ``tune.*`` domains
    converted; constants are left to the experiment (the sweep merges them under each suggestion)."""
    dims: list[_Dim] = []
    for path, value in config_leaves(dict(space)):
        label = "/".join(path)
        if is_grid(value):
            raise ValueError(
                f"{label}: tune.grid_search is not searched by ZOOptSearch (as Ray's); use tune.choice"
            )
        if isinstance(value, tuple):
            dims.append(_of_tuple(value_type, label, value))
        elif isinstance(value, RANDOM_DOMAINS):
            dims.append(_converted(value_type, label, value))
    if not dims:
        raise ValueError(
            "ZOOptSearch: the space has nothing to search (no tune.* domains or dim_dict tuples)"
        )
    return dims


def _converted(value_type: Any, label: str, value: Any) -> _Dim:
    """A ``tune.*`` domain as ZOOpt's dimension (Ray's conversion)."""
    if isinstance(value, Uniform):
        return _Dim(label, (value_type.CONTINUOUS, [value.low, value.high], 1e-12), "float")
    if isinstance(value, QUniform):
        return _Dim(label, (value_type.CONTINUOUS, [value.low, value.high], value.q), "float", q=value.q)
    if isinstance(value, RandInt):  # tune.randint's upper bound is exclusive
        return _Dim(label, (value_type.DISCRETE, [value.low, value.high - 1], True), "int")
    if isinstance(value, QRandInt):  # its multiples of q in [low, high], as k * q
        return _Dim(
            label,
            (value_type.DISCRETE, [-(-value.low // value.q), value.high // value.q], True),
            "int",
            q=value.q,
        )
    if isinstance(value, Choice):  # ZOOpt's grid holds the indices: it would turn the values into NumPy's
        return _Dim(
            label, (value_type.GRID, list(range(len(value.values)))), "choice", values=tuple(value.values)
        )
    raise ValueError(
        f"{label}: {type(value).__name__} is not searched by ZOOptSearch (Ray's converts uniform, quniform, randint "
        "and choice); use one of those (tune.uniform over the exponent for a log scale), or a dim_dict tuple"
    )


def _of_tuple(value_type: Any, label: str, value: tuple[Any, ...]) -> _Dim:
    """A ``dim_dict`` tuple of ZOOpt's, checked for its shape (ZOOpt checks none)."""
    kind = value[0] if value else None
    shapes = {
        value_type.CONTINUOUS: len(value) == 3 and _bounds(value[1]) and isinstance(value[2], int | float),
        value_type.DISCRETE: len(value) == 3 and _bounds(value[1]) and isinstance(value[2], bool),
        value_type.GRID: len(value) == 2 and isinstance(value[1], list | tuple) and len(value[1]) > 0,
    }
    if not isinstance(kind, int) or isinstance(kind, bool) or not shapes.get(kind, False):
        raise ValueError(
            f"dim_dict[{label!r}] = {value!r}: give (ValueType.CONTINUOUS, [low, high], precision), "
            "(ValueType.DISCRETE, [low, high], ordered) or (ValueType.GRID, [values]), or a tune.* domain"
        )
    return _Dim(label, (kind, list(value[1]), *value[2:]), "given")


def _bounds(region: Any) -> bool:
    return (
        isinstance(region, list | tuple)
        and len(region) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in region)
        and region[0] <= region[1]
    )
