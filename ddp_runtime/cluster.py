"""Starting a Dask cluster fit for DDP ranks when the user has none.

Workers are non-daemonic so DataLoader worker subprocesses can start inside them (dask/distributed#2718),
single-threaded (one rank per worker process), and hold torch before their first task, so the first group does
not pay for its import: a local cluster forks them from a server process that imported it once
(``_fork_server``), except on a host with GPUs, where they are spawned and import it themselves. There each
worker gets a GPU of its own (``_gpus``: its own ``CUDA_VISIBLE_DEVICES``, ``GPU=1``).

A local cluster's workers never run the user's main module (``_compat.main_not_rerun_in``): a script without an
``if __name__ == "__main__":`` guard, ``python -c``, ``python -`` and a notebook start one alike, and the training
function travels to the workers by value (cloudpickle), as it does to a cluster of other machines.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import dask
from distributed import Client, LocalCluster, Nanny

from ddp_runtime import _compat, _fork_server, _gpus, _warmup
from ddp_runtime import _gang as gang
from ddp_runtime.config import ScalingConfig
from ddp_runtime.object_store import object_store
from ddp_runtime.span_pruner import FinishedSpanPruner

PRELOAD = "ddp_runtime._preload"


def worker_config() -> dict[str, Any]:
    """Dask config that rank workers need; external clusters should set the same (env:
    ``DASK_DISTRIBUTED__WORKER__DAEMON=False``)."""
    from ddp_runtime.worker_config import NO_MALLOC_TRIM_KEY

    # The nannies of a local cluster run in this process and spawn their workers with this process's config.
    return {"distributed.worker.daemon": False, NO_MALLOC_TRIM_KEY: None}


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
    gpus: Sequence[str] | None = None,
) -> Iterator[Client]:
    """A LocalCluster on 127.0.0.1 with worker processes; yields a Client and closes both.

    ``start_method``: ``"forkserver"`` forks the workers from a server process that imported torch once per
    process (``_fork_server``), except on a host with GPUs, where they are spawned. ``"spawn"`` starts each
    worker as a new interpreter, as Dask does by default. A Dask config that says ``fork`` is kept.

    On a host with GPUs (``gpus``: the ``CUDA_VISIBLE_DEVICES`` entries to hand out; by default the host's,
    ``_gpus.visible_gpus``) the workers get GPUs of their own: one each (``{"GPU": k}`` in ``resources``: ``k``
    each), with their own ``CUDA_VISIBLE_DEVICES`` and that many ``GPU`` resources; ``n_workers`` defaults to
    at least one per GPU, and workers beyond the GPUs see none. ``resources`` asking for GPUs the host cannot
    give every worker is refused before any worker starts (``_gpus.GPUPlacementError``). Without GPUs,
    ``resources`` are advertised by every worker as given (a stand-in ``GPU`` resource too).
    """
    cores = os.cpu_count() or 1
    gpus = _gpus.visible_gpus() if gpus is None else list(gpus)
    per_worker = _gpus.check_room(n_workers or 0, resources, gpus) if gpus else 1
    n = n_workers or max(cores, len(gpus) // per_worker)
    # Every worker advertises its share of the host's cores as a "CPU" resource, so ScalingConfig's
    # resources_per_worker={"CPU": k} (cores for DataLoader workers) means the same here as on a real cluster.
    resources = {"CPU": float(max(1, cores // n)), **(resources or {})}
    start_config, nanny_kwargs = _fork_server.start_settings(start_method, gpus=len(gpus))
    if gpus:  # each worker its own GPU(s): its environment and GPU resource by its name (0, 1, ...)
        nanny_kwargs = {**nanny_kwargs, "pins": _gpus.pins(n, gpus, per_worker), "worker_class": _PinnedNanny}
        resources.pop("GPU", None)
    # The cluster reads the lost-worker timeout whenever a worker goes, and the start method whenever a nanny
    # starts one: they stay set while the cluster lives. Its workers never run this process's main module.
    with (
        dask.config.set({**worker_config(), **_LOST_WORKER_TIMEOUT, **start_config}),
        _compat.main_not_rerun_in(_compat.NANNY_WORKER_PROCESS_NAME),
    ):
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


class _PinnedNanny(Nanny):
    """A local cluster's nanny whose worker has GPUs of its own: ``pins[name]`` (its ``CUDA_VISIBLE_DEVICES``,
    ``""`` for none) in its environment, and that many ``GPU`` resources. A worker it restarts keeps them."""

    def __init__(
        self,
        *args: Any,
        pins: Sequence[str],
        name: Any = None,
        env: dict[str, str] | None = None,
        resources: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        pin = pins[name] if isinstance(name, int) and 0 <= name < len(pins) else ""
        env = _fork_server.with_variables(env or {}, _gpus.worker_environment(pin))
        resources = dict(resources or {})
        if pin:
            resources["GPU"] = float(len(pin.split(",")))
        super().__init__(*args, name=name, env=env, resources=resources, **kwargs)


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
    """GPUs this process may use: those ``nvidia-smi -L`` lists, narrowed to ``CUDA_VISIBLE_DEVICES`` when it is
    set (0 without the NVIDIA driver); torch is not imported."""
    return _gpus.gpu_count()


def visible_gpus() -> list[str]:
    """The GPUs a local cluster hands out, one ``CUDA_VISIBLE_DEVICES`` entry each: ``nvidia-smi -L``'s indices,
    or the entries of this process's own ``CUDA_VISIBLE_DEVICES`` when set (for a launcher pinning workers)."""
    return _gpus.visible_gpus()


@contextlib.contextmanager
def gpu_local_cluster(
    *, n_workers: int | None = None, resources: dict[str, float] | None = None, **kwargs: Any
) -> Iterator[Client]:
    """A local cluster of GPU workers: one per visible GPU by default, each pinned to its GPU(s) and
    advertising them as ``GPU`` resources (``local_cluster``; no dask-cuda). On a host without a GPU, or with
    too few for ``n_workers``, refused in one sentence before any worker starts."""
    resources = {"GPU": 1.0, **(resources or {})}
    gpus = _gpus.visible_gpus()
    if not gpus:
        raise _gpus.GPUPlacementError(
            "use_gpu=True asks a GPU per rank, but this machine has no GPU (nvidia-smi lists none, "
            f"{_gpus.VISIBLE}={os.environ.get(_gpus.VISIBLE)!r}) and no Dask cluster is connected: set "
            "use_gpu=False to train on CPUs, or give the address of a cluster whose workers have GPUs"
        )
    n = n_workers or max(1, len(gpus) // _gpus.gpus_per_worker(resources))
    with local_cluster(n_workers=n, resources=resources, gpus=gpus, **kwargs) as client:
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
            client = stack.enter_context(gpu_local_cluster(preload=preload))
        else:
            client = stack.enter_context(local_cluster(n_workers=n_workers, preload=preload))
        with object_store(client):
            yield client
