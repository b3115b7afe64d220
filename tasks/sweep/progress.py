"""The sweep's progress line: counts by status and the best value so far, logged at every change."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweepflow.tasks.sweep.results import TrialStatus


@dataclass
class SweepProgress:
    """Counts and best-so-far across trials; every change is logged as one line."""

    metric: str
    mode: str
    total: int
    log: Callable[[str], None]
    started_at: float = field(default_factory=time.monotonic)
    running: set[str] = field(default_factory=set)
    finished: dict[str, TrialStatus] = field(default_factory=dict)
    best: tuple[float, str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _better(self, value: float) -> bool:
        return self.best is None or (value > self.best[0] if self.mode == "max" else value < self.best[0])

    def update(
        self, trial_id: str, *, metrics: dict[str, Any] | None = None, status: TrialStatus | None = None
    ) -> None:
        with self._lock:
            if status is None:
                self.running.add(trial_id)
            else:
                self.running.discard(trial_id)
                self.finished[trial_id] = status
            value = (metrics or {}).get(self.metric)
            if isinstance(value, int | float) and self._better(float(value)):
                self.best = (float(value), trial_id)
            line = self.line()
        self.log(line)

    def line(self) -> str:
        statuses = list(self.finished.values())
        pending = self.total - len(self.running) - len(self.finished)
        best = f"{self.metric}={self.best[0]:.4f} ({self.best[1]})" if self.best else "-"
        return (
            f"[{time.monotonic() - self.started_at:6.1f}s] trials: {len(self.running)} running, "
            f"{statuses.count(TrialStatus.STOPPED)} stopped early, {statuses.count(TrialStatus.COMPLETED)} completed, "
            f"{statuses.count(TrialStatus.FAILED)} failed, {pending} pending | best {best}"
        )
