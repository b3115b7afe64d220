"""``sweepflow.tune.search``: search algorithms (``sweepflow.tune.search.optuna.OptunaSearch``), and Ray's
``ConcurrencyLimiter`` / ``BasicVariantGenerator`` (also importable from ``sweepflow.tune.search``)."""

from sweepflow.tune.not_built import refusing
from sweepflow.tune.search.concurrency import BasicVariantGenerator, ConcurrencyLimiter

__all__ = ["BasicVariantGenerator", "ConcurrencyLimiter"]

__getattr__ = refusing(__name__)  # Ray names not built here: refused with the reason and the fix
