"""The ``Searcher`` base class a team's own search algorithm subclasses (``sweepflow.tune.search.Searcher`` for a
Tune script; a pipeline config's ``sweep.sampler`` names one by import path), with Ray Tune's methods and their
meaning, so a searcher written for Ray runs with its import changed; and ``SearcherSampler``, which runs one as
the sweep's ``Sampler``.

The experiment asks ``suggest(trial_id)`` whenever a trial can start (a free slot), tells ``on_trial_result``
each report of a running trial and ``on_trial_complete`` its end, from the sweep's threads one call at a time
(``SearcherSampler``, below). ``suggest`` returns the trial's config (a dict; keys
``"a/b"`` or nested dicts set nested values, merged over the constants of ``config``/``param_space``), None for
"not now" (asked again once a running trial ends), or ``Searcher.FINISHED`` (the search is done: no more trials,
whatever ``num_samples`` says).
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Mapping
from typing import Any

from sweepflow.tasks.sweep.samplers import Sampler, SamplerExhausted, SamplerWaiting
from sweepflow.tasks.sweep.space import RANDOM_DOMAINS, config_leaves, is_grid, plain, set_leaf
from sweepflow.tasks.sweep.trial_scheduler import merge_search_properties


class Searcher:
    """Ray Tune's ``Searcher`` (``ray.tune.search.Searcher``): subclass it and define ``suggest`` and
    ``on_trial_complete``; the others are optional.

    ``metric``/``mode``: what the searcher optimises; the experiment's own ``metric``/``mode`` (``TuneConfig``,
    ``tune.run``) must agree with them or be left out, and are given to ``set_search_properties`` as in Ray.
    """

    FINISHED = "FINISHED"
    CKPT_FILE_TMPL = "searcher-state-{}.pkl"

    def __init__(self, metric: str | list[str] | None = None, mode: str | list[str] | None = None) -> None:
        if metric is not None and mode is not None:
            if isinstance(mode, str) != isinstance(metric, str):
                raise ValueError(f"{type(self).__name__}(metric={metric!r}, mode={mode!r}): give both as str or both as lists")
            modes = [mode] if isinstance(mode, str) else list(mode)
            if isinstance(mode, list) and len(mode) != len(metric):
                raise ValueError(f"{type(self).__name__}: metric and mode must be lists of the same length")
            if any(m not in ("min", "max", "obs") for m in modes) or (isinstance(mode, str) and mode == "obs"):
                raise ValueError(f"{type(self).__name__}(mode={mode!r}): mode must be 'min' or 'max'")
        self._metric = metric
        self._mode = mode

    @property
    def metric(self) -> Any:
        """The metric the searcher optimises (None: not set yet)."""
        return self._metric

    @property
    def mode(self) -> Any:
        """'min' or 'max' (None: not set yet)."""
        return self._mode

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any) -> bool:
        """The experiment's metric, mode and ``config``/``param_space``, given before the first ``suggest``.
        Return True if the searcher took them (e.g. searches ``config``'s ``tune.*`` domains), False if it keeps
        its own (the base class: False; then ``config`` may hold only constants)."""
        return False

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """A ``ConcurrencyLimiter``'s limit; True if the searcher handles it itself. The experiment never runs
        more than the limit at once either way."""
        return False

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """The config of trial ``trial_id``, None (no config now: asked again after a trial ends) or
        ``Searcher.FINISHED``."""
        raise NotImplementedError(f"{type(self).__name__}.suggest(trial_id): define it to return a trial's config")

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """A report of running trial ``trial_id`` (``training_iteration`` and the metrics it reported)."""

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """Trial ``trial_id`` ended: ``result`` is its last report (with ``config`` and ``trial_id``), None if it
        never reported; ``error``: it failed. A trial an early-stopping scheduler stopped is not an error."""
        raise NotImplementedError(
            f"{type(self).__name__}.on_trial_complete(trial_id, result=None, error=False): define it to learn from "
            "each ended trial"
        )

    def add_evaluated_point(
        self,
        parameters: dict[str, Any],
        value: float,
        error: bool = False,
        pruned: bool = False,
        intermediate_values: list[float] | None = None,
    ) -> None:
        """A point evaluated outside this experiment, for the searcher to learn from (optional, as in Ray)."""
        raise NotImplementedError(f"{type(self).__name__} does not take evaluated points")

    def get_state(self) -> dict[str, Any]:
        """The searcher's state as a picklable dict (for ``save``)."""
        raise NotImplementedError(f"{type(self).__name__}.get_state: define it (and set_state) to save the searcher")

    def set_state(self, state: dict[str, Any]) -> None:
        """Take back what ``get_state`` returned."""
        raise NotImplementedError(f"{type(self).__name__}.set_state: define it (and get_state) to restore the searcher")

    def save(self, checkpoint_path: str) -> None:
        """Write the searcher's state to ``checkpoint_path`` (the base class: ``get_state`` pickled)."""
        state = self.get_state()
        with open(checkpoint_path, "wb") as fh:
            pickle.dump(state, fh)

    def restore(self, checkpoint_path: str) -> None:
        """Read back what ``save`` wrote (the base class: ``set_state`` of the pickled state)."""
        with open(checkpoint_path, "rb") as fh:
            self.set_state(pickle.load(fh))  # noqa: S301 - a file this searcher's save wrote


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
            for path, value in config_leaves(suggested):
                parts = tuple(part for key in path for part in key.split("/"))  # "a/b" keys set nested values
                set_leaf(config, parts, plain(value))
                if "/".join(parts) not in self.seen:
                    self.seen.append("/".join(parts))
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


def searcher_ranking(
    search_alg: Searcher, metric: str | None, mode: str | None
) -> tuple[str | None, str | None]:
    """A ``Searcher``'s metric/mode and the experiment's: the same, or one side's; none at all is allowed (a
    searcher that learns nothing from results), as in Ray."""
    name = type(search_alg).__name__
    if isinstance(search_alg.metric, list | tuple):
        raise ValueError(
            f"{name}(metric={search_alg.metric!r}): a multi-objective Searcher is not built; search one metric, "
            "or use OptunaSearch(metric=[...], mode=[...])"
        )
    if search_alg.metric is None and metric is None:
        if mode is not None or search_alg.mode is not None:
            raise ValueError(f"{name}: a mode without a metric; give metric=... too")
        return None, None
    return merge_search_properties(name, (search_alg.metric, search_alg.mode), (metric, mode))


def searcher_sampler(
    search_alg: Searcher, param_space: Mapping[str, Any], *, configs: int, metric: str | None, mode: str | None
) -> SearcherSampler:
    """A ``Searcher`` given the experiment's properties (``set_search_properties``, as Ray does before the first
    ``suggest``), as the sweep's sampler of ``configs`` proposals; one that keeps its own space takes no
    domains in ``param_space`` (a Tune script's ``config``, or a pipeline's search space as domains)."""
    took = search_alg.set_search_properties(metric, mode, dict(param_space))
    searched_in_config = [
        "/".join(p) for p, v in config_leaves(dict(param_space)) if isinstance(v, RANDOM_DOMAINS) or is_grid(v)
    ]
    if not took and searched_in_config:
        raise ValueError(
            f"{type(search_alg).__name__} keeps its own search space (set_search_properties returned False), and "
            f"config/param_space searches {searched_in_config} too: only the searcher's space is searched. Move "
            "those parameters into the searcher's space, or leave only constants in config/param_space"
        )
    # A searcher that took the space suggests every searched value; the constants are merged under them.
    return SearcherSampler(search_alg, constants=constants_of(param_space), num_samples=configs, metric=metric)


def constants_of(param_space: Mapping[str, Any]) -> dict[str, Any]:
    """``param_space`` without its ``tune.*`` domains and grids (what a searcher's suggestion is merged over)."""
    config: dict[str, Any] = {}
    for path, value in config_leaves(dict(param_space)):
        if not (isinstance(value, RANDOM_DOMAINS) or is_grid(value)):
            set_leaf(config, path, plain(value))
    return config
