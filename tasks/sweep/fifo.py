"""The FIFO scheduler: every trial runs to completion (the default when no scheduler is configured)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sweepflow.tasks.sweep.trial_scheduler import CONTINUE, Decision, TrialScheduler


class FIFOScheduler(TrialScheduler):
    """Runs every trial to completion: the baseline, and the default when no scheduler is configured."""

    def __init__(self) -> None:
        super().__init__()
        self._live: set[str] = set()

    def on_trial_add(self, trial_id: str) -> None:
        """Count the trial as live."""
        with self._lock:
            self._live.add(trial_id)

    def on_trial_result(self, trial_id: str, result: Mapping[str, Any]) -> Decision:
        """Always ``CONTINUE``: FIFO never stops a trial."""
        return CONTINUE

    def on_trial_complete(self, trial_id: str, result: Mapping[str, Any] | None) -> None:
        """The trial is no longer live."""
        with self._lock:
            self._live.discard(trial_id)

    def on_trial_error(self, trial_id: str) -> None:
        """The trial is no longer live."""
        with self._lock:
            self._live.discard(trial_id)

    def debug_string(self) -> str:
        """``"FIFOScheduler: <n> live trials"``."""
        with self._lock:
            return f"FIFOScheduler: {len(self._live)} live trials"

    def __repr__(self) -> str:
        return "FIFOScheduler()"
