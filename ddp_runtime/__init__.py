"""ddp_runtime: PyTorch DDP worker groups on a Dask cluster, with a Ray-Train-shaped API.

    import ddp_runtime as train
    from ddp_runtime.torch import TorchTrainer, prepare_model, prepare_data_loader

Ray Data's subset: ``import ddp_runtime.data`` (``ray.data``), with ``TorchTrainer(datasets=...)``,
``DataConfig`` and ``get_dataset_shard`` (``ray.train``'s).

Ray's object store too (``ray.put`` / ``ray.get`` / ``ray.wait``): ``from ddp_runtime import put, get, wait``
(``ddp_runtime.object_store``).

A rank's devices: ``get_device()`` (``ddp_runtime.torch``) and ``get_devices()`` (Ray's ``ray.train.torch``'s); on
a host with GPUs a local cluster gives each worker one of its own (``cluster.local_cluster``).

Knows nothing of Prefect or MLflow: it needs only torch and dask.distributed.
"""

from ddp_runtime import collective  # ray.train.collective: barrier, broadcast_from_rank_zero
from ddp_runtime._gang import InsufficientResourcesError
from ddp_runtime._gpus import GPUPlacementError, get_devices
from ddp_runtime.callback import TrainRunContext, UserCallback
from ddp_runtime.checkpoint import Checkpoint
from ddp_runtime.config import (
    CheckpointConfig,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TorchConfig,
)
from ddp_runtime.not_built import refusing
from ddp_runtime.object_store import (
    GetTimeoutError,
    ObjectLostError,
    ObjectRef,
    get,
    object_store,
    put,
    wait,
)
from ddp_runtime.result import RankError, RankHangError, Result, TrainingFailedError
from ddp_runtime.session import (
    CheckpointConsistencyMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
    StopTraining,
    TrainContext,
    get_all_reported_checkpoints,
    get_checkpoint,
    get_context,
    get_dataset_shard,
    report,
)

#: The name Ray's examples give the training set in ``TorchTrainer(datasets={...})`` (``ray.train.TRAIN_DATASET_KEY``).
TRAIN_DATASET_KEY = "train"

__all__ = [
    "TRAIN_DATASET_KEY",
    "collective",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointConsistencyMode",
    "DataConfig",
    "FailureConfig",
    "GPUPlacementError",
    "GetTimeoutError",
    "InsufficientResourcesError",
    "ObjectLostError",
    "ObjectRef",
    "RankError",
    "RankHangError",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "StopTraining",
    "TorchConfig",
    "TrainContext",
    "TrainRunContext",
    "TrainingFailedError",
    "UserCallback",
    "get",
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_devices",
    "object_store",
    "put",
    "report",
    "wait",
]

__getattr__ = refusing(__name__)  # a Ray Train name not built here: an ImportError saying why and what to use
