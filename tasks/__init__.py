"""sweepflow.tasks: the pipeline's Prefect tasks, a module each, and the library they run (docs/internals.md "Where things
are"). It imports no flows; the layering is checked by ``make lint`` ([tool.importlinter] in pyproject.toml)."""

#: The Dask preload (``dask worker --preload``) for the workers that run these tasks: it warms the imports of
#: evaluation and registration (``worker_preload.py``). The flows pass it to the clusters they start; the
#: services take it as an argument (they import no tasks).
WORKER_PRELOAD = "sweepflow.tasks.worker_preload"
