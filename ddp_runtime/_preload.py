"""Dask worker preload: pay torch's import when the worker starts, not when the first group arrives.

``torch`` and ``torch.distributed`` are imported before the worker accepts tasks. ``torch._dynamo`` (pulled in
lazily by a rank's first optimizer and first ``DistributedDataParallel(...)``: 2-5 CPU-seconds, more than torch
itself; it imports sympy) is not: imported here it cost every worker those seconds on start-up, beside the first
trials. Workers import it in their one-time start-up instead (``_warmup.warm_process``: a sweep does it on every
capable worker before its first trial, ``cluster.warm_up_workers``), which is not charged to any trial's time.

The worker's own timers are set for training here first (``worker_config``): the profiler off, the loop's health
check and the memory and system monitors at 1, 1 and 5 s, unless the cluster set them itself.

torch is imported in ``dask_setup``, which Dask runs in the worker process only, before the worker joins its
scheduler; the module's own top level stays light, since ``dask worker --preload`` imports it in the nanny too.
A local cluster's worker was forked from a server that imported torch already (``_fork_server``): there
``dask_setup`` first makes its environment and exit a spawned worker's, and the imports cost nothing.

The worker's exit is made quick here too (``fast_exit``): a worker that imported torch._dynamo and mlflow spent
3-4 s in the interpreter's teardown when its cluster closed, past the nanny's 4-s wait, and was SIGKILLed.
"""

from typing import Any

from ddp_runtime._compat import use_the_platforms_start_method
from ddp_runtime._exit import fast_exit
from ddp_runtime._fork_server import as_if_spawned
from ddp_runtime.worker_config import apply_training_worker_config

apply_training_worker_config()  # before the nanny hands its configuration to the worker (module docstring)
fast_exit()


def dask_setup(worker: Any) -> None:
    """Dask calls this in the worker process only. ``dask worker --preload`` also imports this module in its own
    (nanny) process, to check the preload's command-line options: imported there, torch cost each nanny 2.6
    CPU-seconds on every start and 480 MiB of memory for its life, for nothing (benchmarks/RESULTS.md)."""
    as_if_spawned()  # a forked worker's environment and exit as a spawned one's (``_fork_server``)
    # A rank's own processes (DataLoader workers) start as in a plain process: forked, not through a fork server
    # that imports torch again at every epoch (the worker inherited its nanny's method).
    use_the_platforms_start_method()
    import torch
    import torch.distributed  # noqa: F401
