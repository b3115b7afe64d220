"""Dask worker preload for pipeline clusters (in addition to ``ddp_runtime._preload``, which warms torch).

Every worker runs trials of the pipeline's training code (``sweepflow.tasks.training.loop``: the models, the data
loading) and evaluates checkpoints with it; workers live across pipeline runs, so they import it once, in a
background thread right after they start, instead of in a trial. The thread's name starts with
``sweepflow-preload``: a worker's start-up (``ddp_runtime._warmup``) waits for it, so a cold worker's first
trial is not charged for it.

Not warmed here: mlflow.pytorch, which only registration uses (on one worker, ``sweepflow.tasks.finalize``).
Warming it on every worker cost each one seconds of CPU on start-up, competing with the first trials, and
memory for its life.
"""

import threading


def _warm() -> None:
    import sweepflow.tasks.training.evaluate  # noqa: F401
    import sweepflow.tasks.training.loop  # noqa: F401


threading.Thread(target=_warm, name="sweepflow-preload-pipeline", daemon=True).start()
