"""Ray's ``LoggerCallback`` (``ray.tune.logger.LoggerCallback``): the base class of experiment-level loggers, a
``Callback`` whose trial hooks call ``log_trial_start`` / ``log_trial_result`` / ``log_trial_end``. Imported from
``sweepflow.tune.logger``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sweepflow.tune.callback import Callback, never_called

if TYPE_CHECKING:
    from sweepflow.tune.analysis import Trial


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
