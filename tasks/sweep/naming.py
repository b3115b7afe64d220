"""A trial's short readable name from its sampled values (``l1=64,l2=16,lr=3.2e-03``): Prefect task-run and MLflow
run names, where a human scans a list of trials; and the title and line of its Prefect artifact card."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from sweepflow.tasks.sweep.results import TrialResult


def _format_float(value: float, precision: int) -> str:
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    if abs(value) < 1e-2 or abs(value) >= 1e5:
        return f"{value:.{precision - 1}e}"
    # Round to `precision` significant digits but print positionally (120, not 1.2e+02).
    text = repr(float(f"{value:.{precision}g}"))
    return text[:-2] if text.endswith(".0") else text


def _format_value(value: Any, precision: int) -> str:
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, float | np.floating):
        return _format_float(float(value), precision)
    if isinstance(value, list | tuple):
        return "x".join(_format_value(v, precision) for v in value)
    return str(value)


def describe_trial(
    config: Mapping[str, Any], keys: Iterable[str] | None = None, *, precision: int = 2
) -> str:
    """A short readable name for a trial, e.g. ``"l1=64,l2=16,lr=3.2e-03,batch_size=8"``.

    Meant for Prefect task-run names and MLflow run names, where a human scans a list of trials:
    small or large floats get ``precision`` significant digits in e-notation, others are printed
    positionally; lists print as ``64x32``. Pass ``keys`` (e.g. ``space.varying_names``) to leave
    out constants. Names are not guaranteed unique (rounding), so prefix a trial index if needed.
    """
    selected = list(config) if keys is None else list(keys)
    missing = [k for k in selected if k not in config]
    if missing:
        raise ValueError(f"describe_trial: keys {missing} are not in the config (its keys: {list(config)})")
    return ",".join(f"{k}={_format_value(config[k], precision)}" for k in selected)


def trial_card(trial_id: str, name: str, result: TrialResult, metric: str | None) -> tuple[str, str]:
    """The key and description of a trial's Prefect artifact. Prefect titles an artifact's card with its key
    and shows one line of its description, so the key names the trial ("trial-0003") and the first line is the
    result (best value first, then how it ended); the hyperparameters follow for the artifact's own page. A key
    is a collection on Prefect's Artifacts page: the same key in every sweep makes trial 3 of each sweep a
    version of one collection, so the page lists as many as the largest sweep has trials, not one per trial
    ever run."""
    result_line = (
        f"**{metric} {result.best:.4g}** (epoch {result.best_epoch}) · {result.outcome()}"
        if metric and result.best is not None
        else result.outcome()
    )
    # Prefect's keys: lowercase letters, digits and dashes only.
    return re.sub(r"[^a-z0-9-]", "-", trial_id.lower()), f"{result_line}\n\n{name}"
