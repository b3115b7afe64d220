"""``sweepflow.tune.search.Searcher``: the base class a team's own search algorithm subclasses, with Ray Tune's
methods and their meaning, so a searcher written for Ray runs with its import changed.

The experiment asks ``suggest(trial_id)`` whenever a trial can start (a free slot), tells ``on_trial_result``
each report of a running trial and ``on_trial_complete`` its end, from the sweep's threads one call at a time
(``sweepflow.tune._internal.searcher_sampler.SearcherSampler``). ``suggest`` returns the trial's config (a dict; keys
``"a/b"`` or nested dicts set nested values, merged over the constants of ``config``/``param_space``), None for
"not now" (asked again once a running trial ends), or ``Searcher.FINISHED`` (the search is done: no more trials,
whatever ``num_samples`` says).
"""

from __future__ import annotations

import pickle
from typing import Any


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
