"""Waiting out a service that is away for a while: one retry bound read from the environment, and backoff.

Used for checkpoint storage here and for the MLflow tracking server by the pipeline; each caller decides which
errors are worth another attempt and what to say when the bound runs out.

    budget = seconds_setting(None, env="DDP_RUNTIME_STORAGE_RETRY_S", default=120.0, what="checkpoint storage")
    backoff = Backoff(budget)
    while True:
        try:
            return step()
        except ConnectionError:
            if backoff.failed() >= budget:
                raise
            backoff.sleep()
"""

from __future__ import annotations

import math
import os
import random
import time

_FIRST_S, _MAX_S = 0.5, 10.0


def seconds_setting(value: float | None, *, env: str, default: float, what: str) -> float:
    """``value``, else ``$env``, else ``default``: seconds >= 0 that ``what`` may stay unreachable."""
    if value is None:
        raw = os.environ.get(env, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(
                f"{env}={raw!r} is not a number: set it to the seconds {what} may stay unreachable before "
                f"a write fails (default {default:g})"
            ) from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"the retry bound for {what} must be seconds >= 0, got {value!r} ({env})")
    return float(value)


class Backoff:
    """Exponential backoff with jitter (so many writers do not come back at the same instant), within a budget
    that starts at the first failure."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.first_failure: float | None = None
        self.failures = 0
        self._delay = _FIRST_S

    def failed(self) -> float:
        """Record a failed attempt; the seconds since the first one."""
        now = time.monotonic()
        if self.first_failure is None:
            self.first_failure = now
        self.failures += 1
        return now - self.first_failure

    def sleep(self) -> None:
        """Wait before the next attempt (never past the budget)."""
        waited = time.monotonic() - (self.first_failure or time.monotonic())
        time.sleep(max(0.0, min(self._delay * random.uniform(0.8, 1.2), self.budget_s - waited)))
        self._delay = min(self._delay * 2, _MAX_S)
