"""The sweep's progress line: counts by status and the best value so far, logged when they change.

At most one line per ``min_interval_s`` (the sweep's: 1 s): a sweep of thousands of sub-second trials would
otherwise log two or three lines per trial, each one printed, sent to Prefect and stored there. A change inside
the interval is logged when the interval ends (a timer), so the last line always shows the counts as they are,
and the line that says every trial has ended is logged at once.

"running" counts the trials that hold a slot, so it never exceeds the sweep's concurrency: a trial gives its
slot back at its final report (the next trial starts while its group tears down) or when it pauses (HyperBand);
from then until it ends it is "idle".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweepflow.tasks.sweep.results import TrialStatus
from sweepflow.tasks.sweep.slots import HeldSlot


@dataclass
class SweepProgress:
    """Counts and best-so-far across trials; every change is logged as one line."""

    metric: str
    mode: str
    total: int
    log: Callable[[str], None]
    started_at: float = field(default_factory=time.monotonic)
    running: set[str] = field(default_factory=set)  # started, holding a slot
    idle: set[str] = field(default_factory=set)  # started, slot given back, not ended (tearing down, or paused)
    finished: dict[str, TrialStatus] = field(default_factory=dict)
    best: tuple[float, str] | None = None
    min_interval_s: float = 0.0  # between two lines; a change inside it is logged when it ends
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _logged_at: float | None = None  # time.monotonic() of the last line
    _timer: threading.Timer | None = None  # logs the latest counts at the end of the interval

    def _better(self, value: float) -> bool:
        return self.best is None or (value > self.best[0] if self.mode == "max" else value < self.best[0])

    def update(
        self, trial_id: str, *, metrics: dict[str, Any] | None = None, status: TrialStatus | None = None
    ) -> None:
        with self._lock:
            self.idle.discard(trial_id)
            if status is None:
                self.running.add(trial_id)
            else:
                self.running.discard(trial_id)
                self.finished[trial_id] = status
            value = (metrics or {}).get(self.metric)
            if isinstance(value, int | float) and self._better(float(value)):
                self.best = (float(value), trial_id)
            wait = self._wait_s()
            if wait > 0:
                if self._timer is None:
                    self._timer = threading.Timer(wait, self._log_latest)
                    self._timer.daemon = True
                    self._timer.start()
                return
            line = self._take_line()
        self.log(line)

    def _wait_s(self) -> float:
        """How long the next line must wait (0: log it now). The last trial's end is never held back."""
        if self._logged_at is None or len(self.finished) >= self.total:
            return 0.0
        return self._logged_at + self.min_interval_s - time.monotonic()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _take_line(self) -> str:
        self._cancel_timer()
        self._logged_at = time.monotonic()
        return self.line()

    def _log_latest(self) -> None:
        with self._lock:
            if self._timer is None:  # a line was logged meanwhile
                return
            line = self._take_line()
        self.log(line)

    def close(self) -> None:
        """The sweep ended: no line is logged after this."""
        with self._lock:
            self._cancel_timer()

    def holds_slot(self, trial_id: str, slot: HeldSlot) -> None:
        """``trial_id`` holds ``slot`` (granted before it starts, or again after a pause: then it is running
        again, logged): once it gives the slot back it is no longer counted as running."""
        slot.on_release = lambda: self._gave_slot_back(trial_id)
        with self._lock:
            resumed = trial_id in self.idle
        if resumed:
            self.update(trial_id)

    def _gave_slot_back(self, trial_id: str) -> None:
        with self._lock:  # not logged: the next line (the next trial's start, or this one's end) shows it
            if trial_id in self.running:
                self.running.discard(trial_id)
                self.idle.add(trial_id)

    def line(self) -> str:
        statuses = list(self.finished.values())
        pending = self.total - len(self.running) - len(self.idle) - len(self.finished)
        best = f"{self.metric}={self.best[0]:.4f} ({self.best[1]})" if self.best else "-"
        idle = f"{len(self.idle)} idle, " if self.idle else ""
        return (
            f"[{time.monotonic() - self.started_at:6.1f}s] trials: {len(self.running)} running, {idle}"
            f"{statuses.count(TrialStatus.STOPPED)} stopped early, {statuses.count(TrialStatus.COMPLETED)} completed, "
            f"{statuses.count(TrialStatus.FAILED)} failed, {pending} pending | best {best}"
        )
