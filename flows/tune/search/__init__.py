"""``sweepflow.tune.search``: search algorithms (``sweepflow.tune.search.optuna.OptunaSearch``), and Ray's
``ConcurrencyLimiter`` / ``BasicVariantGenerator`` (also importable from ``sweepflow.tune.search``)."""

from sweepflow.tune.search.concurrency import BasicVariantGenerator, ConcurrencyLimiter

__all__ = ["BasicVariantGenerator", "ConcurrencyLimiter"]
