"""``Repeater``: Ray Tune's wrapper that runs each config its searcher proposes ``repeat`` times and tells the
searcher the mean of the repeats' results (the noise of one run averaged away)."""

from __future__ import annotations

from typing import Any

from sweepflow.tune.search.concurrency import BasicVariantGenerator, ConcurrencyLimiter
from sweepflow.tune.search.optuna import OptunaSearch
from sweepflow.tune.search.searcher import Searcher

#: The config key that holds a repeat's position in its group (0 .. repeat-1), as Ray names it.
TRIAL_INDEX = "__trial_index__"


class Repeater:
    """Each config ``searcher`` proposes runs as ``repeat`` trials (with ``config["__trial_index__"]`` = 0 ..
    repeat-1 when ``set_index``, e.g. to seed each repeat differently); once all of them ended, the searcher is
    told the mean of their results (a failed repeat is left out; all failed: the config failed).

    ``num_samples`` counts trials, repeats included, so it must be a multiple of ``repeat`` (``num_samples=15``
    with ``repeat=5``: 3 configs, 5 runs each). ``searcher``: ``OptunaSearch``, a ``Searcher`` (``HyperOptSearch``, one's
    own), or ``BasicVariantGenerator`` for the default random/grid search (each pass over the grid repeated), optionally in a ``ConcurrencyLimiter``."""

    def __init__(self, searcher: Any, repeat: int = 1, set_index: bool = True) -> None:
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise ValueError(f"Repeater(repeat={repeat!r}): how many times each config runs, an integer >= 1")
        if not isinstance(set_index, bool):
            raise TypeError(f"Repeater(set_index={set_index!r}): True or False")
        inner = searcher.searcher if isinstance(searcher, ConcurrencyLimiter) else searcher
        if isinstance(inner, Repeater):
            raise ValueError(
                f"Repeater(Repeater(..., repeat={inner.repeat}), repeat={repeat}): repeat once, with "
                f"Repeater(searcher, repeat={inner.repeat * repeat})"
            )
        if not isinstance(inner, OptunaSearch | BasicVariantGenerator | Searcher):
            raise TypeError(
                f"Repeater(searcher={searcher!r}): wrap a searcher of sweepflow.tune.search (OptunaSearch(...), "
                "HyperOptSearch(...), your own Searcher subclass, or BasicVariantGenerator() for the default "
                "random/grid search), optionally in a ConcurrencyLimiter"
            )
        self.searcher, self.repeat, self.set_index = searcher, repeat, set_index
        # Ray's searchers carry metric/mode; a Repeater shows its searcher's.
        self.metric = getattr(searcher, "metric", None)
        self.mode = getattr(searcher, "mode", None)

    def __repr__(self) -> str:
        return f"Repeater({self.searcher!r}, repeat={self.repeat}, set_index={self.set_index})"
