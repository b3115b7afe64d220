"""The written form of a search-space domain (``space.py`` parses it): the keys each ``type`` takes, an example
of each for the error messages, the check that a dict spec has a known type and exactly its keys, and the
checks of its numeric arguments. None of them needs the domain classes, which stay in ``space.py``.

Pure Python + numpy, like ``space.py`` (no Prefect, MLflow, torch or Dask).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["EXAMPLES", "SPEC_KEYS", "float_arg", "int_arg", "spec_kind"]

#: The keys each domain ``type`` takes besides ``type``, in the order the messages list them.
SPEC_KEYS: dict[str, tuple[str, ...]] = {
    "constant": ("value",),
    "choice": ("values",),
    "grid": ("values",),
    "uniform": ("low", "high"),
    "loguniform": ("low", "high"),
    "randint": ("low", "high"),
    "qrandint": ("low", "high", "q"),
    "pow2": ("low", "high"),
    "quniform": ("low", "high", "q"),
    "randn": ("mean", "sd"),
}

#: One spec of each type, quoted in the messages as the fix.
EXAMPLES: dict[str, str] = {
    "constant": '{"type": "constant", "value": {...}}',
    "choice": '{"type": "choice", "values": [16, 32, 64]}',
    "grid": '{"type": "grid", "values": [0.1, 0.01]}',
    "uniform": '{"type": "uniform", "low": 0.0, "high": 0.5}',
    "loguniform": '{"type": "loguniform", "low": 1e-4, "high": 1e-1}',
    "randint": '{"type": "randint", "low": 1, "high": 10}',
    "qrandint": '{"type": "qrandint", "low": 8, "high": 64, "q": 8}',
    "pow2": '{"type": "pow2", "low": 4, "high": 256}',
    "quniform": '{"type": "quniform", "low": 0.0, "high": 0.5, "q": 0.05}',
    "randn": '{"type": "randn", "mean": 0.0, "sd": 1.0}',
}


def _is_number(value: Any) -> bool:
    # bool is an int subclass, but `low: true` is always a mistake in a search space.
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def float_arg(name: str, kind: str, key: str, value: Any) -> float:
    if not _is_number(value) or not math.isfinite(float(value)):
        raise ValueError(
            f"{name}: {kind} '{key}' must be a finite number, got {value!r}; e.g. {EXAMPLES[kind]}"
        )
    return float(value)


def int_arg(name: str, kind: str, key: str, value: Any) -> int:
    # Integral floats (e.g. 1e3 from JSON/YAML) are accepted; 2.5 for an integer bound is an error.
    if _is_number(value) and math.isfinite(float(value)) and float(value).is_integer():
        return int(value)
    raise ValueError(f"{name}: {kind} '{key}' must be an integer, got {value!r}; e.g. {EXAMPLES[kind]}")


def spec_kind(name: str, raw: Mapping[str, Any]) -> str:
    """The ``type`` of a dict spec, once it is known and the spec has exactly its keys."""
    if "type" not in raw:
        hint = ""
        if "grid_search" in raw:
            hint = ' (Ray\'s {"grid_search": [...]} is written {"type": "grid", "values": [...]} here)'
        raise ValueError(
            f"{name}: a dict value must be a domain spec with a 'type' key{hint}; got keys {sorted(raw)}. "
            f"Valid types: {', '.join(SPEC_KEYS)}. For a dict-valued constant use "
            f"{EXAMPLES['constant']}"
        )
    kind = raw["type"]
    if kind not in SPEC_KEYS:
        close = difflib.get_close_matches(str(kind), list(SPEC_KEYS), n=1)
        suggestion = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{name}: unknown type {kind!r}.{suggestion} Valid types: {', '.join(SPEC_KEYS)}")
    expected = SPEC_KEYS[kind]
    present = set(raw) - {"type"}
    missing = [k for k in expected if k not in present]
    extra = sorted(present - set(expected))
    if missing or extra:
        problems = []
        if missing:
            problems.append(f"missing {missing}")
        if extra:
            problems.append(f"unexpected {extra}")
        raise ValueError(
            f"{name}: {kind} takes exactly the keys {list(expected)} ({'; '.join(problems)}); "
            f"e.g. {EXAMPLES[kind]}"
        )
    return kind
