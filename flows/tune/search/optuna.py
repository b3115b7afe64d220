"""``sweepflow.tune.search.optuna.OptunaSearch``: Optuna's TPE proposes each trial's config from the results so
far (Ray Tune's ``OptunaSearch``), on the sweep's ``TPESampler``."""

from __future__ import annotations

from typing import Any


class OptunaSearch:
    def __init__(
        self,
        space: dict[str, Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        seed: int | None = None,
        n_startup_trials: int = 4,
    ) -> None:
        if mode not in (None, "min", "max"):
            raise ValueError(f"OptunaSearch(mode={mode!r}): mode must be 'min' or 'max'")
        if isinstance(n_startup_trials, bool) or not isinstance(n_startup_trials, int) or n_startup_trials < 0:
            raise ValueError(
                f"OptunaSearch(n_startup_trials={n_startup_trials!r}): give how many trials are sampled at random "
                "before TPE models the results, an int >= 0"
            )
        self.space = space
        self.metric = metric
        self.mode = mode
        self.seed = seed
        self.n_startup_trials = n_startup_trials

    def __repr__(self) -> str:
        return (
            f"OptunaSearch(metric={self.metric!r}, mode={self.mode!r}, seed={self.seed}, "
            f"n_startup_trials={self.n_startup_trials})"
        )
