"""The sweep report's values as a person reads them, and its parallel-coordinates axes.

Formatting (``fmt``: floats to 4 significant digits, missing values as a dash), which hyperparameters the report
shows (``sampled_params``, ``fixed_params``, ``axis_params``) and ``ParamAxis``: how a parameter's values map
to a position on its axis (log axes for log-sampled parameters, categories in the order the search space lists
them) and its ticks. Pure: no drawing, so the scaling is testable on its own (sweep_report.py re-exports
``make_axis`` and ``axis_positions``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.ticker import MaxNLocator

from sweepflow.tasks.sweep.results import TrialResult
from sweepflow.tasks.tracking.params import varying_params

__all__ = [
    "CATEGORICAL_TYPES",
    "EMPTY_CELL",
    "INTEGER_TYPES",
    "LOG_TYPES",
    "NUMERIC_TYPES",
    "ParamAxis",
    "axis_params",
    "axis_positions",
    "better",
    "fixed_params",
    "fmt",
    "is_number",
    "make_axis",
    "sampled_params",
    "sort_key_words",
]

LOG_TYPES = frozenset({"loguniform", "pow2"})  # sampled uniformly over the exponent: shown on log axes
CATEGORICAL_TYPES = frozenset({"choice", "grid"})
NUMERIC_TYPES = frozenset({"uniform", "quniform", "randn", "loguniform", "randint", "qrandint", "pow2"})
INTEGER_TYPES = frozenset({"randint", "qrandint", "pow2"})
EMPTY_CELL = "—"

# --------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------


def is_number(value: Any) -> bool:
    """A real, finite number (bools are not: ``True`` is no hyperparameter value to place on an axis)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        return False
    return math.isfinite(float(value))


def fmt(value: Any) -> str:
    """A value as a person reads it: floats to 4 significant digits, missing values as a dash."""
    if value is None:
        return EMPTY_CELL
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        if math.isnan(value):
            return EMPTY_CELL
        return f"{float(value):.4g}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return str(value)


def better(mode: str) -> str:
    return "higher" if mode == "max" else "lower"


def sort_key_words(metric: str, mode: str) -> str:
    return f"best {metric} ({better(mode)} is better)"


# --------------------------------------------------------------------------------------------------
# Parallel-coordinates axes (pure: no drawing, so the scaling is testable on its own)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamAxis:
    """One vertical axis of the parallel-coordinates plot: how its values map to [0, 1], and its ticks.

    ``scale`` is "linear", "log" (``low``/``high`` are then log10 of the range, so equal ratios are equal
    distances) or "categorical" (``categories``: the value labels, bottom to top).
    """

    name: str
    scale: str
    low: float = 0.0
    high: float = 1.0
    categories: tuple[str, ...] = ()
    base: int = 10  # log axes: tick at powers of this (2 for pow2 parameters)
    integer: bool = False

    def position(self, value: Any) -> float:
        """Where ``value`` sits on the axis, in [0, 1]; NaN when it cannot be placed (missing, wrong type)."""
        if self.scale == "categorical":
            label = fmt(value)
            if label not in self.categories:
                return math.nan
            if len(self.categories) == 1:
                return 0.5
            return self.categories.index(label) / (len(self.categories) - 1)
        if not is_number(value):
            return math.nan
        x = float(value)
        if self.scale == "log":
            if x <= 0:
                return math.nan
            x = math.log10(x)
        if self.high <= self.low:  # one distinct value: the middle, rather than a division by zero
            return 0.5
        return (x - self.low) / (self.high - self.low)

    def ticks(self) -> list[tuple[float, str]]:
        """(position, label) pairs: real values of the parameter, never the normalised positions."""
        if self.scale == "categorical":
            step = max(1, math.ceil(len(self.categories) / 12))  # at most ~12 labels on an axis stay readable
            return [(self.position(c), c) for c in self.categories[::step]]
        if self.high <= self.low:
            value = 10**self.low if self.scale == "log" else self.low
            return [(0.5, fmt(value))]
        values = self._log_tick_values() if self.scale == "log" else self._linear_tick_values()
        return [(self.position(v), fmt(v)) for v in values]

    def _linear_tick_values(self) -> list[float]:
        locator = MaxNLocator(nbins=5, integer=self.integer)
        eps = (self.high - self.low) * 1e-9
        return [
            float(v)
            for v in locator.tick_values(self.low, self.high)
            if self.low - eps <= v <= self.high + eps
        ]

    def _log_tick_values(self) -> list[float]:
        lo, hi = 10**self.low, 10**self.high
        if self.base == 2:
            exps = range(math.ceil(math.log2(lo) - 1e-9), math.floor(math.log2(hi) + 1e-9) + 1)
            values = [2.0**e for e in exps]
            step = max(1, math.ceil(len(values) / 8))
            return values[::step]
        decades = range(math.ceil(self.low - 1e-9), math.floor(self.high + 1e-9) + 1)
        values = [10.0**e for e in decades]
        if len(values) < 3:  # less than two decades: 1-2-5 steps, or the ticks would be one or two
            values = [
                m * 10.0**e
                for e in range(math.floor(self.low) - 1, math.ceil(self.high) + 1)
                for m in (1, 2, 5)
                if lo * (1 - 1e-9) <= m * 10.0**e <= hi * (1 + 1e-9)
            ]
        if len(values) < 2:
            values = [lo, hi]
        step = max(1, math.ceil(len(values) / 8))
        return values[::step]


def make_axis(name: str, domain: Any, observed: Sequence[Any]) -> ParamAxis:
    """The axis of parameter ``name`` sampled from ``domain`` (the search-space entry), given the values trials
    actually got. Numeric ranges cover both the domain's bounds and the observed values, so every trial fits
    and the plot shows where in the searched range the trials landed."""
    kind = domain.get("type") if isinstance(domain, Mapping) else None
    numbers = [float(v) for v in observed if is_number(v)]
    non_numbers = [v for v in observed if v is not None and not is_number(v)]

    # Values that are no numbers (lists, strings) can only be categories, whatever the domain says.
    if kind in CATEGORICAL_TYPES or non_numbers or (kind not in NUMERIC_TYPES and not numbers):
        declared = list(domain.get("values", [])) if kind in CATEGORICAL_TYPES else []
        labels: list[str] = []
        for value in [*declared, *observed]:  # the domain's order first: it is the order the user wrote
            label = fmt(value)
            if value is not None and label not in labels:
                labels.append(label)
        return ParamAxis(name=name, scale="categorical", categories=tuple(labels))

    bounds = [
        float(domain[k]) for k in ("low", "high") if isinstance(domain, Mapping) and is_number(domain.get(k))
    ]
    log = kind in LOG_TYPES
    values = [v for v in [*bounds, *numbers] if v > 0] if log else [*bounds, *numbers]
    if log and not values:  # nothing positive to take a log of: fall back rather than fail the report
        log, values = False, [*bounds, *numbers]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if log:
        lo, hi = math.log10(lo), math.log10(hi)
    return ParamAxis(
        name=name,
        scale="log" if log else "linear",
        low=lo,
        high=hi,
        base=2 if kind == "pow2" else 10,
        integer=kind in INTEGER_TYPES,
    )


def axis_positions(values: Sequence[Any], domain: Any) -> list[float]:
    """Each value's position in [0, 1] on a parallel-coordinates axis for ``domain`` (a search-space entry).

    ``axis_positions([1e-4, 1e-3, 1e-2], {"type": "loguniform", "low": 1e-4, "high": 1e-1})`` is
    ``[0, 1/3, 2/3]``: log-sampled parameters are spaced by ratio.
    """
    axis = make_axis("", domain, values)
    return [axis.position(v) for v in values]


def sampled_params(search_space: Mapping[str, Any], trials: Sequence[TrialResult]) -> list[str]:
    """The search space's sampled (non-fixed) keys that trials' configs carry, in the search space's order."""
    in_configs = {k for t in trials for k in t.config}
    return [
        name
        for name, domain in search_space.items()
        if isinstance(domain, Mapping) and domain.get("type") not in (None, "constant") and name in in_configs
    ]


def fixed_params(search_space: Mapping[str, Any], sampled: Sequence[str]) -> dict[str, Any]:
    fixed = {}
    for name, domain in search_space.items():
        if name in sampled:
            continue
        if isinstance(domain, Mapping) and domain.get("type") == "constant":
            fixed[name] = domain.get("value")
        elif not isinstance(domain, Mapping) or "type" not in domain:
            fixed[name] = domain
    return fixed


def axis_params(search_space: Mapping[str, Any], trials: Sequence[TrialResult]) -> list[str]:
    """The parallel-coordinates axes: the search space's sampled parameters (in its order), then any other
    top-level config value that varied between trials (``tracking.params.varying_params``: a space given as
    code, a value a callback set), so no hyperparameter that varied is left out. A nested value has no place on
    an axis."""
    sampled = sampled_params(search_space, trials)
    nested = {name for t in trials for name, value in t.config.items() if isinstance(value, Mapping)}
    others = [
        name
        for name in varying_params([t.config for t in trials], nested=False)
        if name not in sampled and name not in search_space and name not in nested
    ]
    return [*sampled, *others]
