"""What a training function sees while it runs on a rank: ``report``, ``get_context``, ``get_checkpoint``,
``get_all_reported_checkpoints``.

The session lives in a thread-local because a Dask worker runs tasks in threads: two 1-rank groups may share a
worker process. Each ``report`` is a synchronisation point: rank 0 sends the metrics to the driver and waits
for its verdict (continue or stop); the checkpoints of every rank that passes one are merged into one and
committed (``_merge``), and rank 0 sends it to the driver as that report's; rank 0 then broadcasts the verdict
to every rank. (A 1-rank group commits its checkpoint first and sends it with the metrics.)
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from ddp_runtime import _group_end
from ddp_runtime._merge import persist_merged
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
        """This rank's index in the group, 0 to world size - 1 (rank 0's metrics are the reported ones)."""
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
    send_report: Callable[..., tuple[bool, bool]] | None
    # rank 0 only: queues a side message for the driver's ``on_side`` (see ``side_channel``)
    post_side: Callable[..., None] | None = None
    # prepare_model sharded the model (FSDP): ranks' checkpoints are shards, never copies of one another
    sharded: bool = False
    # the gang reservation of this rank's group (a TorchTrainer fitted inside this function borrows it)
    group_id: str | None = None


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


def inside_training_function() -> bool:
    """Whether the calling thread runs a training function (a rank of ``TorchTrainer.fit()`` or a trial), where
    ``report``/``get_context``/``get_checkpoint`` work."""
    return getattr(_local, "session", None) is not None


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


class CheckpointConsistencyMode(Enum):
    """What ``get_all_reported_checkpoints`` waits for (Ray's): here a report returns once its checkpoint is
    committed and no validation runs, so both modes return the same list at once."""

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


class ReportedCheckpointStatus(Enum):
    """A reported checkpoint's state (Ray's names): here every listed checkpoint is ``COMMITTED``."""

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


@dataclass
class ReportedCheckpoint:
    """A committed checkpoint of the run and the metrics rank 0 reported with it (Ray's
    ``ray.train.ReportedCheckpoint``)."""

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus = ReportedCheckpointStatus.COMMITTED


def get_all_reported_checkpoints(
    consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
    timeout_s: float | None = None,
) -> list[ReportedCheckpoint]:
    """The run's committed checkpoints, oldest first, with the metrics they were reported with (Ray's
    ``ray.train.get_all_reported_checkpoints``): those ``CheckpointConfig(num_to_keep=...)`` kept, from this
    attempt and the earlier ones of the run. Read from the run's storage by the calling rank; any rank may call
    it. ``report`` returns once its checkpoint is committed (and the driver applied retention), so nothing is
    in flight: ``consistency_mode`` and ``timeout_s`` are accepted for Ray's sake and change nothing."""
    if not isinstance(consistency_mode, CheckpointConsistencyMode):
        raise TypeError(
            f"get_all_reported_checkpoints(consistency_mode=...) takes a CheckpointConsistencyMode, got "
            f"{consistency_mode!r}"
        )
    session = _current()
    return [ReportedCheckpoint(s.checkpoint, dict(s.metrics)) for s in session.storage.list_committed()]


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    checkpoint_dir_name: str | None = None,
    *,
    checkpoint_on_request: Callable[[str], Any] | None = None,
) -> None:
    """Report metrics (kept from rank 0 only) and optionally this rank's checkpoint (Ray's ``ray.train.report``).

    Every rank must call it the same number of times. Any subset of the ranks may pass a checkpoint: the files of
    all of them are merged into one checkpoint of the run, each rank writing its own files to the run's storage
    in parallel, and committed once every one of them stored its files (two ranks with different bytes under
    one relative path fail the report on every rank, naming both, before anything is written; unless every rank
    reported the same file names, copies of one unsharded model as in Ray's getting-started example: rank 0's
    copy is kept then, with a warning). The checkpoint
    carries rank 0's metrics. ``checkpoint_dir_name``: the checkpoint's directory in the run (rank 0's counts;
    default ``checkpoint_<index>``); it must not name a committed checkpoint of the run. Returns once the
    checkpoint is durably committed; raises ``StopTraining`` on every rank when the driver asked the group to
    stop. In a group of several ranks, the metrics reach the driver (``on_report``) before the checkpoint is
    committed (it waits for every rank to reach this report); the driver keeps it as this report's once it is. ``checkpoint_on_request``: a report without a checkpoint can still get one when the driver's
    ``on_report`` asks for it (``Verdict(checkpoint=True)``): rank 0 then calls it with an empty directory to
    write the checkpoint into, and persists that as this report's checkpoint.
    """
    if not isinstance(metrics, dict):
        raise TypeError(
            f"report(metrics=...) takes a dict of metric name -> value, got {type(metrics).__name__}"
        )
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(
            f"report(checkpoint=...) takes a ddp_runtime.Checkpoint (Checkpoint.from_directory(d)), got "
            f"{type(checkpoint).__name__}"
        )
    session = _current()
    ctx = session.context
    if ctx.world_size == 1:
        stop = _report_alone(session, metrics, checkpoint, checkpoint_dir_name, checkpoint_on_request)
    else:
        stop = False
        wanted = False
        if ctx.world_rank == 0:
            # The metrics go first, whatever the other ranks are doing: a peer that is late (or hung) does not
            # hold them back from the driver, which then tells a hung rank from a slow report.
            assert session.send_report is not None
            stop, wanted = session.send_report(dict(metrics), None, checkpoint_follows=checkpoint is not None)
        with checkpoint.as_directory() if checkpoint is not None else _no_directory() as local_dir:
            stored, session.next_index = persist_merged(
                rank=ctx.world_rank,
                world_size=ctx.world_size,
                device=_collective_device(ctx),
                storage=session.storage,
                next_index=session.next_index,
                local_dir=local_dir,
                metrics=metrics,
                dir_name=checkpoint_dir_name,
                sharded=session.sharded,
            )
        if ctx.world_rank == 0:
            if stored is None and wanted and checkpoint_on_request is not None:
                stored = _requested(session, metrics, checkpoint_on_request)
            if stored is not None:
                assert session.send_report is not None
                session.send_report(None, stored)  # the driver keeps it as this report's checkpoint
    if ctx.world_size > 1:
        import torch
        import torch.distributed as dist

        # The verdict travels from rank 0 to all ranks; this collective is also the report's barrier.
        flag = torch.tensor([1 if stop else 0], dtype=torch.int32, device=_collective_device(ctx))
        dist.broadcast(_group_end.kept_until_group_destroyed(flag), src=0)
        stop = bool(flag.item())
    if stop:
        raise StopTraining()


def _report_alone(
    session: _Session,
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None,
    dir_name: str | None,
    on_request: Callable[[str], Any] | None,
) -> bool:
    """A 1-rank group's report: its checkpoint is committed first and goes with the metrics. Returns whether the
    driver asks the group to stop."""
    stored = None
    if checkpoint is not None:
        with checkpoint.as_directory() as local_dir:
            stored = session.storage.persist(local_dir, session.next_index, metrics, name=dir_name)
        session.next_index += 1
    assert session.send_report is not None
    stop, wanted = session.send_report(dict(metrics), stored)
    if wanted and stored is None and on_request is not None:
        session.send_report(None, _requested(session, metrics, on_request))
    return stop


def _requested(session: _Session, metrics: dict[str, Any], on_request: Callable[[str], Any]) -> Checkpoint:
    """The checkpoint the driver asked rank 0 for (``checkpoint_on_request``), committed."""
    directory = tempfile.mkdtemp(prefix="ddp-runtime-requested-")
    try:
        on_request(directory)
        stored = session.storage.persist(directory, session.next_index, metrics)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    session.next_index += 1
    return stored


@contextlib.contextmanager
def _no_directory() -> Iterator[None]:
    yield None


def _collective_device(ctx: TrainContext) -> torch.device:
    import torch
    import torch.distributed as dist

    # NCCL only moves CUDA tensors; gloo only CPU ones.
    return ctx.device if dist.get_backend() == "nccl" else torch.device("cpu")
