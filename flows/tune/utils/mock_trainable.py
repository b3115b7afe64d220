"""``sweepflow.tune.utils.mock_trainable``: the module path of Ray's example trainable (``MyTrainableClass``), which
is not shipped; importing the module works, using the class is refused with what to use instead."""

from sweepflow.tune.not_built import refusing

__getattr__ = refusing(__name__)
