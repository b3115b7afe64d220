"""What a run's params are: a nested config flattened to MLflow's flat, dotted names, only what everyone who can
read the experiment may see, and which of them varied between a sweep's trials (``varying_params``: the MLflow
views' columns, the sweep report's table, axes and importances all ask it). Pure (no MLflow import): the UI links
name the params as the trial runs log them."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from sweepflow.tasks.datasets.uris import redact

# MLflow refuses a param name with any other character (INVALID_PARAMETER_VALUE, failing the whole batch) or
# longer than 250 characters; a config's keys are the user's own ("refs.CNN module (87 KB)").
_NOT_IN_A_NAME = re.compile(r"[^\w\-. :/]")
_MAX_NAME_LEN = 250


def param_name(key: Any) -> str:
    """One config key as MLflow accepts it in a param's name: other characters become ``_``."""
    return _NOT_IN_A_NAME.sub("_", str(key))


def flatten(prefix: str, value: Any) -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: MLflow params are flat. Keys as ``param_name`` makes them, at most 250
    characters; two keys that come out the same keep both values (the later one gets ``_2``, ``_3``, ...)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            name = f"{prefix}.{param_name(key)}" if prefix else param_name(key)
            for flat, leaf in flatten(name, sub).items():
                base = unique = flat[:_MAX_NAME_LEN]
                n = 1
                while unique in out:
                    n += 1
                    unique = f"{base[: _MAX_NAME_LEN - len(str(n)) - 1]}_{n}"
                out[unique] = leaf
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
