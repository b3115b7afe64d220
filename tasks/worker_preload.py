"""Dask worker preload for pipeline clusters (in addition to ``ddp_runtime._preload``, which warms torch).

Every worker runs trials of the pipeline's training code (``sweepflow.tasks.training.loop``: the models, the data
loading) and evaluates checkpoints with it; workers live across pipeline runs, so they import it once, in a
background thread right after they start (``dask_setup``: in the worker process, not in the nanny that
``dask worker --preload`` also imports this module in), instead of in a trial. The thread's name starts with
``sweepflow-preload``: a worker's start-up (``ddp_runtime._warmup``) waits for it, so a cold worker's first
trial is not charged for it.

Not warmed here: mlflow.pytorch, which only registration uses (on one worker, ``sweepflow.tasks.finalize``).
Warming it on every worker cost each one seconds of CPU on start-up, competing with the first trials, and
memory for its life.
"""

import threading
from typing import Any

_started = False


def _warm() -> None:
    import sweepflow.tasks.training.evaluate  # noqa: F401
    import sweepflow.tasks.training.loop  # noqa: F401


def dask_setup(worker: Any) -> None:
    """Dask calls this in the worker process only (``dask worker --preload`` imports this module in its nanny
    process too, where the training code is not wanted): start the import thread, once per process."""
    global _started
    if not _started:
        _started = True
        threading.Thread(target=_warm, name="sweepflow-preload-pipeline", daemon=True).start()
