"""``sweepflow.air.integrations.comet``: Ray's module path for Comet, which is not built.

Importing the module works, so a Ray script's import lines stay as they were; using a name of it is refused with
the reason and what to use instead (``sweepflow.tune.not_built``)."""

from sweepflow.tune.not_built import refusing

__getattr__ = refusing(__name__)
