"""``sweepflow.tune.logger``: where Ray's ``ray.tune.logger`` is. Every trial is an MLflow run already, so Ray's
logger callbacks are not needed: each name is refused with where the data is."""

from sweepflow.tune.not_built import refusing

__getattr__ = refusing(__name__)
