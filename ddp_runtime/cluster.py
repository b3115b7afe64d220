"""Starting a Dask cluster fit for DDP ranks when the user has none.

Workers are non-daemonic so DataLoader worker subprocesses can start inside them (dask/distributed#2718),
single-threaded (one rank per worker process), and hold torch before their first task, so the first group does
not pay for its import: a local cluster forks them from a server process that imported it once
(``_fork_server``), except on a host with GPUs, where they are spawned and import it themselves.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import Any, Literal

import dask
from distributed import Client, LocalCluster

from ddp_runtime import _compat, _fork_server, _warmup
from ddp_runtime import _gang as gang
from ddp_runtime.config import ScalingConfig
from ddp_runtime.object_store import object_store
from ddp_runtime.span_pruner import FinishedSpanPruner

PRELOAD = "ddp_runtime._preload"


def worker_config() -> dict[str, Any]:
    """Dask config that rank workers need; external clusters should set the same (env:
    ``DASK_DISTRIBUTED__WORKER__DAEMON=False``)."""
    return {"distributed.worker.daemon": False}


#: How long a local cluster waits for a killed worker's replacement before it gives the worker up. A failed
#: group's workers are killed on purpose and their nannies start fresh ones, which import torch first: on a
#: busy machine that takes longer than Dask's default 15 s, after which the cluster would close those nannies
#: and shrink for good (every later group then finds too few workers).
_LOST_WORKER_TIMEOUT = {"distributed.deploy.lost-worker-timeout": "600s"}


@contextlib.contextmanager
def local_cluster(
    *,
    n_workers: int | None = None,
    resources: dict[str, float] | None = None,
    threads_per_worker: int = 1,
    preload: list[str] | None = None,
    start_method: Literal["forkserver", "spawn"] = "forkserver",
) -> Iterator[Client]:
    """A LocalCluster on 127.0.0.1 with worker processes; yields a Client and closes both.

    ``start_method``: ``"forkserver"`` forks the workers from a server process that imported torch once per
    process (``_fork_server``), except on a host with GPUs, where they are spawned. ``"spawn"`` starts each
    worker as a new interpreter, as Dask does by default. A Dask config that says ``fork`` is kept.

    On a host with GPUs, use dask-cuda's ``LocalCUDACluster`` instead (one worker per GPU, each with its own
    ``CUDA_VISIBLE_DEVICES``): see ``gpu_local_cluster``.
    """
    n = n_workers or os.cpu_count() or 1
    # Every worker advertises its share of the host's cores as a "CPU" resource, so ScalingConfig's
    # resources_per_worker={"CPU": k} (cores for DataLoader workers) means the same here as on a real cluster.
    resources = {"CPU": float(max(1, (os.cpu_count() or 1) // n)), **(resources or {})}
    start_config, nanny_kwargs = _fork_server.start_settings(start_method, gpus=gpu_count())
    # The cluster reads the lost-worker timeout whenever a worker goes, and the start method whenever a nanny
    # starts one: they stay set while the cluster lives.
    with dask.config.set({**worker_config(), **_LOST_WORKER_TIMEOUT, **start_config}):
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=threads_per_worker,
            processes=True,
            host="127.0.0.1",
            # The HTTP server (health, metrics, and the dashboard when bokeh is installed) on a free loopback port.
            dashboard_address="127.0.0.1:0",
            resources=resources,
            preload=[PRELOAD, *(preload or [])],
            **nanny_kwargs,
        )
        with _client_of(cluster) as client:
            yield client


@contextlib.contextmanager
def _client_of(cluster: Any) -> Iterator[Client]:
    """A client of a cluster started here, whose scheduler forgets finished spans (a long-lived local scheduler
    would otherwise keep one per trial for good); closes both."""
    try:
        client = Client(cluster)
        try:
            client.register_plugin(FinishedSpanPruner())
            yield client
        finally:
            client.close()
    finally:
        cluster.close()


def gpu_count() -> int:
    """GPUs on this host, as ``nvidia-smi -L`` lists them (0 without the NVIDIA driver); torch is not imported."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


@contextlib.contextmanager
def gpu_local_cluster(**kwargs: Any) -> Iterator[Client]:
    """One Dask worker per visible GPU, each pinned to its GPU and advertising ``GPU=1``."""
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError as exc:
        raise ImportError("GPU clusters need dask-cuda: pip install dask-cuda (one worker per GPU)") from exc
    with dask.config.set({**worker_config(), **_LOST_WORKER_TIMEOUT}):
        cluster = LocalCUDACluster(resources={"GPU": 1}, preload=[PRELOAD], **kwargs)
        with _client_of(cluster) as client:
            yield client


def scheduler_address(client: Client) -> str:
    """The address of the scheduler ``client`` is connected to, without a round trip to it (e.g. to hand a
    cluster started here to other processes)."""
    return _compat.scheduler_address(client)


def max_concurrent_groups(client: Client, scaling_config: ScalingConfig) -> int:
    """How many groups of this shape the cluster can run at the same time (0: none fits)."""
    resources = {k: float(v) for k, v in scaling_config.worker_resources.items()}
    return client.run_on_scheduler(gang.capacity, scaling_config.num_workers, resources)


def warm_up_workers(
    client: Client,
    scaling_config: ScalingConfig | None = None,
    *,
    prepare: Callable[[], None] | None = None,
    timeout_s: float = 300.0,
) -> dict[str, float | str]:
    """Do the one-time start-up of every worker that could host a rank of ``scaling_config`` now, all at once,
    instead of inside the first groups (where it would count as their time and worker-seconds): the imports the
    worker preloads started in the background, torch's lazy imports (a rank's first optimizer and DDP), then ``prepare()`` on
    each (e.g. import the training function's module; shipped by cloudpickle). Runs in a thread of each worker
    beside whatever it runs; costs one round trip on warm workers.

    Returns each worker's seconds of start-up (about 0.0 when it was warm), or why it did not finish (an error,
    or still going after ``timeout_s``): a rank on that worker then waits for the rest, and its group reports
    those seconds as ``Result.startup_s``, apart from its ``held_s``.
    """
    scaling = scaling_config or ScalingConfig()
    resources = {k: float(v) for k, v in scaling.worker_resources.items()}
    workers = client.run_on_scheduler(gang.capable_workers, resources)
    if not workers:
        return {}
    payload = None
    if prepare is not None:
        import cloudpickle

        payload = cloudpickle.dumps(prepare)
    answers = client.run(_warmup.warm_worker, payload, timeout_s, workers=workers, on_error="return")
    return {
        address: answer if isinstance(answer, float | str) else f"{type(answer).__name__}: {answer}"
        for address, answer in answers.items()
    }


def groups_that_fit(client: Client, scaling_config: ScalingConfig, *, what: str) -> int:
    """``max_concurrent_groups``, raising ``InsufficientResourcesError`` (naming ``what`` asked for the group,
    and the fix) when not even one group fits."""
    fits = max_concurrent_groups(client, scaling_config)
    if fits < 1:
        raise gang.InsufficientResourcesError(
            f"no trial fits on this Dask cluster: each needs {scaling_config.num_workers} worker(s) with "
            f"{scaling_config.worker_resources or 'a free thread'} (from {what}); lower them, or add workers that "
            "declare those resources (dask worker --resources GPU=1)"
        )
    return fits


@contextlib.contextmanager
def cluster_client(
    address: str | None,
    *,
    use_gpu: bool = False,
    n_workers: int | None = None,
    preload: list[str] | None = None,
) -> Iterator[Client]:
    """A client of the scheduler at ``address``; without one, of a local cluster started for the caller (one
    worker per GPU with ``use_gpu``, else ``n_workers`` CPU workers). Closed on exit.

    Every experiment's cluster (``run_experiment``: ``tune.run``, ``Tuner.fit``, the pipeline) comes from here,
    so this is also its ``object_store`` scope: the objects the script ``put`` are placed on the cluster while
    the client is open and released from it before it closes."""
    with contextlib.ExitStack() as stack:
        if address:
            client = Client(address)
            stack.callback(client.close)
        elif use_gpu:
            client = stack.enter_context(gpu_local_cluster())
        else:
            client = stack.enter_context(local_cluster(n_workers=n_workers, preload=preload))
        with object_store(client):
            yield client
