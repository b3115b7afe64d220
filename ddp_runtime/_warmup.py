"""A worker process's one-time start-up, kept apart from any group's time.

A fresh Dask worker pays once for what its first rank needs: torch's lazy imports (``torch._dynamo``, pulled in
by the first optimizer a rank builds, ``torch.optim.Optimizer.__init__``, and by the first
``DistributedDataParallel(...)``: ~2-8 s on a small machine, more on a busy one), the
imports worker preloads started in background threads (any thread named ``sweepflow-preload...``, e.g. a
pipeline's training-code imports), and the training function's module.
Charged to the first group, that start-up made a cold cluster's first trial look three times as long as it
trained and hold most of a sweep's worker-seconds.

Two ways in, one state per process (``warm_process``):

- before any group (``cluster.warm_up_workers``, e.g. a sweep before its first trial): every capable worker
  does its start-up in a thread of its own, beside whatever it runs, and the caller reports the time apart;
- inside a rank (``_worker.run_rank``), for a worker that is still cold when its rank arrives (a replacement
  of a worker killed after a failed group, a worker that joined later): the rank does the rest of the
  start-up first, and its driver takes those seconds out of the group's held time (``Result.startup_s``).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

from ddp_runtime import _compat

_lock = threading.Lock()
_done = {"base": False, "torch": False}  # preload threads joined / torch's lazy imports done, in this process


def is_warm() -> bool:
    """Whether this process has done its start-up."""
    return _done["base"] and _done["torch"]


def _preload_threads() -> list[threading.Thread]:
    me = threading.current_thread()
    return [
        t for t in threading.enumerate() if t.name.startswith(_compat.PRELOAD_THREAD_NAME) and t is not me
    ]


def warm_process(*, timeout_s: float, prepare: Callable[[], None] | None = None) -> float:
    """Do this process's one-time start-up unless it is done: wait for the preload threads (at most
    ``timeout_s``), then torch's lazy imports (a rank's first optimizer and first DDP), then ``prepare()`` (the
    caller's own, e.g. importing the training function's module). Returns the seconds this call spent because
    the process was cold (0.0 when it was warm). Threads that arrive meanwhile wait for the one doing it.

    Imports only once the preload threads are joined: importing a module they are importing can deadlock on the
    module locks. If they are still running after ``timeout_s``, the process stays cold (the next caller waits
    for the rest) and torch's lazy imports are left to the first rank that needs them.
    """
    started = time.perf_counter()
    cold = not is_warm()
    deadline = time.monotonic() + timeout_s
    if cold or prepare is not None:
        if not _lock.acquire(timeout=max(timeout_s, 0.0)):
            return time.perf_counter() - started
        try:
            if not _done["base"]:
                for thread in _preload_threads():
                    thread.join(max(deadline - time.monotonic(), 0.0))
                _done["base"] = not any(t.is_alive() for t in _preload_threads())
            if _done["base"] and not _done["torch"]:
                _compat.warm_torch_imports()
                _done["torch"] = True
            if prepare is not None:
                prepare()
            if cold:
                _freeze_what_is_loaded()
        finally:
            _lock.release()
    return time.perf_counter() - started if cold or prepare is not None else 0.0


def _freeze_what_is_loaded() -> None:
    """Take what the start-up loaded (torch, Dask, the preloads' modules: ~230,000 objects in a pipeline's worker)
    out of the garbage collector's walks for the process's life. Each full collection walked all of them: 0.22 s
    in such a worker, 0.2 ms once frozen (measured with ``gc.collect()`` on the 2-core machine); a worker's first
    trial (its lazy imports and first allocations) triggered several. Collected once first, so nothing already
    garbage is kept."""
    gc.collect()
    gc.freeze()


def _warm_in_thread(payload: bytes | None, timeout_s: float, answer: dict[str, Any]) -> None:
    try:
        prepare = None
        if payload is not None:
            import cloudpickle

            # Unpickled here, not on the worker's event loop: it may import the user's modules.
            prepare = cloudpickle.loads(payload)
        answer["seconds"] = warm_process(timeout_s=timeout_s, prepare=prepare)
    except BaseException as exc:  # noqa: BLE001 - told to the caller, who goes on: a rank pays what is left
        answer["error"] = f"{type(exc).__name__}: {exc}"


async def warm_worker(payload: bytes | None, timeout_s: float) -> float | str:
    """Run on a worker (``client.run``): its start-up, in a thread of its own (the worker's task threads may be
    busy with another group's ranks; its event loop must keep answering). Returns the seconds it took (about
    0.0 when it was warm), or why it did not finish (an error, or still going after ``timeout_s``: a rank waits for the
    rest)."""
    answer: dict[str, Any] = {}
    thread = threading.Thread(
        target=_warm_in_thread,
        args=(payload, timeout_s, answer),
        name="ddp-runtime-warm-up",
        daemon=True,
    )
    started = time.monotonic()
    thread.start()
    while thread.is_alive() and time.monotonic() - started < timeout_s + 1.0:
        await asyncio.sleep(0.02)
    if "seconds" in answer:
        return float(answer["seconds"])
    return answer.get("error") or f"still starting up after {timeout_s:g} s"
