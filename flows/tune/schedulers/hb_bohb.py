"""``sweepflow.tune.schedulers.hb_bohb.HyperBandForBOHB``: Ray Tune's HyperBand for BOHB (same module path,
arguments and meaning), the scheduler to use with ``sweepflow.tune.search.bohb.TuneBOHB``.

It is the synchronous ``HyperBandScheduler`` (``sweepflow.tasks.sweep.hyperband``) with Ray's change for BOHB:
each band's brackets are filled largest first (the bracket of the most trials and the earliest milestone;
max_t=9, eta=3: 9 trials from 1, then 5 from 3, then 3 straight to 9). As in Ray's, a trial that reaches its
milestone pauses even while its bracket is not full (our ``HyperBandScheduler`` does so too), so the searcher's
next configs join the bracket meanwhile; the bracket is decided once it is full and all its live trials are
there, or with the trials it has once no trial is left to start (Ray: once no trial is running).

Differs from Ray: the searcher is not told of pauses (Ray's ``searcher.on_pause``/``on_unpause``, which keep
Ray's concurrency limit from counting paused trials): here a paused trial gives its slot back, so the experiment's
limit counts running trials only. Ray adds ``hyperband_info["budget"]`` (the milestone) to the report the
searcher sees; here the searcher hears of each report before the scheduler, and ``TuneBOHB`` takes the budget
from the report's ``training_iteration``, which is the milestone when ``time_attr`` is ``training_iteration``.
"""

from __future__ import annotations

import math

from sweepflow.tasks.sweep.hyperband import HyperBandScheduler, _Bracket
from sweepflow.tasks.sweep.trial_scheduler import merge_search_properties

__all__ = ["HyperBandForBOHB"]


class HyperBandForBOHB(HyperBandScheduler):
    """Ray Tune's ``HyperBandForBOHB(time_attr, metric, mode, max_t, reduction_factor, stop_last_trials)``: the
    arguments and checks of ``HyperBandScheduler``; brackets filled largest first, as Ray's."""

    stop_reason = "HyperBandForBOHB"

    def set_search_properties(self, metric: str | None, mode: str | None) -> None:
        """Fill in the experiment's metric and mode where the scheduler was built without them.

        Raises:
            ValueError: they differ from the ones the scheduler was given, or neither has them.
        """
        self.metric, self.mode = merge_search_properties(
            "HyperBandForBOHB", (self.metric, self.mode), (metric, mode)
        )

    def _new_bracket(self) -> _Bracket:
        """The band's next bracket, largest first (Ray's BOHB change): ``s`` counts down from ``s_max_1 - 1``; a
        bracket whose first milestone would be below 1 is skipped, as in Ray."""
        band = self._bands[-1]
        while True:
            if len(band) == self.s_max_1:
                band = []
                self._bands.append(band)
            s = self.s_max_1 - len(band) - 1
            first = int(self.max_t * self.eta ** (-s))
            if first > 0:
                size = int(math.ceil(self.s_max_1 / (s + 1) * self.eta**s))
                bracket = _Bracket(size=size, milestone=first, halvings=s, max_t=self.max_t, eta=self.eta)
                band.append(bracket)
                return bracket
            band.append(None)  # type: ignore[arg-type]  # too small a milestone: skipped, as in Ray

    def debug_string(self) -> str:
        """The stopped count and every bracket's (size, milestone, trials in it)."""
        return f"HyperBandForBOHB: {self.num_stopped} stopped; brackets {self.brackets()}"

    def __repr__(self) -> str:
        return (
            f"HyperBandForBOHB(time_attr={self.time_attr!r}, metric={self.metric!r}, mode={self.mode!r}, "
            f"max_t={self.max_t}, reduction_factor={self.eta:g})"
        )
