"""``sweepflow.air``: where Ray AIR's ``ray.air`` is. Its configs are the ones ``sweepflow.tune`` and ddp_runtime
use (``from sweepflow.air import RunConfig, ScalingConfig``); its MLflow integration is
``sweepflow.air.integrations.mlflow``."""

from typing import TYPE_CHECKING, Union

from ddp_runtime import Checkpoint, CheckpointConfig, FailureConfig, Result, RunConfig, ScalingConfig
from sweepflow.tune.not_built import refusing

if TYPE_CHECKING:
    import numpy
    import pandas

#: What a batch of ``ddp_runtime.data`` is (Ray's ``ray.air.DataBatchType``): a pandas DataFrame, or a dict of column
#: name -> numpy array (``batch_format="numpy"``).
DataBatchType = Union["pandas.DataFrame", dict[str, "numpy.ndarray"]]  # noqa: UP007 - a runtime alias, as Ray's

__all__ = ["Checkpoint", "CheckpointConfig", "DataBatchType", "FailureConfig", "Result", "RunConfig", "ScalingConfig"]

__getattr__ = refusing(__name__)  # a Ray AIR name not built here: an ImportError saying why and what to use
