"""``sweepflow.air``: where Ray AIR's ``ray.air`` is. Its configs are the ones ``sweepflow.tune`` and ddp_runtime
use (``from sweepflow.air import RunConfig, ScalingConfig``); its MLflow integration is
``sweepflow.air.integrations.mlflow``."""

from ddp_runtime import Checkpoint, CheckpointConfig, FailureConfig, Result, RunConfig, ScalingConfig
from sweepflow.tune.not_built import refusing

__all__ = ["Checkpoint", "CheckpointConfig", "FailureConfig", "Result", "RunConfig", "ScalingConfig"]

__getattr__ = refusing(__name__)  # a Ray AIR name not built here: an ImportError saying why and what to use
