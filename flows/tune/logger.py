"""``sweepflow.tune.logger``: where Ray's ``ray.tune.logger`` is. ``LoggerCallback`` is Ray's base class for
experiment-level loggers (a ``Callback`` whose trial hooks call ``log_trial_start`` / ``log_trial_result`` /
``log_trial_end``). ``pretty_print(result)`` is Ray's YAML view of a result. Ray's file loggers
``CSVLoggerCallback``, ``JsonLoggerCallback`` and ``TBXLoggerCallback`` are here too (``sweepflow.tune.file_loggers``),
writing each trial's files alongside its MLflow run; Ray's legacy per-trial ``Logger`` classes are refused."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sweepflow.tune.file_loggers import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback
from sweepflow.tune.logger_callback import LoggerCallback
from sweepflow.tune.not_built import refusing


def pretty_print(result: Mapping[str, Any], exclude: list[str] | None = None) -> str:
    """A result as block YAML, for printing (Ray's ``pretty_print``): ``exclude``'s keys and ``config`` left
    out, empty values dropped, values YAML cannot write (arrays, objects) written as their ``str``."""
    import yaml

    def plain(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items() if not _empty(v)}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
            value = value.item()  # a NumPy or torch scalar
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
        return value

    skipped = {"config", *(exclude or [])}
    shown = plain({k: v for k, v in result.items() if k not in skipped})
    return yaml.safe_dump(shown, default_flow_style=False, sort_keys=True)


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, Mapping) and not value)


__all__ = [
    "CSVLoggerCallback",
    "JsonLoggerCallback",
    "LoggerCallback",
    "TBXLoggerCallback",
    "pretty_print",
]

__getattr__ = refusing(__name__)  # Ray's legacy per-trial loggers: refused with the reason and the fix
