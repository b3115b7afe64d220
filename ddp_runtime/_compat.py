"""Every place ddp_runtime relies on Dask's or torch's internals, or on behaviour they do not document.

Each reliance is one function here, saying what it works around, the version it was written against and what
to do when it breaks; ``tests/repo/test_compat.py`` has a test per function that fails when the library changes
what we rely on. Upgrading Dask or torch: run ``pytest tests/repo/test_compat.py`` first.

Nothing here imports torch at module level: the driver side of ddp_runtime (and the flow process) never
imports it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import queue
from collections.abc import Callable, Hashable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch.distributed
    from distributed import Client, Future, Worker
    from distributed.scheduler import Scheduler, WorkerState

T = TypeVar("T")

# ------------------------------------------------------------------------------------------ distributed: scheduler


def scheduler_singleton(scheduler: Scheduler, name: str, create: Callable[[], T]) -> T:
    """One object per scheduler process under ``name``, made by ``create()`` on first use.

    Works around: Dask has no public per-scheduler store for code run with ``Client.run_on_scheduler``; the gang
    scheduler keeps its reservations in ``Scheduler.extensions``, the (undocumented) dict where the scheduler
    keeps its own extensions. Written for distributed 2026.8. If it breaks: keep the object in a module-level
    dict keyed by ``id(scheduler)`` instead (the scheduler runs in one process), or register a real
    ``SchedulerPlugin`` and find it in ``Scheduler.plugins``.
    """
    value = scheduler.extensions.get(name)
    if value is None:
        value = scheduler.extensions[name] = create()
    return value


def running_workers(scheduler: Scheduler) -> list[WorkerState]:
    """The scheduler's workers that accept tasks (status ``running``; not paused, closing or retiring).

    Relies on: ``Scheduler.workers`` (address -> ``WorkerState``) and ``WorkerState.status`` being a
    ``distributed.core.Status`` enum member — scheduler internals (documented only as "scheduling state"). The
    gang scheduler also reads ``WorkerState.nthreads``, ``.resources``, ``.host`` and ``.address`` directly.
    Written for distributed 2026.8. If it breaks: read the same from ``Scheduler.identity()["workers"]``
    (``status`` is its name there).
    """
    return [
        ws for ws in scheduler.workers.values() if getattr(ws.status, "name", str(ws.status)) == "running"
    ]


def has_worker(scheduler: Scheduler, address: str) -> bool:
    """Whether a worker with this address is still connected (not killed, lost or retired).

    Relies on ``Scheduler.workers`` being keyed by worker address (written for distributed 2026.8). If it
    breaks: ``address in scheduler.identity()["workers"]``.
    """
    return address in scheduler.workers


def processing_keys(ws: WorkerState) -> list[Hashable]:
    """Keys of the tasks the scheduler has assigned to this worker and not yet seen end.

    Relies on ``WorkerState.processing`` being a collection of ``TaskState`` objects with a ``.key`` (a dict
    keyed by them until distributed 2023.4, a set since; written for 2026.8). The gang scheduler counts the
    thread slots of tasks that are not rank tasks through it. If it breaks: see what ``WorkerState`` holds
    now (``distributed/scheduler.py``) and adapt; the test shows what is expected.
    """
    return [ts.key for ts in ws.processing]


def used_resources(ws: WorkerState) -> dict[str, float]:
    """Abstract resources (``GPU``, ``CPU``) held on this worker by tasks submitted with ``resources=``.

    Relies on ``WorkerState.used_resources`` (scheduler internals; written for distributed 2026.8), which Dask
    keeps up to date as such tasks start and end. The gang scheduler adds its own reservations on top. If it
    breaks: sum ``ts.resource_restrictions`` over ``ws.processing``.
    """
    return dict(ws.used_resources)


def task_left_its_worker(start: str, finish: str) -> bool:
    """For ``SchedulerPlugin.transition(key, start, finish)``: has the task stopped running on its worker?

    Relies on: every way a running task ends — it returns, raises, is cancelled by its client (or the client
    goes away), or its worker dies — is a transition *out of* ``processing`` on the scheduler (to ``memory``,
    ``erred``, ``released``, ``no-worker``...). The hook is public; which states it passes through is not.
    Written for distributed 2026.8. If it breaks (a reservation then never ends by itself): the test lists the
    transitions seen now; match the new state names here.
    """
    return start == "processing"


# ------------------------------------------------------------------------------------------- distributed: worker


def task_abandoned(worker: Worker, key: Hashable) -> bool:
    """Run on a worker, from the thread of task ``key``: has its client given it up (cancelled, or gone)?

    Works around: Dask cannot stop a running task's thread, and offers no public "was I cancelled?" call. The
    worker's state machine (``Worker.state.tasks``, ``TaskState.state``, internals) marks such a task
    ``cancelled`` (or drops it). Written for distributed 2026.8. If it breaks (ranks of a killed driver then
    hold their workers until ``TorchConfig.timeout_s``): find the state the worker gives a cancelled executing
    task now (the test prints it) and match it here.
    """
    task = worker.state.tasks.get(key)
    return task is None or task.state in ("cancelled", "released", "forgotten")


def runs_alone_in_its_process(worker: Worker) -> bool:
    """Whether this worker's process runs one task at a time and nothing else: a nanny's worker process (one
    worker per process, apart from the client's) with one task thread.

    Relies on ``Worker.nanny`` (the nanny's address; None for a worker started without one, e.g. in the
    client's process) and ``Worker.state.nthreads`` (the task thread count, which Dask keeps in the worker's
    state machine, an internal). Written for distributed 2026.8. If it breaks (ranks then keep per-trial working
    directories by the per-thread fallback, or not at all): read the thread count from
    ``worker.executor._max_workers`` or the ``--nthreads`` the worker was started with.
    """
    return worker.nanny is not None and worker.state.nthreads == 1


# ------------------------------------------------------------------------------------------- distributed: client


def scheduler_address(client: Client) -> str:
    """The address of the scheduler this client is connected to, without a round trip.

    Relies on ``Client.scheduler`` (the client's rpc to the scheduler, undocumented) having ``.address``.
    Written for distributed 2026.8. If it breaks: ``client.scheduler_info()["address"]`` (one round trip).
    """
    return client.scheduler.address


def client_singleton(client: Client, name: str, create: Callable[[], T]) -> T:
    """One object per client under ``name``, made by ``create()`` on first use.

    Works around: Dask has no documented place for per-client state of a library; the driver keeps its own in
    ``Client.extensions``, the (undocumented) dict where the client keeps its extensions (``pubsub``). Written
    for distributed 2026.8. If it breaks: keep the object in a ``weakref.WeakKeyDictionary`` keyed by the client.
    """
    value = client.extensions.get(name)
    if value is None:  # setdefault: threads sharing the client (concurrent trials) all get the first one made
        value = client.extensions.setdefault(name, create())
    return value


def future_of_key(client: Client, key: str) -> Future:
    """A future for a key another client computed (``ddp_runtime.get`` on a worker: the object's key, which an
    ``ObjectRef`` carries alone), that resolves like one of ``client``'s own.

    Works around: ``Future(key, client)`` only registers the key with the client; the scheduler is not told
    that the client wants it, so it never reports the key's state and ``result()`` waits forever. Dask's own
    ``Variable.get`` sends the client's ``client-desires-keys`` message itself (``Client._send_to_scheduler``,
    undocumented). Written for distributed 2026.8. If it breaks: ``client.publish_dataset`` the future where it
    is made and ``client.get_dataset`` it here.
    """
    from distributed import Future

    future = Future(key, client)
    client._send_to_scheduler({"op": "client-desires-keys", "keys": [key]})
    return future


# ------------------------------------------------------------------------------------------------------ torch


def tcp_store_on_free_port(
    host: str, world_size: int, timeout: timedelta
) -> tuple[torch.distributed.TCPStore, int]:
    """A master ``TCPStore`` listening on a port the OS picks on ``host``, and that port.

    Relies on (undocumented): ``TCPStore(host, 0, ..., is_master=True)`` binds a free port, and
    ``TCPStore.port`` returns the one bound. That lets many groups rendezvous on one host with no fixed port
    and no pick-then-bind race. Written for torch 2.14. If it breaks: bind a socket to port 0, read its port,
    close it and pass that port (a small race with other processes), or use ``torch.distributed.FileStore`` on
    shared storage.
    """
    import torch.distributed as dist

    store = dist.TCPStore(host, 0, world_size, True, timeout=timeout, wait_for_workers=False)
    return store, store.port


#: The name of a worker preload's background import thread (e.g. ``sweepflow.tasks.worker_preload``'s): a worker's
#: one-time start-up (``_warmup``) waits for every thread whose name starts so before its first rank trains.
PRELOAD_THREAD_NAME = "sweepflow-preload"


#: What a process's first optimizer and first ``DistributedDataParallel(...)`` import lazily (``warm_torch_imports``).
TORCH_LAZY_IMPORTS = ("torch._dynamo", "torch.nn.parallel")


def warm_torch_imports() -> None:
    """Import what a process's first optimizer and first ``DistributedDataParallel(...)`` import lazily.

    Works around: ``torch.optim.Optimizer.__init__`` and DDP's constructor pull in ``torch._dynamo`` (a private
    module; 2-5 CPU-seconds, it imports sympy), so the first rank on a fresh worker would pay for it inside its
    trial's time (a one-rank trial too: it builds an optimizer); the worker's one-time start-up
    (``_warmup.warm_process``) imports it instead. Written for torch 2.14. If it breaks (the import fails, or
    neither imports it any more): import what they import now (the test shows it), or drop the warm-up — it only
    saves start-up time.
    """
    for module in TORCH_LAZY_IMPORTS:
        importlib.import_module(module)


def set_fork_server_imports(modules: Sequence[str]) -> None:
    """Make ``modules`` what multiprocessing's fork server imports when it starts: a local cluster whose Dask
    config says ``distributed.worker.multiprocessing-method: forkserver`` forks its worker processes from it.

    Works around: Dask's ``distributed.utils.get_mp_context`` (each nanny calls it when it starts a worker) sets
    the fork server's list itself the first time it is called with that method, once per process (its module
    global ``_forkserver_preload_set``), and to build it imports its optional packages in the calling process
    (numpy, pandas, pyarrow: ~60 MiB in a process that had none of them). Setting that global first keeps our
    list and skips those imports. The list counts until the fork server starts (with the first worker) and is
    then fixed for the process's life. Written for distributed 2026.8. If it breaks (the global goes, or Dask
    sets its list at every call): call ``get_mp_context`` under the forkserver config first and set the list
    after it, paying those imports; or drop the list (workers then import torch themselves).
    """
    import multiprocessing

    import distributed.utils

    distributed.utils._forkserver_preload_set = True
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(modules))


# ------------------------------------------------------------------------------------------------- the stdlib


def use_the_platforms_start_method() -> str | None:
    """Make multiprocessing's default start method in this process the one a fresh interpreter on this OS has
    (``fork`` on Linux before Python 3.14), as in the plain process a training loop was written for; returns
    the method it was before (None: already the platform's).

    Works around: a child multiprocessing starts with ``forkserver`` or ``spawn`` (a Dask worker, which the
    nanny starts so) has its parent's method set as its default (``multiprocessing.spawn.prepare`` calls
    ``set_start_method``). A ``DataLoader(num_workers=2)`` in a rank then started each of its worker processes
    through a fork server of its own, which imports torch and the user's modules again, at every
    ``iter(dataloader)``: 4-6 CPU-seconds an epoch where Ray's actors, and a plain process, fork in
    milliseconds (issue 66: Ray's PBT DCGAN example at 3.4x Ray's time). Called once, when the worker starts
    (``_preload.dask_setup``), for the worker's life. The platform's method is read from
    ``multiprocessing.context._default_context._default_context`` (private CPython API, the context the module
    was created with, Python 3.4 to 3.14) and set with the public ``set_start_method(force=True)``. Written for
    Python 3.11. If it breaks (that attribute goes): use ``"fork"`` on Linux below Python 3.14.
    """
    import multiprocessing
    import multiprocessing.context

    fresh = getattr(
        getattr(multiprocessing.context._default_context, "_default_context", None), "_name", None
    )
    previous = multiprocessing.get_start_method(allow_none=True)
    if fresh is None or previous in (None, fresh):
        return None
    multiprocessing.set_start_method(fresh, force=True)
    return previous


def run_atexit_handlers_when_the_process_ends() -> None:
    """Have this process run its ``atexit`` handlers when it ends, in a process that would skip them: a child of
    multiprocessing's fork server, which ends with ``os._exit`` once its target returned.

    Works around: that ``os._exit``. The handlers run as one of multiprocessing's own exit finalizers (its
    ``util.Finalize`` with a negative priority: after the others, once the process's children were joined), by
    ``atexit._run_exitfuncs``, private CPython API (stable since Python 3.0). Written for Python 3.11. If it
    breaks: keep a list of our own exit callbacks and run it from the worker's ``dask_teardown``.
    """
    import atexit
    from multiprocessing import util

    util.Finalize(None, atexit._run_exitfuncs, exitpriority=-100)


#: The name Dask's nanny gives the worker process it starts (``distributed.nanny.WorkerProcess.start``), which
#: ``main_not_rerun_in`` is given: written for distributed 2026.8 (the test reads it in a worker).
NANNY_WORKER_PROCESS_NAME = "Dask Worker process (from Nanny)"

#: How many live local clusters keep the parent's ``__main__`` out of processes of each name (``main_not_rerun_in``).
_MAIN_KEPT_FROM: dict[str, int] = {}


@contextlib.contextmanager
def main_not_rerun_in(process_name: str) -> Iterator[None]:
    """While in the block, the processes named ``process_name`` that multiprocessing starts (``spawn`` or
    ``forkserver``) do not run this process's main module first: they start as a child of an interactive session
    would, and what they run travels by value (cloudpickle), as it does to a cluster of other machines.

    Works around: multiprocessing hands each such child the main module's ``__spec__`` name or ``__file__``
    (``multiprocessing.spawn.get_preparation_data``: ``init_main_from_name`` / ``init_main_from_path``), and the
    child runs that module as ``__mp_main__`` before its target. A script without an ``if __name__ ==
    "__main__":`` guard then starts its cluster again inside every worker (which multiprocessing refuses: the
    nanny fails to start), and ``python - < script`` sends ``<stdin>`` as a path. Here the preparation data of
    the processes of that name leave both out (a wrapper of ``get_preparation_data``, which the spawn and
    fork-server launchers look up on the module at every start; other processes are untouched). Written for
    Python 3.11. If it breaks (the keys or the function change): leave the keys out under their new names, or
    start the workers with ``start_method="spawn"`` from a main module without ``__file__`` (``python -c``).
    """
    from multiprocessing import spawn

    if not hasattr(spawn.get_preparation_data, "__wrapped__"):
        original = spawn.get_preparation_data

        @functools.wraps(original)
        def get_preparation_data(name: str) -> dict[str, Any]:
            data = original(name)
            if _MAIN_KEPT_FROM.get(name):
                data.pop("init_main_from_name", None)
                data.pop("init_main_from_path", None)
            return data

        spawn.get_preparation_data = get_preparation_data
    _MAIN_KEPT_FROM[process_name] = _MAIN_KEPT_FROM.get(process_name, 0) + 1
    try:
        yield
    finally:
        _MAIN_KEPT_FROM[process_name] -= 1


def queued_items(q: queue.Queue[T]) -> list[T]:
    """What is waiting in ``q``, without taking it out.

    Relies on ``queue.Queue.queue`` (the deque) and ``queue.Queue.mutex`` (its lock): CPython attributes the
    docs do not mention. If they go: keep a separate counter of queued items next to the queue.
    """
    with q.mutex:
        return list(q.queue)


__all__ = [
    "NANNY_WORKER_PROCESS_NAME",
    "TORCH_LAZY_IMPORTS",
    "client_singleton",
    "has_worker",
    "main_not_rerun_in",
    "processing_keys",
    "queued_items",
    "run_atexit_handlers_when_the_process_ends",
    "running_workers",
    "runs_alone_in_its_process",
    "scheduler_address",
    "scheduler_singleton",
    "set_fork_server_imports",
    "task_abandoned",
    "task_left_its_worker",
    "tcp_store_on_free_port",
    "used_resources",
    "warm_torch_imports",
]
