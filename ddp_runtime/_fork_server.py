"""A local cluster's worker processes forked from one server process that imported torch, not spawned.

Dask's nannies start each worker process with multiprocessing's ``spawn``: a new interpreter, which imports
Dask, torch and torch._dynamo again. On the 2-core machine that was ~3.4 s and ~6.5 CPU-s for a 2-worker
cluster, paid by every local cluster a process starts and by every replacement of a killed worker. With
``forkserver``, multiprocessing starts one server process per parent process, which imports them once
(``FORK_SERVER_IMPORTS``); every worker after that is a fork of it, with them already in memory (shared until
written): a 2-worker cluster then starts in ~0.2-0.5 s (benchmarks/RESULTS.md, "Local clusters' workers").

What a forked worker would get differently from a spawned one, and how it is made the same:

- sys.path, the working directory and ``__main__``: multiprocessing sends them with each start, as for spawn.
- The environment: a fork has the server's, from when the server started. The nanny hands the worker the
  parent's environment of the moment (``parent_environment``), which Dask sets first in the worker, and the
  worker's preload removes what the parent no longer has (``as_if_spawned``), before the worker joins its
  scheduler. Only variables read while the server imported torch keep the server's values.
- The exit: a fork server's child ends with ``os._exit``, skipping the ``atexit`` handlers a spawned worker runs
  at its exit; ``as_if_spawned`` has them run when the process ends.

Not used (``spawn`` as before) on a host with GPUs: CUDA does not survive a fork once initialised. The server's
imports do not initialise it (checked here, on a CUDA build without a GPU), but that never ran on a GPU host.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ddp_runtime import _compat

#: What the fork server imports, once per parent process: what a worker's preload (``_preload``) and its
#: one-time start-up (``_warmup.warm_process``) import.
FORK_SERVER_IMPORTS = ("distributed", "torch", "torch.distributed", *_compat.TORCH_LAZY_IMPORTS)

START_METHOD = "distributed.worker.multiprocessing-method"

#: The names of the parent's environment variables, handed to each worker with their values (JSON list).
_ENVIRON_NAMES = "DDP_RUNTIME_PARENT_ENVIRON"


def start_settings(start_method: str, *, gpus: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Dask config a local cluster sets while it lives, and the keywords for its nannies: workers forked
    from the fork server (which imports ``FORK_SERVER_IMPORTS`` unless it already runs in this process) for
    ``start_method="forkserver"`` on a host without GPUs; spawned for ``"spawn"`` or on a host with GPUs. A
    cluster whose Dask config says ``fork`` keeps it (a fork has the parent's environment already)."""
    import dask.config

    if dask.config.get(START_METHOD) == "fork":
        return {}, {}
    if start_method == "spawn" or gpus:
        return {START_METHOD: "spawn"}, {}
    _compat.set_fork_server_imports(FORK_SERVER_IMPORTS)
    return {START_METHOD: "forkserver"}, {"env": parent_environment()}


def parent_environment() -> dict[str, str]:
    """This process's environment, for a nanny's ``env``: what a spawned worker would have started with."""
    return {**os.environ, _ENVIRON_NAMES: json.dumps(sorted(os.environ))}


def with_variables(env: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """A nanny's ``env`` with ``extra`` set too (a worker's own ``CUDA_VISIBLE_DEVICES``): kept by
    ``restore_parent_environment`` in a forked worker as in a spawned one."""
    env = {**env, **extra}
    if _ENVIRON_NAMES in env:
        env[_ENVIRON_NAMES] = json.dumps(sorted({*json.loads(env[_ENVIRON_NAMES]), *extra}))
    return env


def as_if_spawned() -> None:
    """In a worker process a nanny started with ``parent_environment`` (a forked one; any other is left as it
    is): make it what a spawned worker would be. Its environment: see ``restore_parent_environment``. Its exit:
    its ``atexit`` handlers run when it ends (a training function's own flushes, MLflow's, logging's), which a
    fork server's child would skip."""
    if restore_parent_environment():
        _compat.run_atexit_handlers_when_the_process_ends()


def restore_parent_environment() -> bool:
    """Remove the variables the parent did not have when the cluster started (those the fork server's
    environment had then), keeping what the nanny adds itself (Dask's ``pre-spawn-environ`` and ``environ``);
    False, doing nothing, in a worker started without ``parent_environment``."""
    import dask.config

    names = os.environ.pop(_ENVIRON_NAMES, None)
    if names is None:
        return False
    keep = set(json.loads(names)) | {"PYTHONHASHSEED"}
    for key in ("distributed.nanny.pre-spawn-environ", "distributed.nanny.environ"):
        keep.update(dask.config.get(key, default={}) or {})
    for name in set(os.environ) - keep:
        del os.environ[name]
    return True
