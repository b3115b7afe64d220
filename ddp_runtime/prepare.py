"""The helpers a training function calls on its rank (Ray: ``ray.train.torch.prepare_model`` & co.).

They run inside a rank, on a Dask worker, and read the rank's ``TrainContext``; torch is imported inside each
helper, so importing this module (``ddp_runtime.torch`` re-exports it) costs the driver nothing.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ddp_runtime.session import _current, get_context

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader


def enable_reproducibility(seed: int = 0) -> None:
    """Make this rank's training reproducible (Ray's ``ray.train.torch.enable_reproducibility``): seed Python's,
    NumPy's and torch's generators, make torch use deterministic algorithms (an op without one raises), and turn
    off cuDNN's autotuner. Call it first in the training function, on every rank. Slower: for debugging and
    comparisons. A ``DataLoader`` with workers still needs its own ``worker_init_fn``/``generator`` seeded."""
    import os
    import random

    import numpy as np
    import torch

    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"enable_reproducibility(seed=...) takes an integer, got {seed!r}")
    # Deterministic cuBLAS needs a fixed workspace (CUDA >= 10.2); set before the first cuBLAS call.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def get_device() -> torch.device:
    """The rank's device: its worker's GPU with use_gpu, else the CPU."""
    return get_context().get_device()


_STRATEGIES = ("ddp", "fsdp", None)


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool | torch.device | str = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Prepare the model for this rank (Ray's ``ray.train.torch.prepare_model``): move it to its device and,
    when the group has more than one rank, wrap it for data parallelism.

    Args:
        model: the ``torch.nn.Module`` to train.
        move_to_device: True: to the rank's device (``get_device()``); a ``torch.device`` (or its name): to that
            device; False: where it is (FSDP then shards it from there).
        parallel_strategy: ``"ddp"``: ``DistributedDataParallel``; ``"fsdp"``: sharded (PyTorch's FSDP2
            ``fully_shard`` where torch has it, applied to the model in place, else the older
            ``FullyShardedDataParallel``), over the group's backend (NCCL on GPUs, gloo on CPUs); ``None``: not
            wrapped. A 1-rank group is never wrapped.
        parallel_strategy_kwargs: keyword arguments of ``DistributedDataParallel``, or of ``fully_shard``
            (``mesh`` defaults to all the group's ranks on the rank's device type; ``reshard_after_forward``,
            ``mp_policy``, ...), or of ``FullyShardedDataParallel``.

    Raises:
        ValueError: ``parallel_strategy`` is none of ``"ddp"``, ``"fsdp"`` and None.
    """
    import torch

    if parallel_strategy not in _STRATEGIES:
        raise ValueError(
            f"prepare_model(parallel_strategy={parallel_strategy!r}): use 'ddp' (DistributedDataParallel), "
            "'fsdp' (sharded: FullyShardedDataParallel) or None (not wrapped)"
        )
    ctx = get_context()
    if isinstance(move_to_device, torch.device | str):
        device = torch.device(move_to_device)
    else:
        device = ctx.get_device()
    if move_to_device is not False:
        model = model.to(device)
    kwargs = dict(parallel_strategy_kwargs or {})
    if ctx.get_world_size() == 1 or parallel_strategy is None:
        return model
    if parallel_strategy == "fsdp":
        _current().sharded = True  # the ranks' checkpoints are shards: report refuses two that clash
        return _shard(model, device, ctx.get_world_size(), kwargs)
    from torch.nn.parallel import DistributedDataParallel

    if device.type == "cuda":
        kwargs.setdefault("device_ids", [device.index if device.index is not None else 0])
        kwargs.setdefault("output_device", kwargs["device_ids"][0])
    return DistributedDataParallel(model, **kwargs)


def _shard(model: torch.nn.Module, device: torch.device, world_size: int, kwargs: dict[str, Any]) -> Any:
    """FSDP2's ``fully_shard`` on the model (in place; its class becomes an ``FSDPModule``), on a mesh of every
    rank on ``device``'s type: its default mesh would be CUDA's whenever a GPU is visible, which a gloo group
    cannot use. Without FSDP2 (torch < 2.6), the older ``FullyShardedDataParallel`` wrapper."""
    import torch.distributed.fsdp as fsdp

    fully_shard = getattr(fsdp, "fully_shard", None)
    if fully_shard is not None:
        if "mesh" not in kwargs:
            from torch.distributed.device_mesh import init_device_mesh

            kwargs["mesh"] = init_device_mesh(device.type, (world_size,))
        return fully_shard(model, **kwargs)
    if device.type != "cuda":  # FSDP1 itself refuses CPUs ("FSDP needs a non-CPU accelerator device")
        raise RuntimeError(
            f"prepare_model(parallel_strategy='fsdp') on {device}: this torch ({_torch_version()}) has no FSDP2 "
            "fully_shard, and its FullyShardedDataParallel needs a GPU: install torch >= 2.6 to shard on CPUs, or "
            "train with use_gpu=True"
        )
    kwargs.setdefault("device_id", device)
    return fsdp.FullyShardedDataParallel(model, **kwargs)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _move(batch: Any, device: torch.device, non_blocking: bool = True) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, tuple | list):
        return type(batch)(_move(b, device, non_blocking) for b in batch)
    if isinstance(batch, dict):
        return {k: _move(v, device, non_blocking) for k, v in batch.items()}
    return batch


class _DeviceDataLoader:
    """Iterates the wrapped loader and moves each batch to the rank's device; everything else (``sampler``,
    ``dataset``, ``batch_size``, ``len``) is the wrapped loader's."""

    def __init__(self, loader: DataLoader, device: torch.device, non_blocking: bool = True) -> None:
        self._loader = loader
        self._device = device
        self._non_blocking = non_blocking

    def __iter__(self) -> Iterator[Any]:
        if self._device.type == "cpu":
            yield from self._loader
            return
        for batch in self._loader:
            yield _move(batch, self._device, self._non_blocking)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def prepare_data_loader(
    data_loader: DataLoader,
    *,
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> DataLoader:
    """Shard the loader across ranks with a DistributedSampler (unless it has one) and move batches to the
    rank's device. Shuffling is kept: a shuffling loader gets a shuffling sampler (call ``set_epoch``).

    ``auto_transfer`` (Ray's): True copies each batch to a GPU asynchronously (``non_blocking``: the copy of a
    pinned batch overlaps the work already queued on the device; Ray uses a side CUDA stream for the same), False
    copies synchronously. No effect on a CPU rank.

    DataLoader worker processes: Dask workers default to the ``spawn`` start method, which would re-import
    torch in every DataLoader worker at every epoch; on Linux the loader is given ``fork`` (PyTorch's usual
    default there) unless it names a ``multiprocessing_context`` itself.
    """
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

    ctx = get_context()
    if data_loader.num_workers > 0 and multiprocessing.current_process().daemon:
        raise RuntimeError(
            f"DataLoader(num_workers={data_loader.num_workers}) cannot start worker processes inside a daemonic "
            "Dask worker. Start the Dask workers with DASK_DISTRIBUTED__WORKER__DAEMON=False (ddp_runtime's local "
            "clusters do), or use num_workers=0."
        )
    world_size = ctx.get_world_size()
    sampler = data_loader.sampler
    if add_dist_sampler and world_size > 1 and not isinstance(sampler, DistributedSampler):
        if data_loader.batch_size is None:
            raise ValueError(
                "prepare_data_loader cannot shard a DataLoader built with a custom batch_sampler; give it a "
                "DistributedSampler yourself or pass add_dist_sampler=False"
            )
        if not isinstance(sampler, RandomSampler | SequentialSampler):
            raise ValueError(
                f"prepare_data_loader cannot shard a DataLoader with a custom sampler ({type(sampler).__name__}); "
                "use a DistributedSampler yourself or pass add_dist_sampler=False"
            )
        sampler = DistributedSampler(
            data_loader.dataset,
            num_replicas=world_size,
            rank=ctx.get_world_rank(),
            shuffle=isinstance(sampler, RandomSampler),
        )
    mp_context = data_loader.multiprocessing_context
    if (
        data_loader.num_workers > 0
        and mp_context is None
        and sys.platform == "linux"
        and multiprocessing.get_start_method() != "fork"
    ):
        mp_context = "fork"
    loader = data_loader
    if sampler is not data_loader.sampler or mp_context is not data_loader.multiprocessing_context:
        loader = DataLoader(
            data_loader.dataset,
            batch_size=data_loader.batch_size,
            sampler=sampler,
            num_workers=data_loader.num_workers,
            collate_fn=data_loader.collate_fn,
            pin_memory=data_loader.pin_memory,
            drop_last=data_loader.drop_last,
            timeout=data_loader.timeout,
            worker_init_fn=data_loader.worker_init_fn,
            multiprocessing_context=mp_context,
            generator=data_loader.generator,
            prefetch_factor=data_loader.prefetch_factor if data_loader.num_workers > 0 else None,
            persistent_workers=data_loader.persistent_workers,
        )
    if move_to_device:
        return _DeviceDataLoader(loader, ctx.get_device(), auto_transfer)  # type: ignore[return-value]
    return loader
