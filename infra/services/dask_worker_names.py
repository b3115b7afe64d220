"""``dask scheduler --preload sweepflow.infra.services.dask_worker_names``: the scheduler's workers' names as JSON at
``PATH``, which the stack's health probe of each ``dask worker`` service reads (Dask's own identity document
fails during sweeps: ``sweepflow.infra.services.compat.serve_dask_worker_names``)."""

from __future__ import annotations

from typing import Any

PATH = "/json/worker-names.json"


def dask_setup(scheduler: Any) -> None:
    """Dask's preload hook, run in the scheduler's process."""
    from sweepflow.infra.services.compat import serve_dask_worker_names

    serve_dask_worker_names(scheduler, PATH)
