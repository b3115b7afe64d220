"""``sweepflow.tune.search``: search algorithms (``sweepflow.tune.search.optuna.OptunaSearch``), and Ray's
``ConcurrencyLimiter`` / ``BasicVariantGenerator`` / ``Repeater`` (also importable from ``sweepflow.tune.search``)."""

from sweepflow.tune.not_built import refusing
from sweepflow.tune.search.concurrency import BasicVariantGenerator, ConcurrencyLimiter
from sweepflow.tune.search.repeater import Repeater

__all__ = ["BasicVariantGenerator", "ConcurrencyLimiter", "Repeater"]

__getattr__ = refusing(__name__)  # Ray names not built here: refused with the reason and the fix
