"""Ray Train names ddp_runtime does not have: asking for one raises ``NotBuiltError`` (an ``ImportError``) whose one
sentence names the Ray name, why it is not here and what to use, never a bare "cannot import name".

``ddp_runtime`` (``ray.train``), ``ddp_runtime.torch`` (``ray.train.torch``) and ``ddp_runtime.data``
(``ray.data``) end with a module ``__getattr__`` built by ``refusing``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class NotBuiltError(ImportError):
    """A Ray name ddp_runtime does not have; the message says why and what to use instead."""


_CATCH_FAILED = (
    "is Ray Train v2's controller's; here fit() raises ddp_runtime.TrainingFailedError for every rank failure, "
    "lost worker or hang (its result.error is the rank's RankError or RankHangError): catch that"
)
_AMP = (
    "is Ray's automatic mixed precision helper; use torch's own in the training function: torch.autocast(...) "
    "around the forward pass and torch.amp.GradScaler for the backward pass and the step"
)
_VALIDATION = (
    "Ray Train v2's asynchronous validation is not built; validate inside the training function and pass the "
    "metrics to ddp_runtime.report"
)
_PREEMPTION = (
    "is Ray Train v2's preemption handling; a preempted worker is a failed one here: give "
    "FailureConfig(max_failures=n) and the group restarts from its latest checkpoint"
)

#: ddp_runtime module -> Ray name -> why it is not here and what to use.
NOT_BUILT: dict[str, dict[str, str]] = {
    "ddp_runtime": {
        "BackendConfig": "custom backends are not built: PyTorch's is the one backend; configure it with "
        "ddp_runtime.TorchConfig(backend=..., timeout_s=...)",
        "SyncConfig": "there is nothing to sync: give RunConfig(storage_path=...), a local path, a shared file system "
        "or an fsspec URL such as s3://, and every rank writes its checkpoint files there itself",
        "LoggingConfig": "is Ray Train v2's; ddp_runtime logs through Python's logging: configure the 'ddp_runtime' "
        "logger (logging.getLogger('ddp_runtime').setLevel(...))",
        "CheckpointUploadMode": "asynchronous checkpoint upload is not built: call ddp_runtime.report(metrics, "
        "checkpoint=...), which returns once every rank's files are stored and the checkpoint committed",
        "ControllerError": _CATCH_FAILED,
        "WorkerGroupError": _CATCH_FAILED,
        "NCCLHangError": "is Ray Train v2's; a group hung past TorchConfig(hang_timeout_s=...) ends fit() with "
        "ddp_runtime.TrainingFailedError, its result.error a RankHangError: catch that",
        "PreemptionError": _PREEMPTION,
        "PreemptionInfo": _PREEMPTION,
        "get_preemption_info": _PREEMPTION,
        "ValidationConfig": _VALIDATION,
        "ValidationFn": _VALIDATION,
        "ValidationTaskConfig": _VALIDATION,
    },
    "ddp_runtime.torch": {
        "TorchCheckpoint": "is Ray 2.0-2.6's; save with torch.save into a directory and report "
        "ddp_runtime.Checkpoint.from_directory(that_directory)",
        "accelerate": _AMP,
        "prepare_optimizer": _AMP,
        "backward": _AMP,
    },
}

#: ddp_runtime module -> the Ray module it stands for.
RAY_MODULE: dict[str, str] = {
    "ddp_runtime": "ray.train",
    "ddp_runtime.torch": "ray.train.torch",
    "ddp_runtime.data": "ray.data",
}


def refusing(module: str, listed: Mapping[str, str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` that refuses the Ray names listed for ``module`` with their reasons."""
    reasons = NOT_BUILT.get(module, {}) if listed is None else listed
    ray_module = RAY_MODULE[module]

    def __getattr__(name: str) -> Any:
        if name in reasons:
            reason = reasons[name]
            separator = " " if reason.startswith("is ") else ": "
            raise NotBuiltError(f"{ray_module}.{name}{separator}{reason}", name=name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
