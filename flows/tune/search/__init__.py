"""``sweepflow.tune.search``: search algorithms (``sweepflow.tune.search.optuna.OptunaSearch``,
``sweepflow.tune.search.hyperopt.HyperOptSearch``), the ``Searcher`` base class a team's own searcher subclasses,
and Ray's ``ConcurrencyLimiter`` / ``BasicVariantGenerator`` / ``Repeater`` (also importable from
``sweepflow.tune.search``)."""

from typing import Any

from sweepflow.tune.not_built import refusing
from sweepflow.tune.search.concurrency import BasicVariantGenerator, ConcurrencyLimiter
from sweepflow.tune.search.repeater import Repeater
from sweepflow.tune.search.searcher import Searcher
from sweepflow.tune.search_space import grid_search

__all__ = ["BasicVariantGenerator", "ConcurrencyLimiter", "Repeater", "Searcher", "create_searcher", "grid_search"]

#: Ray's names for ``create_searcher`` -> (module, class); a class that is not built is refused there.
SEARCHER_NAMES = {
    "variant_generator": (__name__, "BasicVariantGenerator"),
    "random": (__name__, "BasicVariantGenerator"),
    "ax": (f"{__name__}.ax", "AxSearch"),
    "hyperopt": (f"{__name__}.hyperopt", "HyperOptSearch"),
    "bayesopt": (f"{__name__}.bayesopt", "BayesOptSearch"),
    "bohb": (f"{__name__}.bohb", "TuneBOHB"),
    "nevergrad": (f"{__name__}.nevergrad", "NevergradSearch"),
    "optuna": (f"{__name__}.optuna", "OptunaSearch"),
    "zoopt": (f"{__name__}.zoopt", "ZOOptSearch"),
    "hebo": (f"{__name__}.hebo", "HEBOSearch"),
}


def create_searcher(search_alg: str, **kwargs: Any) -> Any:
    """The search algorithm Ray's name stands for (``tune.create_searcher("optuna", metric=..., mode=...)``).

    Differs from Ray: a keyword the searcher does not take is refused by name (Ray drops it silently).

    Raises:
        ValueError: an unknown name (the known ones listed), or keywords the searcher does not take.
        NotBuiltError: a search library that is not wrapped here.
    """
    from sweepflow.tune.by_name import create_by_ray_name

    return create_by_ray_name("searcher", search_alg, SEARCHER_NAMES, kwargs)

_refuse = refusing(__name__)  # Ray names not built here: refused with the reason and the fix


def __getattr__(name: str) -> Any:
    """``sweepflow.tune.search.HyperOptSearch`` (and ``BayesOptSearch``, ``NevergradSearch``, ``TuneBOHB``,
    ``ZOOptSearch``, ``AxSearch``): Ray's lazy names
    for the searchers in their own modules (imported only when asked for: each needs its extra); Ray names not
    built are refused."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    return _refuse(name)


#: Ray's lazy names for the searchers in their own modules (each needs its extra, imported only when asked for).
_LAZY = {
    "HyperOptSearch": "hyperopt", "BayesOptSearch": "bayesopt", "NevergradSearch": "nevergrad", "TuneBOHB": "bohb",
    "ZOOptSearch": "zoopt", "AxSearch": "ax",
}
