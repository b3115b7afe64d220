"""``sweepflow.tune.search.Searcher``: the base class a team's own search algorithm subclasses, with Ray Tune's
methods and their meaning (``suggest``, ``on_trial_result``, ``on_trial_complete``, ``set_search_properties``,
``save``/``restore``, ``FINISHED``), so a searcher written for Ray runs with its import changed. It is the sweep's
own (``sweepflow.tasks.sweep.searcher``), which a pipeline config's ``sweep.sampler`` can name too."""

from sweepflow.tasks.sweep.searcher import Searcher

__all__ = ["Searcher"]
