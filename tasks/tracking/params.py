"""What a run's params are: a nested config flattened to MLflow's flat, dotted names, and only what everyone who
can read the experiment may see. Pure (no MLflow import): the UI links name the params as the trial runs log them."""

from __future__ import annotations

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


def public_params(params: dict[str, Any]) -> dict[str, Any]:
    """Params everyone who can read the experiment may see: credentials in URIs (``user:token@``) removed, and
    storage options (keys, secrets, tokens) left out entirely."""
    return {
        key: redact(value) if isinstance(value, str) else value
        for key, value in params.items()
        if "storage_options" not in key
    }
