"""What a Tune trainable calls while it runs on a rank: ``tune.report``, ``tune.checkpoint_dir``,
``tune.get_checkpoint`` — Ray Tune's classic and current spellings, on top of ``ddp_runtime.report``.

Imports only ddp_runtime (and torch lazily, for the distributed checks): this runs on the Dask workers.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import ddp_runtime
from ddp_runtime import Checkpoint

_local = threading.local()  # a worker runs each rank's function in a thread of its own


def report(_metrics: dict[str, Any] | None = None, /, *, checkpoint: Checkpoint | None = None, **kwargs: Any) -> None:
    """Report a result: ``tune.report(loss=..., accuracy=...)`` (classic) or ``tune.report({"loss": ...},
    checkpoint=Checkpoint.from_directory(d))`` (current). A directory written inside ``tune.checkpoint_dir()``
    since the last report goes with this one. Every rank of a DDP trial calls it; rank 0's metrics count."""
    if _metrics is not None and not isinstance(_metrics, dict):
        raise TypeError(
            f"tune.report takes a dict of metrics or keyword arguments (tune.report(loss=0.1)), got "
            f"{type(_metrics).__name__}"
        )
    metrics = {**(_metrics or {}), **kwargs}
    pending = getattr(_local, "pending", None)
    _local.pending = None
    try:
        if checkpoint is None and pending is not None:
            checkpoint = Checkpoint.from_directory(pending)
        ddp_runtime.report(metrics, checkpoint=checkpoint)
    finally:
        if pending is not None:
            shutil.rmtree(pending, ignore_errors=True)  # persisted (rank 0) or not needed (other ranks)


@contextlib.contextmanager
def checkpoint_dir(step: int | None = None) -> Iterator[str]:
    """A fresh directory to write a checkpoint into (classic Tune): it is saved with the next ``tune.report``.
    ``step`` is accepted for compatibility; checkpoints are numbered by report."""
    directory = tempfile.mkdtemp(prefix=f"sweepflow-ckpt-{step if step is not None else 'x'}-")
    previous = getattr(_local, "pending", None)
    if previous is not None:  # two checkpoint_dir blocks without a report between them: keep the newest
        shutil.rmtree(previous, ignore_errors=True)
    _local.pending = None
    yield directory
    _local.pending = directory


@contextlib.contextmanager
def distributed_checkpoint_dir(step: int | None = None) -> Iterator[str]:
    """``checkpoint_dir`` for DDP trials: rank 0 gets the directory that is saved; every other rank gets a
    throwaway one (so a training loop can write unconditionally without writing the checkpoint N times)."""
    if ddp_runtime.get_context().get_world_rank() == 0:
        with checkpoint_dir(step) as directory:
            yield directory
        return
    with tempfile.TemporaryDirectory(prefix="sweepflow-ckpt-discard-") as directory:
        yield directory


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint this trial resumes from (after a restart), or None on a fresh start."""
    return ddp_runtime.get_checkpoint()


def is_distributed_trainable() -> bool:
    """True inside a trial that runs as a DDP group with an initialised process group (wrap the model in
    ``DistributedDataParallel`` then). A one-rank trial has no process group: train the plain model."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def get_trial_id() -> str:
    """The trial's id (``trial_0003``), as Ray's ``tune.get_context().get_trial_id()``."""
    from sweepflow.tasks.training.function import current_trial_run

    trial = current_trial_run()
    return trial.trial_id if trial is not None else ddp_runtime.get_context().get_experiment_name()


def get_trial_dir() -> str:
    """The trial's local directory on this rank's worker, which the trainable runs in (as Ray runs each trial in
    its trial directory, unless ``RAY_CHDIR_TO_TRIAL_DIR=0``): relative paths land there, one directory per trial.
    Scratch space: it goes with the worker; what must outlive the trial goes in a checkpoint (or to MLflow)."""
    return ddp_runtime.get_context().get_trial_dir()


class TuneContext:
    """Ray's ``tune.get_context()`` inside a trainable: the trial's id, name, directory and experiment, and (in a
    DDP trial) the rank's place in its group, as ``ddp_runtime.get_context()`` (Ray Train's) has it."""

    def get_trial_id(self) -> str:
        """The trial's id (``trial_0003``); see ``sweepflow.tune.get_trial_id``."""
        return get_trial_id()

    def get_trial_name(self) -> str:
        """The trial's name: its MLflow run's name; its id outside a Tune trial."""
        from sweepflow.tasks.training.function import current_trial_run

        trial = current_trial_run()
        return trial.run_name if trial is not None else get_trial_id()

    def get_trial_dir(self) -> str:
        """The trial's local scratch directory on this rank's worker; see ``sweepflow.tune.get_trial_dir``."""
        return get_trial_dir()

    def get_experiment_name(self) -> str:
        """The experiment's name (``tune.run(name=...)`` / ``RunConfig.name``)."""
        from sweepflow.tasks.training.function import current_trial_run

        trial = current_trial_run()
        return trial.experiment_name if trial is not None else ddp_runtime.get_context().get_experiment_name()

    def __getattr__(self, name: str) -> Any:  # get_world_rank, get_world_size, get_local_rank, ...
        return getattr(ddp_runtime.get_context(), name)


def get_context() -> TuneContext:
    """Ray's ``tune.get_context()``: only inside a trainable that a Tune experiment runs."""
    ddp_runtime.get_context()  # outside a trial: the error that says where it can be called
    return TuneContext()
