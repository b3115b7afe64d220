"""A ``Searcher`` (Ray's API: a team's own searcher, or a wrapped library's such as ``HyperOptSearch``) as the
sweep's ``Sampler``: ask is ``suggest``, a report is ``on_trial_result``, an ended trial ``on_trial_complete``."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from sweepflow.tasks.sweep.samplers import Sampler, SamplerExhausted, SamplerWaiting
from sweepflow.tasks.sweep.space import plain, set_leaf
from sweepflow.tune.search.searcher import Searcher
from sweepflow.tune.search_space import flat_point


class SearcherSampler(Sampler):
    """A ``Searcher`` (Ray's API: a team's own, or a wrapped library's) as the sweep's sampler: ``ask`` is its
    ``suggest``, each report its ``on_trial_result``, an ended trial its ``on_trial_complete``. Calls come from the
    sweep's loop and its trials' threads: one at a time (a lock), so a searcher needs no locking of its own.

    The searcher's trial id for proposal ``n`` is ``trial_<n>`` (the sweep's trial of that turn, unless repeats
    number them otherwise). A suggestion (``"a/b"`` keys or nested dicts) is merged over ``constants``. A resumed
    experiment asks the searcher again for each trial that already ran, keeps the config that trial ran with, and
    tells the searcher its result: a seeded searcher proposes the same configs again."""

    def __init__(
        self, searcher: Searcher, *, constants: Mapping[str, Any], num_samples: int, metric: str | None
    ) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")
        self.searcher, self.total, self.metric = searcher, num_samples, metric
        self._constants = plain(dict(constants))
        self._lock = threading.Lock()
        self._asked = 0
        self._ids: dict[int, str] = {}  # proposal number -> the searcher's trial id
        self._configs: dict[int, dict[str, Any]] = {}  # proposal number -> the config it runs with
        self._of_trial: dict[str, int] = {}  # the sweep's trial id -> proposal number
        self.seen: list[str] = []  # config paths the searcher set (the trials table's columns)

    def ask(self) -> tuple[int, dict[str, Any]]:
        """The next trial's (number, config).

        Raises:
            SamplerExhausted: ``num_samples`` trials were proposed, or the searcher returned ``FINISHED`` (then
                ``total`` is the trials proposed).
            SamplerWaiting: the searcher returned None.
            TypeError: it returned something else than a dict with str keys, None or ``FINISHED``.
        """
        return self._suggest(None)

    def ask_known(self, config: dict[str, Any]) -> int:
        """A resumed experiment's trial that ran with ``config``: the searcher is asked (to keep its sequence)
        and the trial keeps ``config``."""
        return self._suggest(config)[0]

    def _suggest(self, known: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        if self._asked >= self.total:
            raise SamplerExhausted(f"all {self.total} trials were proposed")
        number = self._asked
        trial_id = f"trial_{number:04d}"
        with self._lock:
            suggested = self.searcher.suggest(trial_id)
        name = f"{type(self.searcher).__name__}.suggest({trial_id!r})"
        if known is not None:
            config = plain(known)
        elif suggested == Searcher.FINISHED:
            self.total = number
            raise SamplerExhausted(f"{name} returned FINISHED after {number} trials")
        elif suggested is None:
            raise SamplerWaiting(f"{name} returned None")
        elif not isinstance(suggested, Mapping) or any(not isinstance(k, str) for k in suggested):
            raise TypeError(
                f"{name} returned {suggested!r}: return the trial's config (a dict with str keys), None (no "
                "config now) or Searcher.FINISHED"
            )
        else:
            config = plain(self._constants)
            for key, value in flat_point(suggested).items():
                set_leaf(config, tuple(key.split("/")), plain(value))
                if key not in self.seen:
                    self.seen.append(key)
        self._asked += 1
        self._ids[number], self._configs[number] = trial_id, config
        return number, config

    def started(self, number: int, trial_id: str) -> None:
        with self._lock:
            self._of_trial[trial_id] = number

    def on_report(self, trial_id: str, metrics: dict[str, Any]) -> None:
        with self._lock:
            number = self._of_trial.get(trial_id)
            if number is not None and number in self._ids:
                own = self._ids[number]
                self.searcher.on_trial_result(own, {**metrics, "config": self._configs[number], "trial_id": own})

    def tell_result(self, number: int, result: Any) -> None:
        """An ended trial: its last report (error=False) if it trained, else error=True with no result (as Ray
        tells a failed trial)."""
        if result.status.selectable:
            self._complete(number, dict(result.last), error=False)
        else:
            self._complete(number, None, error=True)

    def tell(self, number: int, value: float | None) -> None:
        """A ``Repeater``'s mean over a config's repeats: told as a result holding the metric alone (Ray's)."""
        if value is None or self.metric is None:
            self._complete(number, None, error=value is None)
        else:
            self._complete(number, {self.metric: value}, error=False)

    def _complete(self, number: int, report: dict[str, Any] | None, *, error: bool) -> None:
        own = self._ids.pop(number)
        config = self._configs.pop(number)
        result = None if report is None else {**report, "config": config, "trial_id": own}
        with self._lock:
            self.searcher.on_trial_complete(own, result=result, error=error)
