"""What runs on each Dask worker for one rank: device, rendezvous, process group, the user's function.

Nothing here raises into Dask: the outcome (finished, stopped, or the error with its traceback) is returned as
data, so the driver sees which rank failed and Dask never retries a rank on its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import inspect
import logging
import os
import re
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from distributed import Event, Queue, Variable, get_client, get_worker
from distributed.comm import get_address_host

from ddp_runtime import _compat, _group_end, _network, _warmup
from ddp_runtime.checkpoint import Checkpoint, RunStorage, _jsonable
from ddp_runtime.object_store import keeping_fetched
from ddp_runtime.session import StopTraining, TrainContext, _install, _Session

if TYPE_CHECKING:  # imported inside the functions that run on workers: drivers never need torch
    import torch

log = logging.getLogger(__name__)

STOP, CONTINUE = "stop", "continue"
# The same verdicts, asking rank 0 first for a checkpoint of the report they answer when its function offers one
# (``report(..., checkpoint_on_request=...)``); it sends the checkpoint back (``metrics`` None), then goes on.
CHECKPOINT_THEN_STOP, CHECKPOINT_THEN_CONTINUE = "checkpoint,stop", "checkpoint,continue"
STARTED = {"started": True}  # rank 0's first message on the report queue: the group is set up
_VERDICT_POLL_S = 1.0  # while waiting for a verdict, how often rank 0 checks that its driver still wants it

# The thread running each rank task in this worker process, by task key: when a group stops making progress,
# the driver asks for those threads' stacks (``rank_stacks``) to tell the hung rank from the ones waiting for it.
_RANK_THREADS: dict[str, int] = {}


@dataclass(frozen=True)
class RankSpec:
    """Everything one rank needs, decided by the driver."""

    group_id: str
    attempt: int
    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    backend: str
    use_gpu: bool
    cpus: float | None
    timeout_s: float
    rendezvous_timeout_s: float
    storage_path: str
    run_name: str
    storage_options: dict[str, Any] | None
    resume_from: Checkpoint | None
    next_checkpoint_index: int
    chdir: bool = True  # run the function in its trial directory (Ray: RAY_CHDIR_TO_TRIAL_DIR, default 1)

    @property
    def channel(self) -> str:
        return f"sweepflow-{self.group_id}-a{self.attempt}"


def reports_queue_name(channel: str) -> str:
    return f"{channel}-reports"


def verdicts_queue_name(channel: str) -> str:
    return f"{channel}-verdicts"


def rendezvous_variable_name(channel: str) -> str:
    return f"{channel}-rendezvous"


def _device(spec: RankSpec, worker_address: str) -> torch.device:
    import torch

    if not spec.use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"ScalingConfig(use_gpu=True) but Dask worker {worker_address} sees no CUDA device "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Start one worker per GPU "
            "(`CUDA_VISIBLE_DEVICES=<i> dask worker <scheduler> --resources GPU=1`), or use use_gpu=False."
        )
    # A GPU worker owns its device(s): a local cluster (``_gpus``), the stack and a pinned `dask worker` name only
    # them in CUDA_VISIBLE_DEVICES, so cuda:0 is this worker's own GPU, and a group's ranks (on distinct workers)
    # never share one.
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    return device


def _publish_rendezvous(channel: str, address: str) -> None:
    """Rank 0 publishes its store's address: a Dask Variable holds it, then a Dask Event of the same name says
    it is there (``_read_rendezvous``)."""
    name = rendezvous_variable_name(channel)
    Variable(name).set(address)
    Event(name).set()


def _read_rendezvous(channel: str, timeout_s: float) -> str:
    """The other ranks wait for rank 0's Event, then read its Variable (set before it: no wait).

    Not ``Variable.get(timeout=...)`` alone: on Python 3.10 the scheduler loses its wake-up when the set arrives
    while the get is starting to wait (distributed 2026.8: ``VariableExtension.get`` checks for the value, then
    waits on a Condition through ``asyncio.wait_for``, which on 3.10 starts the wait a loop turn later; a set in
    between notifies nobody), so the group failed after the rendezvous timeout (the 3.10 CI lane). Ranks start
    together, so that turn is often hit: 299 of 300 such get/set pairs timed out on 3.10, none on 3.11
    (``tests/ddp_runtime/test_rendezvous.py``). An Event keeps its state: set before the wait, the wait returns at once."""
    name = rendezvous_variable_name(channel)
    if not Event(name).wait(timeout=timeout_s):
        raise TimeoutError(
            f"rank 0 published no rendezvous address in {timeout_s:g} s (TorchConfig.rendezvous_timeout_s): "
            "its Dask worker is busy, slow to start, or gone"
        )
    return Variable(name).get(timeout=timeout_s)


def _init_process_group(spec: RankSpec, worker_address: str, device: torch.device) -> float:
    """Rank 0 opens a TCPStore on its Dask worker's address (which the other hosts reach: the scheduler does),
    on a port the OS picks, and publishes host:port (``_publish_rendezvous``); the other ranks read it
    (``_read_rendezvous``) and connect. No fixed port, so many groups share a cluster. gloo/NCCL then connect through the interface holding
    each rank's worker address (``_network``). Returns the seconds this rank spent on its worker's one-time
    start-up meanwhile (0.0 on a warm worker)."""
    import torch.distributed as dist

    store_timeout = timedelta(seconds=spec.rendezvous_timeout_s)
    if spec.world_rank == 0:
        host = get_address_host(worker_address)
        store, port = _compat.tcp_store_on_free_port(host, spec.world_size, store_timeout)
        _publish_rendezvous(spec.channel, f"{host}:{port}")
    else:
        address = _read_rendezvous(spec.channel, spec.rendezvous_timeout_s)
        host, port_text = address.rsplit(":", 1)
        port = int(port_text)
        store = dist.TCPStore(host, port, spec.world_size, False, timeout=store_timeout)
    # For user code that reads the usual torchrun variables. Safe: a multi-rank group owns its worker process.
    os.environ.update(
        MASTER_ADDR=host,
        MASTER_PORT=str(port),
        RANK=str(spec.world_rank),
        WORLD_SIZE=str(spec.world_size),
        LOCAL_RANK=str(spec.local_rank),
        LOCAL_WORLD_SIZE=str(spec.local_world_size),
        # gloo/NCCL connect through the interface holding this worker's address, not the host name's.
        **_network.socket_interface_env(spec.backend, get_address_host(worker_address)),
    )
    # Every rank joins the store first, bounded by the rendezvous timeout: gloo/NCCL start-up waits for its
    # peers under the process group's own (collective) timeout, so a peer slow to arrive (a worker restarted
    # and still importing torch, a busy host) would otherwise fail the group under TorchConfig.timeout_s with a
    # store-wait error that names nobody. Once all ranks are in, connecting takes milliseconds.
    # init_process_group touches torch._dynamo.trace_rules when torch._dynamo is in sys.modules, which it is
    # while the worker preload is still importing it in the background (seconds on a busy host): a cold worker
    # finishes its start-up here (the preload threads, then torch's lazy imports), before joining, not inside
    # init_process_group under the collective timeout; its driver takes that time out of the group's.
    startup_s = _warmup.warm_process(timeout_s=spec.rendezvous_timeout_s)
    store.set(f"joined/{spec.world_rank}", "1")
    store.wait([f"joined/{rank}" for rank in range(spec.world_size)], store_timeout)
    dist.init_process_group(
        spec.backend,
        store=store,
        rank=spec.world_rank,
        world_size=spec.world_size,
        timeout=timedelta(seconds=spec.timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    return startup_s


class _Rank0Link:
    """Rank 0's link to the driver: reports out, verdicts back, through two Dask queues the driver created.

    Opening a queue handle is a round trip to the scheduler, so both are opened in the background while the
    training function sets up (model, data) instead of before it starts; the first report waits for them.

    Side messages (``post``: e.g. the trial's system metrics, from another thread) cost no round trip of their
    own: they go with the next report, or with the rank's result when it ends; when the oldest has waited
    ``flush_after_s`` for a report, the next post sends them alone (answered like a report: none is lost at the
    group's end)."""

    def __init__(self, spec: RankSpec) -> None:
        self._timeout_s = spec.timeout_s
        self._queues: dict[str, Any] = {}
        # One message at a time awaits its verdict: a report, or side messages sent alone.
        self._sending = threading.Lock()
        self._side_lock = threading.Lock()
        self._side: list[Any] = []
        self._side_since: float | None = None  # when the oldest unsent side message was posted (monotonic)
        self._worker = get_worker()
        self._key = self._worker.get_current_task()
        client = get_client()

        def open_queues() -> None:
            try:
                self._queues["reports"] = Queue(reports_queue_name(spec.channel), client=client)
                # Rank 0 is in the training function, so every rank has joined the process group: the
                # driver's clock for TorchConfig.hang_timeout_s starts here, set-up time excluded.
                self._queues["reports"].put(STARTED)
                self._queues["verdicts"] = Queue(verdicts_queue_name(spec.channel), client=client)
            except BaseException as exc:  # noqa: BLE001 - raised by the first report, in the rank's thread
                self._queues["error"] = exc

        self._opener = threading.Thread(target=open_queues, name=f"{spec.channel}-open", daemon=True)
        self._opener.start()

    def send(
        self,
        metrics: dict[str, Any] | None,
        checkpoint: Checkpoint | None,
        *,
        checkpoint_follows: bool = False,
    ) -> tuple[bool, bool]:
        """Send one report (``metrics`` None: the report's checkpoint, sent after its metrics) and the side
        messages posted since the last; returns whether the driver asks the group to stop, and whether it asks
        for a checkpoint of the report. ``checkpoint_follows``: the report's checkpoint comes in a later message
        (a multi-rank group's, committed once every rank stored its files)."""
        with self._sending:
            return self._send(metrics, checkpoint, checkpoint_follows)

    def post(self, payload: Any, *, flush_after_s: float) -> None:
        """Queue a side message for the driver (any thread); it goes with the next report, or now, alone, when
        the oldest waiting has waited ``flush_after_s`` (the caller's thread then waits for the driver's answer)."""
        with self._side_lock:
            self._side.append(payload)
            if self._side_since is None:
                self._side_since = time.monotonic()
            due = time.monotonic() - self._side_since >= flush_after_s
        if due:
            with self._sending:
                if self._side:  # a report may have taken them meanwhile
                    self._send(None, None)

    def take_side(self) -> list[Any]:
        """The side messages not sent yet (for the rank's result, at its end)."""
        with self._side_lock:
            side, self._side, self._side_since = self._side, [], None
        return side

    def _send(
        self, metrics: dict[str, Any] | None, checkpoint: Checkpoint | None, checkpoint_follows: bool = False
    ) -> tuple[bool, bool]:
        self._opener.join()
        if "error" in self._queues:
            raise RuntimeError(f"rank 0 could not reach the driver's report queue: {self._queues['error']}")
        message: dict[str, Any] = {
            "metrics": _jsonable(metrics) if metrics is not None else None,
            "checkpoint": checkpoint.path if checkpoint else None,
        }
        if checkpoint_follows:
            message["checkpoint_follows"] = True
        side = self.take_side()
        if side:
            message["side"] = side
        self._queues["reports"].put(message)
        # The driver answers at once. If it died instead (its process was killed), Dask cancels this task but
        # cannot stop its thread: notice that, and stop, so the worker is not held until the timeout.
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                verdict = self._queues["verdicts"].get(timeout=_VERDICT_POLL_S)
                stop = verdict in (STOP, CHECKPOINT_THEN_STOP)
                return stop, verdict in (CHECKPOINT_THEN_STOP, CHECKPOINT_THEN_CONTINUE)
            except TimeoutError:
                if self._abandoned():
                    raise StopTraining() from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no verdict from the driver within TorchConfig.timeout_s={self._timeout_s:g} s"
                    ) from None

    def _abandoned(self) -> bool:
        """Whether the driver gave this rank's task up (cancelled it, or its client went away)."""
        return _compat.task_abandoned(self._worker, self._key)

    def close(self) -> None:
        """Drop this rank's references to the queues (the scheduler frees them once the driver's go too)."""
        self._opener.join()
        for name in ("reports", "verdicts"):
            if name in self._queues:
                self._queues[name].close()


def _call(train_fn: Callable[..., Any], config: dict[str, Any] | None) -> None:
    params = [
        p
        for p in inspect.signature(train_fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(params) > 1:
        raise TypeError(
            f"train_loop_per_worker {getattr(train_fn, '__name__', train_fn)!r} must take zero arguments or one "
            f"(the train_loop_config dict), it takes {len(params)}"
        )
    if params:
        train_fn(config if config is not None else {})
    else:
        train_fn()  # as in Ray, a zero-argument function simply does not see train_loop_config


def _trial_dir(spec: RankSpec, local_directory: str) -> str:
    """The trial's local directory on this worker (Ray's trial directory; ``get_context().get_trial_dir()``):
    one per trial (its checkpoint storage), kept for its later groups on this worker, in the worker process's
    scratch space, which Dask deletes when the worker closes. Ranks never share one: a group's ranks run in
    distinct worker processes, each with its own scratch space."""
    digest = hashlib.sha1(f"{spec.storage_path}\0{spec.run_name}".encode()).hexdigest()[:12]
    directory = os.path.join(local_directory, "trials", f"trial-{digest}")
    os.makedirs(directory, exist_ok=True)
    return directory


_CLONE_FS = 0x00000200  # <linux/sched.h>: a thread's filesystem attributes (current directory, root, umask)
_warned_shared_cwd = False


def _own_cwd_for_this_thread() -> bool:
    """Give the calling thread a current directory of its own (Linux: ``unshare(CLONE_FS)``; the threads and
    processes it then starts inherit it). The thread keeps it for life: a pool thread that runs other tasks
    later has it back where it was. False where that is not possible: another OS, or a seccomp profile that
    forbids ``unshare`` (Docker's default does, without CAP_SYS_ADMIN)."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).unshare(_CLONE_FS) == 0


@contextlib.contextmanager
def _working_in(directory: str, *, own_process: bool, enabled: bool = True) -> Iterator[None]:
    """Run the block in ``directory``, then go back: Ray runs each trial in its trial directory, so its
    examples write to relative paths ("my_model/"), which concurrent trials sharing a cwd would overwrite.

    The current directory belongs to the whole process. With ``own_process`` (a nanny's worker process with
    one task thread: this rank is the only task in it) changing it is safe: what else runs there is Dask's own
    threads and the worker's preloads, which use absolute paths (its scratch space, and sys.path, where
    multiprocessing resolves ''). Otherwise other tasks run beside this rank (two one-rank trials on a worker
    with several threads, or a worker in the client's process): the rank's thread gets a current directory of
    its own first, or, where it cannot, the rank stays where it is, with a warning."""
    global _warned_shared_cwd
    if not enabled:
        yield
        return
    if not own_process and not _own_cwd_for_this_thread():
        if not _warned_shared_cwd:
            _warned_shared_cwd = True
            log.warning(
                "trials run in this worker's working directory %s, not each in its own (%s): this worker runs "
                "several tasks at once and cannot give one thread a directory of its own; start workers with "
                "--nthreads 1 (one rank per worker process), or write to get_context().get_trial_dir()",
                os.getcwd(),
                directory,
            )
        yield
        return
    try:
        previous = os.getcwd()
    except FileNotFoundError:  # the worker was started in a directory deleted since: go back to its parent's
        previous = None
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(previous if previous is not None else os.path.dirname(os.path.abspath(directory)))


def _context(spec: RankSpec, device: Any, trial_dir: str) -> TrainContext:
    """The rank's ``TrainContext``."""
    return TrainContext(
        world_rank=spec.world_rank,
        world_size=spec.world_size,
        local_rank=spec.local_rank,
        local_world_size=spec.local_world_size,
        node_rank=spec.node_rank,
        device=device,
        experiment_name=spec.run_name,
        trial_dir=trial_dir,
    )


def run_rank(train_fn: Callable[..., Any], config: dict[str, Any] | None, spec: RankSpec) -> dict[str, Any]:
    """The Dask task of one rank. Returns {"rank", "status": finished|stopped|error, "traceback"?, ...}; on a
    worker that was cold, also ``startup_s`` (seconds of its one-time start-up this rank waited for: imports)
    and ``ready_at`` (when it was done: time.time())."""
    entered = time.perf_counter()
    cold = not _warmup.is_warm()
    import torch
    import torch.distributed  # noqa: F401 - part of the import time measured next

    imports_s = time.perf_counter() - entered  # torch's own import, on a worker no preload warmed

    worker = get_worker()
    worker_address = worker.address
    task_key = str(worker.get_current_task())
    _RANK_THREADS[task_key] = threading.get_ident()
    initialised = False
    link: _Rank0Link | None = None
    outcome: dict[str, Any] = {"rank": spec.world_rank, "worker": worker_address}
    try:
        device = _device(spec, worker_address)
        if spec.cpus:
            torch.set_num_threads(max(1, int(spec.cpus)))
        if spec.world_size > 1:
            startup_s = _init_process_group(spec, worker_address, device)
            initialised = True
        else:
            startup_s = _warmup.warm_process(timeout_s=spec.rendezvous_timeout_s)
        if cold:
            outcome.update(startup_s=imports_s + startup_s, ready_at=time.time())
        storage = RunStorage(spec.storage_path, spec.run_name, spec.storage_options)
        trial_dir = _trial_dir(spec, worker.local_directory)
        link = _Rank0Link(spec) if spec.world_rank == 0 else None
        _install(
            _Session(
                context=_context(spec, device, trial_dir),
                storage=storage,
                resume_from=spec.resume_from,
                next_index=spec.next_checkpoint_index,
                send_report=link.send if link is not None else None,
                post_side=link.post if link is not None else None,
                group_id=spec.group_id,
            )
        )
        outcome["started_at"] = time.time()
        alone = _compat.runs_alone_in_its_process(worker)
        # What it gets from the object store (ddp_runtime.get, once a batch in Ray's examples) is fetched once.
        with _working_in(trial_dir, own_process=alone, enabled=spec.chdir), keeping_fetched():
            _call(train_fn, config)
        outcome["status"] = "finished"
    except StopTraining:
        outcome["status"] = "stopped"
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the driver with its traceback
        outcome.update(
            status="error",
            error_type=type(exc).__name__,
            message=str(exc),
            traceback=traceback.format_exc(),
            time=time.time(),  # the earliest failure of a group is its root cause; the others are fallout
        )
    finally:
        outcome["ended_at"] = time.time()
        _RANK_THREADS.pop(task_key, None)
        _install(None)
        if link is not None:
            link.close()
            side = link.take_side()  # posted since the last report, e.g. the last system-metrics sample
            if side:
                outcome["side"] = side
        if initialised:
            _group_end.destroy_process_group()
    return outcome


# ------------------------------------------------------------------------------------------- hung-rank stacks

# Frames where a rank waits for its peers: torch.distributed's collectives, DDP (its forward may broadcast
# buffers), autograd (a DDP backward waits there for the gradient all-reduce) and our report barrier.
_WAITING_FILES = re.compile(r"[/\\]torch[/\\](distributed|nn[/\\]parallel|autograd)[/\\]")
_SESSION_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "session.py")


def _zone_of(path: str, function: str) -> str:
    """``waiting`` (where a rank waits for its peers), ``library`` (torch, Dask, ddp_runtime, the standard
    library) or ``user`` (everything else: the training function and the packages it calls)."""
    import distributed
    import torch

    if _WAITING_FILES.search(path) or (path == _SESSION_FILE and function == "report"):
        return "waiting"
    runtime = [os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, distributed)]
    if any(path.startswith(d) for d in (*runtime, os.path.dirname(_SESSION_FILE) + os.sep)):
        return "library"
    paths = sysconfig.get_paths()
    # On a system-wide Python the installed packages live inside the standard library's directory.
    installed = (paths["purelib"] + os.sep, paths["platlib"] + os.sep)
    if path.startswith(paths["stdlib"] + os.sep) and not path.startswith(installed):
        return "library"
    return "user"


def rank_stacks(keys: list[str], dask_worker: Any = None) -> dict[str, list[tuple[str, int, str, str, str]]]:
    """Run on a worker (``client.run``): the current Python stack of each of these rank tasks running here.

    Each stack is a list of ``(file, line, function, source, zone)``, innermost frame last, starting at the
    training function (or at ``run_rank`` while the rank is still setting up); ``zone`` is ``waiting`` for
    frames where a rank waits for its peers (a collective, DDP, autograd, ``report``), ``library`` for the
    rest of torch, Dask, ddp_runtime and the standard library, else ``user``.
    """
    frames = sys._current_frames()  # documented in sys; the only way to see another thread's stack
    stacks: dict[str, list[tuple[str, int, str, str, str]]] = {}
    for key in keys:
        frame = frames.get(_RANK_THREADS.get(key, -1))
        if frame is None:
            continue  # not running here (finished, or never started)
        summary = traceback.extract_stack(frame)
        # Drop Dask's thread-pool frames above run_rank, and run_rank's own once the user's function runs.
        names = [(f.filename == __file__, f.name) for f in summary]
        start = names.index((True, "run_rank")) if (True, "run_rank") in names else 0
        if (True, "_call") in names:
            start = names.index((True, "_call")) + 1
        stacks[key] = [
            (
                f.filename,
                f.lineno or 0,
                f.name,
                (f.line or "").strip(),
                _zone_of(os.path.abspath(f.filename), f.name),
            )
            for f in summary[start:]
        ]
    return stacks
