"""``ddp_runtime.lightning``: a PyTorch Lightning ``Trainer`` inside a ``TorchTrainer`` rank, as Ray's
``ray.train.lightning`` has it (Ray 2.60's names and behaviour).

    import lightning.pytorch as pl                      # or: import pytorch_lightning as pl
    from ddp_runtime.lightning import (RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback,
                                       prepare_trainer)

    def train_func(config):
        trainer = pl.Trainer(max_epochs=config["epochs"], devices="auto", accelerator="auto",
                             strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
                             callbacks=[RayTrainReportCallback()], enable_progress_bar=False)
        trainer = prepare_trainer(trainer)
        checkpoint = ddp_runtime.get_checkpoint()       # a restarted group, PBT's exploit: resume from it
        with checkpoint.as_directory() if checkpoint else contextlib.nullcontext() as d:
            trainer.fit(model, datamodule=data,
                        ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME) if d else None)

Either Lightning works: ``lightning.pytorch`` or ``pytorch_lightning`` (each Trainer takes only its own package's
strategies). The names are built for the one the importing code refers to (its ``pl``), else for the one
imported, else for ``lightning.pytorch`` (Ray's choice); ``for_package(name)`` gives either explicitly.

The group owns the processes: ``TorchTrainer`` starts one rank per Dask worker and has initialised
``torch.distributed`` (gloo on CPUs, NCCL on GPUs) before the function runs, so Lightning launches nothing and
opens no process group of its own. ``RayLightningEnvironment`` gives Lightning the group's ranks; the strategies
put the module on the rank's device (``get_device``) and shard the sampler by the group's ranks;
``RayTrainReportCallback`` reports each epoch's ``callback_metrics`` with a checkpoint named ``checkpoint.ckpt``
that every rank writes its part of (``report`` merges them: one file for DDP, every shard for FSDP).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import types
from typing import Any

import torch

from ddp_runtime.checkpoint import Checkpoint
from ddp_runtime.prepare import get_device
from ddp_runtime.session import get_context, report

#: Ray 2.60's names, built per Lightning package (``__getattr__``).
_NAMES = (
    "RayDDPStrategy",
    "RayDeepSpeedStrategy",
    "RayFSDPStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "prepare_trainer",
)
__all__ = list(_NAMES)

#: The two names Lightning 2.x is installed under: the ``lightning`` package's ``lightning.pytorch``, and the
#: standalone ``pytorch_lightning``. Each has its own Trainer, which accepts only its own Strategy subclasses.
PACKAGES = ("lightning.pytorch", "pytorch_lightning")
_BY_THE_GROUP = ("process_group_backend", "timeout", "start_method")
_built: dict[str, types.SimpleNamespace] = {}


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a finder that refuses the name outright
        return False


if not _installed("lightning") and not _installed("pytorch_lightning"):
    raise ModuleNotFoundError(
        "ddp_runtime.lightning needs PyTorch Lightning 2.x, which is not installed: pip install "
        "'sweepflow[lightning]' (or lightning), on the Dask workers too"
    )


def __getattr__(name: str) -> Any:
    """``from ddp_runtime.lightning import RayDDPStrategy``: the class for the Lightning the importing code uses
    (``lightning.pytorch`` or ``pytorch_lightning``: ``for_package``)."""
    if name not in _NAMES:
        raise AttributeError(f"module 'ddp_runtime.lightning' has no attribute {name!r}")
    return getattr(for_package(_package_of(sys._getframe(1))), name)


def _owner(value: Any) -> str | None:
    name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
    if not isinstance(name, str):
        return None
    if name == "pytorch_lightning" or name.startswith("pytorch_lightning."):
        return "pytorch_lightning"
    if name == "lightning" or name.startswith("lightning."):
        return "lightning.pytorch"
    return None


def _package_of(frame: types.FrameType | None) -> str:
    """The Lightning the importing code refers to (a module or a name of one of the two packages in its locals
    or globals); else the one of the two that is imported; else ``lightning.pytorch`` when it is installed, as
    Ray's ``ray.train.lightning`` picks."""
    if frame is not None:
        seen = {_owner(v) for v in [*frame.f_locals.values(), *frame.f_globals.values()]} - {None}
        if len(seen) == 1:
            return seen.pop()  # type: ignore[return-value]
    loaded = [p for p in PACKAGES if p in sys.modules]
    if len(loaded) == 1:
        return loaded[0]
    return PACKAGES[0] if _installed("lightning") else PACKAGES[1]


def for_package(package: str) -> types.SimpleNamespace:
    """The integration's classes and ``prepare_trainer`` for one Lightning package (``PACKAGES``), built once
    per process; one sentence naming the extra when neither is installed."""
    if package not in PACKAGES:
        raise ValueError(f"for_package({package!r}): Lightning is {' or '.join(PACKAGES)}")
    if package not in _built:
        try:
            pl = importlib.import_module(package)
        except ModuleNotFoundError:
            raise ModuleNotFoundError(
                f"ddp_runtime.lightning needs PyTorch Lightning 2.x ({package} does not import): pip install "
                "'sweepflow[lightning]' (or lightning), on the Dask workers too"
            ) from None
        _built[package] = _build(
            pl, importlib.import_module(f"{package}.plugins.environments").LightningEnvironment
        )
    return _built[package]


def _refuse_group_settings(strategy: str, kwargs: dict[str, Any]) -> None:
    given = [name for name in _BY_THE_GROUP if name in kwargs]
    if given:
        raise TypeError(
            f"{strategy}({given[0]}=...): the TorchTrainer's group sets the backend and the collective timeout "
            "before the training function runs; pass them as TorchConfig(backend=..., timeout_s=...) to the "
            "TorchTrainer instead"
        )


class _OnTheGroup:
    """What the three strategies share: the rank's device, a sampler over the group's ranks, and the process
    group: the TorchTrainer's, or, for a group of one rank (which has none), one of this Trainer's own, in
    memory (no port, nothing a later group on this worker could meet), taken down with the Trainer."""

    world_size: int
    global_rank: int
    _own_group = False

    def setup_environment(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and not dist.is_initialized() and get_context().get_world_size() == 1:
            device = get_device()
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            self._own_group = True
        super().setup_environment()  # type: ignore[misc]

    def teardown(self) -> None:
        import torch.distributed as dist

        super().teardown()  # type: ignore[misc]
        if self._own_group and dist.is_initialized():
            from ddp_runtime import _group_end

            _group_end.destroy_process_group()
            self._own_group = False

    @property
    def root_device(self) -> torch.device:
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class _DDPOnTheGroup(_OnTheGroup):
    """Lightning's ``DDPStrategy`` on the TorchTrainer's group (its arguments, but ``process_group_backend``,
    ``timeout`` and ``start_method``, which are the group's: ``TorchConfig``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse_group_settings("RayDDPStrategy", kwargs)
        super().__init__(*args, **kwargs)

    def configure_ddp(self) -> None:
        """Wrap the module in ``DistributedDataParallel``, but on a group of one rank, which has no gradients
        to reduce (the wrapper's hooks would only cost each step)."""
        if self.world_size > 1:
            super().configure_ddp()  # type: ignore[misc]


class _FSDPOnTheGroup(_OnTheGroup):
    """Lightning's ``FSDPStrategy`` on the TorchTrainer's group: each rank holds its shard; with
    ``state_dict_type="sharded"`` every rank writes its shard of ``checkpoint.ckpt`` and ``report`` keeps
    them all."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse_group_settings("RayFSDPStrategy", kwargs)
        super().__init__(*args, **kwargs)


class _DeepSpeedOnTheGroup(_OnTheGroup):
    """Lightning's ``DeepSpeedStrategy`` on the TorchTrainer's group (needs the ``deepspeed`` package)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not _installed("deepspeed"):
            raise ModuleNotFoundError(
                "RayDeepSpeedStrategy needs DeepSpeed, which is not installed: pip install deepspeed (on the "
                "Dask workers too), or use RayDDPStrategy / RayFSDPStrategy"
            )
        _refuse_group_settings("RayDeepSpeedStrategy", kwargs)
        super().__init__(*args, **kwargs)


class _GroupRanks:
    """The group's ranks for Lightning: world size, global, local and node rank from ``get_context()``. The
    processes exist already (the group's), so Lightning launches none and its setters change nothing."""

    @property
    def creates_processes_externally(self) -> bool:
        """The group's processes exist: Lightning launches none."""
        return True

    def world_size(self) -> int:
        """``ScalingConfig.num_workers``: the group's size."""
        return get_context().get_world_size()

    def global_rank(self) -> int:
        """This rank's index in the group."""
        return get_context().get_world_rank()

    def local_rank(self) -> int:
        """This rank's index among the group's ranks on its machine."""
        return get_context().get_local_rank()

    def node_rank(self) -> int:
        """The index of this rank's machine among the group's."""
        return get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        """The group's size is fixed by ``ScalingConfig.num_workers``."""

    def set_global_rank(self, rank: int) -> None:
        """The group's ranks are fixed by the TorchTrainer."""

    def teardown(self) -> None:
        """The group's environment outlives the Lightning Trainer (a next ``fit`` in the rank uses it)."""


def _build(pl: Any, lightning_environment: type) -> types.SimpleNamespace:
    """Ray's six names on ``pl`` (one of ``PACKAGES``): the classes on ``pl``'s bases, their bodies in the
    mixins above. They are still defined here, so that their qualified names stay what they were: Lightning
    keys a callback's state in a checkpoint by it (``Callback.state_key``)."""

    class RayDDPStrategy(_DDPOnTheGroup, pl.strategies.DDPStrategy):
        __doc__ = _DDPOnTheGroup.__doc__

    class RayFSDPStrategy(_FSDPOnTheGroup, pl.strategies.FSDPStrategy):
        __doc__ = _FSDPOnTheGroup.__doc__

    class RayDeepSpeedStrategy(_DeepSpeedOnTheGroup, pl.strategies.DeepSpeedStrategy):
        __doc__ = _DeepSpeedOnTheGroup.__doc__

    class RayLightningEnvironment(_GroupRanks, lightning_environment):
        __doc__ = _GroupRanks.__doc__

    strategies = (RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy)

    def prepare_trainer(trainer: Any) -> Any:
        """Check that ``trainer`` runs on the group, and say what to change when it does not (one sentence)."""
        strategy = trainer.strategy
        if not isinstance(strategy, strategies):
            raise RuntimeError(
                f"pl.Trainer(strategy={type(strategy).__name__}): inside a TorchTrainer the strategy must be one of "
                "RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy (ddp_runtime.lightning) or a subclass: pass "
                "strategy=RayDDPStrategy()"
            )
        environment = getattr(strategy, "cluster_environment", None)
        if environment is not None and not isinstance(environment, RayLightningEnvironment):
            raise RuntimeError(
                f"pl.Trainer's cluster environment is {type(environment).__name__}: inside a TorchTrainer it must "
                "be the group's, pass plugins=[RayLightningEnvironment()] (ddp_runtime.lightning)"
            )
        if trainer.num_devices != 1:
            raise RuntimeError(
                f"pl.Trainer(devices={trainer.num_devices}): each TorchTrainer rank drives one device (the group "
                "has ScalingConfig.num_workers ranks); pass devices='auto' and set num_workers instead"
            )
        return trainer

    class RayTrainReportCallback(_ReportEachEpoch, pl.callbacks.Callback):
        __doc__ = _ReportEachEpoch.__doc__

    for cls in (*strategies, RayLightningEnvironment, RayTrainReportCallback):
        cls.__module__ = __name__
    prepare_trainer.__module__ = __name__
    return types.SimpleNamespace(
        RayDDPStrategy=RayDDPStrategy,
        RayFSDPStrategy=RayFSDPStrategy,
        RayDeepSpeedStrategy=RayDeepSpeedStrategy,
        RayLightningEnvironment=RayLightningEnvironment,
        RayTrainReportCallback=RayTrainReportCallback,
        prepare_trainer=prepare_trainer,
    )


class _ReportEachEpoch:
    """At each training epoch's end: ``report`` the trainer's ``callback_metrics`` (plus ``epoch`` and
    ``step``) with a checkpoint holding ``checkpoint.ckpt`` (``trainer.save_checkpoint``, which every rank calls
    and each writes its part of), then wait for every rank. Resume with ``trainer.fit(...,
    ckpt_path=<get_checkpoint()'s directory>/checkpoint.ckpt)``."""

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(self, checkpoint_upload_mode: Any = None, validation: bool = False) -> None:
        super().__init__()
        if checkpoint_upload_mode is not None or validation:
            name = "checkpoint_upload_mode" if checkpoint_upload_mode is not None else "validation"
            raise TypeError(
                f"RayTrainReportCallback({name}=...): report() stores each checkpoint before it returns and "
                "validates none asynchronously here; leave it out (a report is committed once every rank's files "
                "are stored)"
            )
        self._tmp: str | None = None

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        metrics = {
            k: float(v.item()) if hasattr(v, "item") else float(v)
            for k, v in trainer.callback_metrics.items()
        }
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        self._tmp = tempfile.mkdtemp(prefix=f"lightning-checkpoint-rank{trainer.global_rank}-")
        try:
            trainer.save_checkpoint(os.path.join(self._tmp, self.CHECKPOINT_NAME), weights_only=False)
            report(metrics, checkpoint=Checkpoint.from_directory(self._tmp))
            trainer.strategy.barrier()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
