"""What a run's params are: a nested config flattened to MLflow's flat, dotted names, only what everyone who can
read the experiment may see, and which of them varied between a sweep's trials (``varying_params``: the MLflow
views' columns, the sweep report's table, axes and importances all ask it). Pure (no MLflow import): the UI links
name the params as the trial runs log them."""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from sweepflow.tasks.datasets.uris import redact


def flatten(prefix: str, value: Any) -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: MLflow params are flat."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), sub))
        return out
    return {prefix: value}


def _same_value(value: Any) -> Hashable:
    """What two configs' values are compared by: numbers by value (1 and 1.0, a numpy float and a float are the
    same; NaN equals NaN), anything else by its repr."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        return ("number", "nan" if math.isnan(number) else number)
    return ("repr", repr(value))


def varying_params(configs: Sequence[Mapping[str, Any]], *, nested: bool = True) -> list[str]:
    """The names whose values differ between these trial configs, in the order they first appear: the
    hyperparameters that varied. A name some configs lack varies too (PBT adds mutated names; conditional
    spaces). ``nested``: a nested config's leaves by their MLflow names, dotted as trial runs log them
    (``flatten``); False: the top-level names, a nested value compared whole (the leaderboard's ``config/``
    columns)."""
    flat = [flatten("", dict(c)) if nested else dict(c) for c in configs]
    seen: dict[str, set[Hashable]] = {}
    for config in flat:
        for name, value in config.items():
            seen.setdefault(name, set()).add(_same_value(value))
    return [name for name, values in seen.items() if len(values) > 1 or any(name not in c for c in flat)]


def public_params(params: dict[str, Any]) -> dict[str, Any]:
    """Params everyone who can read the experiment may see: credentials in URIs (``user:token@``) removed, and
    storage options (keys, secrets, tokens) left out entirely."""
    return {
        key: redact(value) if isinstance(value, str) else value
        for key, value in params.items()
        if "storage_options" not in key
    }
