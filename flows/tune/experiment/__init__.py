"""``sweepflow.tune.experiment``: where Ray's ``ray.tune.experiment`` is: ``Trial``, what callbacks and analyses are
given (``sweepflow.tune.analysis.Trial``). ``Experiment`` specs are refused with the fix."""

from sweepflow.tune.analysis import Trial
from sweepflow.tune.not_built import refusing

__all__ = ["Trial"]

__getattr__ = refusing(__name__)  # Ray names not built here: refused with the reason and the fix
