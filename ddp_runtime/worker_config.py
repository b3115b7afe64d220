"""A Dask worker that trains keeps its own timers out of the training's way, and its allocator as a plain
process's.

A rank trains in a thread of its Dask worker, and that worker's event loop shares the process's GIL with it. With
Dask's defaults the loop wakes more than 160 times a second whether or not anyone looks: the statistical profiler
samples every thread's stack every 10 ms (for the dashboard's Profile page), the loop's health check ticks every
20 ms, the memory monitor runs every 100 ms and the system monitor every 500 ms. Each wake-up takes the GIL from
the training thread. Measured on the 2-core development machine, the same 5-s training function in a worker with
Dask's defaults took 7.8 % more wall time and 4.4 % more CPU in its own thread than in a plain process, while the
worker's loop used 0.25 CPU-s per trial; with the settings below the worker was within 2 % of the plain process
(benchmarks/RESULTS.md, "Inside a worker").

``ddp_runtime._preload`` (``dask worker --preload ddp_runtime._preload``, as docs/deploying.md asks of a cluster's
workers) applies them when it is imported. ``dask worker`` imports its preloads before it starts the nanny, which
hands its configuration to the worker process, so the worker's own timers are built with them. A setting that is
not at Dask's default (a YAML file, a ``DASK_...`` variable, ``dask.config.set``) is left as it is: a cluster that
wants the profiler sets ``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=True``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Dask's ``pre-spawn-environ`` entry that sets ``MALLOC_TRIM_THRESHOLD_`` in every worker process (None: unset).
NO_MALLOC_TRIM_KEY = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"

#: The worker's timers, as a training worker needs them. The worker still heartbeats (the scheduler sets that
#: interval) and answers at once: these are only what runs whether or not there is work.
TRAINING_WORKER_CONFIG: Mapping[str, Any] = {
    # The statistical profiler samples each thread's stack 100 times a second, for a dashboard page.
    "distributed.worker.profile.enabled": False,
    # The event-loop health check, 50 times a second; once a second still catches a loop blocked for longer than
    # its 3-s warning limit.
    "distributed.admin.tick.interval": "1s",
    # Memory checks (worker: spill/pause; nanny: restart at 95 %), 10 a second -> 1.
    "distributed.worker.memory.monitor-interval": "1s",
    # CPU/memory/network samples for the dashboard's charts and the heartbeats, 2 a second -> 1 every 5 s.
    "distributed.admin.system-monitor.interval": "5s",
    # Dask starts each worker process with MALLOC_TRIM_THRESHOLD_=65536 (against pandas' fragmentation). Setting
    # it turns off glibc's dynamic mmap threshold, so every tensor over 128 KiB a training step allocates is an
    # mmap, page faults and an munmap: a 768-wide matmul loop took 10 % longer, a Lightning epoch up to 2x
    # (benchmarks/RESULTS.md, "Frameworks inside a worker"). A rank's allocator behaves as a plain process's.
    # ``dask worker`` imports its preloads before it starts the nanny, which reads this when it spawns.
    NO_MALLOC_TRIM_KEY: None,
}


def _dask_defaults() -> dict[str, Any]:
    """The defaults Dask's packages ship (before any YAML file, variable or ``set``)."""
    import dask.config
    import distributed.config  # noqa: F401 - registers distributed's defaults, where these keys are

    return dask.config.merge(*dask.config.defaults)


def apply_training_worker_config() -> dict[str, Any]:
    """Sets each of ``TRAINING_WORKER_CONFIG``'s keys that is still at Dask's default in this process; returns
    what it set."""
    import dask.config

    defaults = _dask_defaults()
    chosen = {
        key: value
        for key, value in TRAINING_WORKER_CONFIG.items()
        if dask.config.get(key, default=None) == dask.config.get(key, default=None, config=defaults)
    }
    dask.config.set(chosen)
    return chosen
