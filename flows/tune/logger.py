"""``sweepflow.tune.logger``: where Ray's ``ray.tune.logger`` is. ``LoggerCallback`` is Ray's base class for
experiment-level loggers (a ``Callback`` whose trial hooks call ``log_trial_start`` / ``log_trial_result`` /
``log_trial_end``). ``pretty_print(result)`` is Ray's YAML view of a result. Ray's file loggers (CSV, JSON,
TensorBoard) are not needed: every trial is an MLflow run already; each is refused with where the data is."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sweepflow.tune.callback import Callback, never_called
from sweepflow.tune.not_built import refusing

if TYPE_CHECKING:
    from sweepflow.tune.analysis import Trial


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


class LoggerCallback(Callback):
    """Ray's ``LoggerCallback``: override ``log_trial_start``, ``log_trial_result`` and ``log_trial_end``. Called
    in the script's process, one call at a time (see ``sweepflow.tune.callback``)."""

    def log_trial_start(self, trial: Trial) -> None:
        """A trial started."""

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        """A trial reported ``result``."""

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        """A trial ended; ``failed``: it failed (``trial.error_msg`` says why)."""

    @never_called
    def log_trial_save(self, trial: Trial) -> None:
        """Not called here (see ``sweepflow.tune.callback.NEVER_CALLED``)."""

    @never_called
    def log_trial_restore(self, trial: Trial) -> None:
        """Not called here (see ``sweepflow.tune.callback.NEVER_CALLED``)."""

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Calls ``log_trial_start(trial)``."""
        self.log_trial_start(trial)

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        """Calls ``log_trial_result(iteration, trial, result)``."""
        self.log_trial_result(iteration, trial, result)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Calls ``log_trial_end(trial, failed=False)``."""
        self.log_trial_end(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Calls ``log_trial_end(trial, failed=True)``."""
        self.log_trial_end(trial, failed=True)


__getattr__ = refusing(__name__)
