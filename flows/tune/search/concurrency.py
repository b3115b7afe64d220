"""``ConcurrencyLimiter`` and ``BasicVariantGenerator``: Ray Tune's search-algorithm wrappers, as settings of
the experiment (how many trials run at once; the variant generator's seed)."""

from __future__ import annotations

from typing import Any


class ConcurrencyLimiter:
    """At most ``max_concurrent`` trials of ``searcher`` run at once (the experiment's ``max_concurrent_trials``
    is lowered to it); each trial's config is asked for when it gets its slot, so the searcher learns from every
    trial ended by then."""

    def __init__(self, searcher: Any, max_concurrent: int, batch: bool = False) -> None:
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"ConcurrencyLimiter(max_concurrent=...): an integer >= 1, got {max_concurrent!r}")
        if batch:
            raise ValueError(
                "ConcurrencyLimiter(batch=True): not supported; the sweep asks the searcher for a trial whenever a "
                "slot frees (batch=False), so drop batch=True"
            )
        if isinstance(searcher, ConcurrencyLimiter):
            max_concurrent = min(max_concurrent, searcher.max_concurrent)
            searcher = searcher.searcher
        self.searcher, self.max_concurrent, self.batch = searcher, max_concurrent, batch
        # Ray's searchers carry metric/mode; a limiter shows its searcher's.
        self.metric = getattr(searcher, "metric", None)
        self.mode = getattr(searcher, "mode", None)


class BasicVariantGenerator:
    """Ray's default search: random draws from the space (grid entries crossed), which is also what an
    experiment without ``search_alg`` does. ``random_state`` seeds the draws; ``max_concurrent`` (0: no limit)
    caps the trials running at once."""

    def __init__(
        self,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        max_concurrent: int = 0,
        constant_grid_search: bool = False,
        random_state: int | None = None,
    ) -> None:
        if points_to_evaluate:
            raise ValueError(
                "BasicVariantGenerator(points_to_evaluate=...): not supported by the random search; pass the "
                "points to OptunaSearch(points_to_evaluate=...) or add them to the space as tune.grid_search([...])"
            )
        if constant_grid_search:
            raise ValueError(
                "BasicVariantGenerator(constant_grid_search=True): not supported; each grid point is crossed with "
                "fresh random draws, as by Ray's default"
            )
        if random_state is not None and (isinstance(random_state, bool) or not isinstance(random_state, int)):
            raise TypeError(f"BasicVariantGenerator(random_state=...): an integer seed, got {random_state!r}")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 0:
            raise ValueError(f"BasicVariantGenerator(max_concurrent=...): an integer >= 0, got {max_concurrent!r}")
        self.max_concurrent, self.random_state = max_concurrent, random_state
        self.metric = self.mode = None
