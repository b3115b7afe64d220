"""``ddp_runtime.collective``: collectives across a group's ranks, under Ray's names (``ray.train.collective``).

    from ddp_runtime.collective import barrier, broadcast_from_rank_zero

Both are called from a training function that ``TorchTrainer.fit()`` runs, by every rank of the group the same
number of times, and go through the group's ``torch.distributed`` process group: gloo on CPUs, NCCL on GPUs
(where the objects travel through the rank's device). On a 1-rank group there is nothing to wait for:
``barrier()`` returns at once and ``broadcast_from_rank_zero(obj)`` returns ``obj``. Importing this module does
not import torch.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, TypeVar

from ddp_runtime.session import TrainContext, get_context

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


def _group_device(ctx: TrainContext) -> torch.device | None:
    """The device an object collective stages its bytes on: the rank's GPU under NCCL (which moves CUDA tensors
    only), None (the CPU) under gloo."""
    import torch.distributed as dist

    return ctx.get_device() if dist.get_backend() == "nccl" else None


def barrier() -> None:
    """Wait until every rank of the group has called ``barrier()`` (Ray's ``ray.train.collective.barrier``).

    Raises:
        RuntimeError: called outside a training function that ``TorchTrainer.fit()`` runs.
    """
    ctx = get_context()
    if ctx.get_world_size() == 1:
        return
    import torch.distributed as dist

    device = _group_device(ctx)
    if device is not None:
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def broadcast_from_rank_zero(data: T) -> T:
    """Rank 0's ``data`` on every rank (Ray's ``ray.train.collective.broadcast_from_rank_zero``): every rank
    passes a value (the others' are ignored: ``None`` is usual); rank 0 gets its own back, the others a copy.

    Also a barrier: it returns on each rank once every rank has called it. ``data`` must be picklable; it is
    meant for small values (a path, a run id, a few numbers), not tensors of model size: those belong in
    ``torch.distributed.broadcast``. When rank 0's value cannot be pickled, every rank raises (none is left
    waiting for it).

    Raises:
        RuntimeError: called outside a training function that ``TorchTrainer.fit()`` runs.
        TypeError: rank 0's ``data`` cannot be pickled (on every rank; rank 0 chains pickle's own error).
    """
    ctx = get_context()
    if ctx.get_world_size() == 1:
        return data
    import torch.distributed as dist

    error: BaseException | None = None
    if ctx.get_world_rank() == 0:
        try:
            mine: tuple[str, object] | None = ("data", pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            error = exc
            mine = ("error", f"{type(exc).__name__}: {exc}")
    else:
        mine = None
    # all_gather rather than broadcast: no rank returns before every rank has called it (Ray's barrier
    # semantics), and the others' contribution is one pickled None.
    gathered: list[tuple[str, object] | None] = [None] * ctx.get_world_size()
    dist.all_gather_object(gathered, mine)
    answer = gathered[0]
    assert answer is not None  # rank 0 always sends a tagged payload
    kind, payload = answer
    if kind == "error":
        raise TypeError(
            f"broadcast_from_rank_zero: rank 0's data cannot be pickled ({payload}); pass a picklable value "
            "(plain data: numbers, strings, lists, dicts)"
        ) from error
    assert isinstance(payload, bytes)
    return data if ctx.get_world_rank() == 0 else pickle.loads(payload)
