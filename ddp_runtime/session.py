"""What a training function sees while it runs on a rank: ``report``, ``get_context``, ``get_checkpoint``.

The session lives in a thread-local because a Dask worker runs tasks in threads: two 1-rank groups may share a
worker process. Each ``report`` is a synchronisation point: rank 0 persists the checkpoint (if any), sends the
metrics to the driver, waits for its verdict (continue or stop), and broadcasts that verdict to every rank.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddp_runtime.checkpoint import Checkpoint, RunStorage

if TYPE_CHECKING:  # torch is imported where ranks run, not by drivers (the flow process stays light)
    import torch


class StopTraining(BaseException):  # noqa: N818 - it is a control-flow signal, not an error
    """Raised inside ``report`` when the driver asked the group to stop (e.g. ASHA pruned the trial).

    A ``BaseException`` so that a training loop's ``except Exception`` does not swallow it.
    """


@dataclass
class TrainContext:
    """The rank's place in its group (Ray: ``ray.train.get_context()``)."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: torch.device
    experiment_name: str
    trial_dir: str

    def get_world_rank(self) -> int:
        """This rank's index in the group, 0 to world size - 1 (rank 0 reports and checkpoints)."""
        return self.world_rank

    def get_world_size(self) -> int:
        """How many ranks the group has (``ScalingConfig.num_workers``)."""
        return self.world_size

    def get_local_rank(self) -> int:
        """This rank's index among the group's ranks on its machine."""
        return self.local_rank

    def get_local_world_size(self) -> int:
        """How many of the group's ranks run on this rank's machine."""
        return self.local_world_size

    def get_node_rank(self) -> int:
        """The index of this rank's machine among the group's machines."""
        return self.node_rank

    def get_device(self) -> torch.device:
        """The ``torch.device`` this rank trains on (its GPU, or the CPU)."""
        return self.device

    def get_experiment_name(self) -> str:
        """The run's name (``RunConfig.name``; a Tune trial's run name)."""
        return self.experiment_name

    def get_trial_dir(self) -> str:
        """This run's scratch directory on the rank's worker (Ray's trial directory), which the function runs
        in.

        It goes away with the worker: what must outlive the run goes in a checkpoint.
        """
        return self.trial_dir


@dataclass
class _Session:
    context: TrainContext
    storage: RunStorage
    resume_from: Checkpoint | None
    next_index: int
    # rank 0 only: sends a report to the driver; returns whether the driver asks the group to stop, and whether
    # it asks for a checkpoint of that report (metrics None: sends the checkpoint it asked for)
    send_report: Callable[[dict[str, Any] | None, Checkpoint | None], tuple[bool, bool]] | None
    # rank 0 only: queues a side message for the driver's ``on_side`` (see ``side_channel``)
    post_side: Callable[..., None] | None = None


_local = threading.local()


def _install(session: _Session | None) -> None:
    _local.session = session


def _current() -> _Session:
    session = getattr(_local, "session", None)
    if session is None:
        raise RuntimeError(
            "ddp_runtime.report/get_context/get_checkpoint can only be called inside a training function run by "
            "ddp_runtime.torch.TorchTrainer(...).fit()"
        )
    return session


def get_context() -> TrainContext:
    """The calling rank's ``TrainContext`` (Ray's ``ray.train.get_context()``).

    Raises:
        RuntimeError: called outside a training function that ``TorchTrainer.fit()`` runs.
    """
    return _current().context


def side_channel(*, flush_after_s: float) -> Callable[[Any], None] | None:
    """On rank 0: a function that sends a payload (plain data) to the driver's ``TorchTrainer(on_side=...)``,
    callable from any thread of the rank while its training function runs (a sampler's, say); None on the other
    ranks. No verdict, no round trip of its own: payloads go with the next report or the rank's result; when the
    oldest waiting has waited ``flush_after_s`` seconds for a report, the next post sends them alone. Payloads
    arrive in order, each before the report that follows it."""
    session = _current()
    post = session.post_side
    if post is None:
        return None
    return lambda payload: post(payload, flush_after_s=flush_after_s)


def _install_shards(shards: dict[str, Any] | None) -> None:
    """Set (None: clear) the calling rank's dataset shards, by name (``TorchTrainer(datasets=...)``)."""
    _local.shards = shards


def get_dataset_shard(name: str = "train") -> Any:
    """This rank's shard of the dataset given as ``TorchTrainer(datasets={name: ...})`` (Ray's
    ``ray.train.get_dataset_shard``): a ``ddp_runtime.data.DataIterator``.

    A dataset that ``DataConfig.datasets_to_split`` names (all, by default) is split: every rank gets its own
    disjoint rows, the same number on each (the last ``rows % world_size`` rows, at most ``world_size - 1``,
    are dropped), so ``iter_torch_batches(batch_size=b)`` yields the same number of batches on every rank.
    Any other dataset is given whole to every rank. Each ``iter_*`` call is one pass (an epoch), streamed from
    the Dask workers partition by partition.

    Raises:
        RuntimeError: called outside a training function that ``TorchTrainer.fit()`` runs.
        KeyError: no dataset of that name was given (the message lists the names that were).
    """
    _current()
    shards = getattr(_local, "shards", None) or {}
    if name not in shards:
        given = sorted(shards) or "none"
        raise KeyError(
            f"get_dataset_shard({name!r}): no dataset of that name was given to TorchTrainer(datasets=...); "
            f"given: {given}"
        )
    return shards[name]


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from after a restart (the latest committed one), or None on a fresh start."""
    return _current().resume_from


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    *,
    checkpoint_on_request: Callable[[str], Any] | None = None,
) -> None:
    """Report metrics (kept from rank 0 only) and optionally a checkpoint (persisted once, by rank 0).

    Every rank must call it the same number of times. Returns once the checkpoint is durably stored; raises
    ``StopTraining`` on every rank when the driver asked the group to stop. ``checkpoint_on_request``: a report
    without a checkpoint can still get one when the driver's ``on_report`` asks for it (``Verdict(checkpoint=
    True)``): rank 0 then calls it with an empty directory to write the checkpoint into, and persists that as
    this report's checkpoint.
    """
    if not isinstance(metrics, dict):
        raise TypeError(
            f"report(metrics=...) takes a dict of metric name -> value, got {type(metrics).__name__}"
        )
    session = _current()
    ctx = session.context
    stop = False
    if ctx.world_rank == 0:
        stored = None
        if checkpoint is not None:
            with checkpoint.as_directory() as local_dir:
                stored = session.storage.persist(local_dir, session.next_index, metrics)
            session.next_index += 1
        assert session.send_report is not None
        stop, wanted = session.send_report(dict(metrics), stored)
        if wanted and stored is None and checkpoint_on_request is not None:
            directory = tempfile.mkdtemp(prefix="ddp-runtime-requested-")
            try:
                checkpoint_on_request(directory)
                stored = session.storage.persist(directory, session.next_index, metrics)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            session.next_index += 1
            session.send_report(None, stored)  # the driver keeps it as this report's checkpoint
    if ctx.world_size > 1:
        import torch
        import torch.distributed as dist

        # The verdict travels from rank 0 to all ranks; this collective is also the report's barrier.
        flag = torch.tensor([1 if stop else 0], dtype=torch.int32, device=_collective_device(ctx))
        dist.broadcast(flag, src=0)
        stop = bool(flag.item())
    if stop:
        raise StopTraining()


def _collective_device(ctx: TrainContext) -> torch.device:
    import torch
    import torch.distributed as dist

    # NCCL only moves CUDA tensors; gloo only CPU ones.
    return ctx.device if dist.get_backend() == "nccl" else torch.device("cpu")
