"""What the searchers wrapping a search library (``HyperOptSearch``, ``BayesOptSearch``, ``NevergradSearch``) share:
Ray's metric/mode checks, taking the experiment's space when none was given, refusing to suggest without a space or
a metric, and reading an ended trial's metric."""

from __future__ import annotations

import math
from typing import Any

from sweepflow.tune.search.searcher import Searcher


class LibrarySearcher(Searcher):
    """A ``Searcher`` over a library's own space: subclasses define ``_has_space`` and ``_set_space(config)``
    and call ``_check_ready()`` first in ``suggest``."""

    #: What ``_check_ready`` tells a user to give when the searcher has no space (e.g. "tune.* domains").
    space_hint = "tune.* domains"

    def __init__(self, metric: str | None, mode: str | None) -> None:
        name = type(self).__name__
        if mode not in (None, "min", "max"):
            raise ValueError(f"{name}(mode={mode!r}): mode must be 'min' or 'max'")
        if not isinstance(metric, str | None):
            raise ValueError(f"{name}(metric={metric!r}): one metric (a str); it searches one objective")
        super().__init__(metric=metric, mode=mode)

    def _has_space(self) -> bool:
        raise NotImplementedError

    def _set_space(self, space: Any) -> None:
        raise NotImplementedError

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any) -> bool:
        """The experiment's metric, mode and space (its ``config``/``param_space``), unless the searcher was given
        a space (then False, as in Ray)."""
        if self._has_space():
            return False
        if metric:
            self._metric = metric
        if mode:
            self._mode = mode
        self._set_space(config)
        return True

    def _check_ready(self) -> None:
        """Refuse to suggest without a space, a metric or a mode (each error says where to give it)."""
        name = type(self).__name__
        if not self._has_space():
            raise RuntimeError(
                f"{name} has no search space: give {name}(space=...) or {self.space_hint} in the experiment's "
                "config/param_space"
            )
        if not self._metric or not self._mode:
            raise RuntimeError(
                f"{name}(metric={self._metric!r}, mode={self._mode!r}): give metric=... and mode='min' or 'max' "
                "to it or to tune.run / TuneConfig"
            )

    def _reached(self, result: dict[str, Any] | None, error: bool) -> float | None:
        """An ended trial's value of the metric (its last report's), or None: it failed, or the value is missing
        or not a finite number."""
        value = None if error or not result else result.get(self._metric)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        return None
