"""``ddp_runtime.torch``: the PyTorch side of ddp_runtime, under the names Ray's ``ray.train.torch`` uses.

    from ddp_runtime.torch import TorchTrainer, prepare_model, prepare_data_loader

The driver's ``TorchTrainer`` lives in ``trainer`` (one group attempt at a time: ``_group``); the helpers a
training function calls on its rank live in ``prepare``. Importing this module does not import torch.
"""

from ddp_runtime._gpus import get_devices
from ddp_runtime.config import TorchConfig
from ddp_runtime.not_built import refusing
from ddp_runtime.prepare import enable_reproducibility, get_device, prepare_data_loader, prepare_model
from ddp_runtime.trainer import ReportCallback, TorchTrainer, Verdict, default_storage_path

__all__ = [
    "ReportCallback",
    "TorchConfig",
    "TorchTrainer",
    "Verdict",
    "default_storage_path",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
]

__getattr__ = refusing(
    __name__
)  # a ray.train.torch name not built here: an ImportError saying why and what to use
