"""``sweepflow.tune.schedulers.pb2``: Ray's module path for ``PB2`` (Population Based Bandits: PBT whose explore is
chosen by a GP bandit within ``hyperparam_bounds``; ``sweepflow.tasks.sweep.pb2``)."""

from sweepflow.tasks.sweep.pb2 import PB2
from sweepflow.tune.not_built import refusing

__all__ = ["PB2"]

__getattr__ = refusing(__name__)
