"""Dask worker preload for pipeline clusters (in addition to ``ddp_runtime._preload``).

Evaluation and registration of the best trial run on a Dask worker (``sweepflow.tasks.finalize``); their imports
(mlflow.pytorch, matplotlib, torch._dynamo for the pt2 export) cost several seconds. Workers live across
pipeline runs, so they pay that once, in a background thread right after they start, instead of every run.
The thread's name starts with ``sweepflow-preload``: a worker's start-up (``ddp_runtime._warmup``) waits for it,
so a cold worker's first trial is not charged for these imports.
"""

import threading


def _warm() -> None:
    import sweepflow.tasks.tracking.registry  # noqa: F401  (mlflow.pytorch)
    import sweepflow.tasks.training.evaluate  # noqa: F401  (matplotlib)
    import sweepflow.tasks.training.loop  # noqa: F401


threading.Thread(target=_warm, name="sweepflow-preload-pipeline", daemon=True).start()
