"""Ray's object store on Dask: ``put`` / ``get`` / ``wait`` and ``ObjectRef`` (Ray: ``ray.put``, ``ray.get``,
``ray.wait``, ``ray.ObjectRef``).

    import ddp_runtime as ray               # or: from ddp_runtime import put, get, wait

    model_ref = ray.put(model)               # in the driver, before tune.run / TorchTrainer.fit
    ...
    model = ray.get(config["model_ref"])     # in a trainable or a rank, on any Dask worker

How an object lives:

* ``put`` pickles the value at once (later changes to the object are not seen, as with Ray) and keeps the bytes
  in this process. When a Dask client is current (the default client in the driver, the worker's client on a
  worker) it places the object on that cluster now; in any case every ``object_store`` scope places it on its
  cluster when the scope opens. Every experiment (``tune.run``, ``Tuner.fit``, the training pipeline) and every
  ``TorchTrainer.fit`` is such a scope: a driver's ``put`` before the experiment starts its cluster is placed
  on that cluster when it does.
* On the cluster the object is the result of a tiny Dask task whose argument is the pickled value (not
  ``client.scatter``): **lineage, not re-put**. The scheduler keeps that task's argument, so when the worker
  holding the object dies or is restarted, Dask runs the task again on another worker and the object is back,
  with the same key, for every ``ObjectRef`` already handed out. Scattered data (``broadcast=False``) has no
  task behind it and would be lost with its worker; ``broadcast=True`` / ``client.replicate`` copies are
  trimmed back to one by Dask's active memory manager within seconds. The cost: the scheduler holds one
  pickled copy per object while the object is placed, one worker another. The task runs again in a free worker
  thread: a ``get`` waiting for it keeps its own thread (it does not secede, which would let the worker take
  another rank beside it), so if every worker thread is held by ranks waiting on a lost object, the
  recomputation waits for one of them to end (their group's hang timeout).
* Freed: a placement a scope made, from the cluster when that scope ends (an experiment's end; the last scope
  open on that client); the placement ``put`` made on the current client, when the ``ObjectRef`` returned by
  ``put`` is garbage-collected (a scope on that same client ending keeps it, as Ray keeps a driver's object
  while its ref lives: ``put`` once, ``fit`` many times); every placement and this process's pickled bytes,
  when that ``ObjectRef`` is garbage-collected. Keep it referenced while trials use it (a variable or the
  ``config`` handed to ``tune.run``), as in a Ray script.

An ``ObjectRef`` pickles to its key alone, so it travels in trial configs, closures, task arguments and
containers; ``get`` fetches the bytes (from the worker's own memory when it holds them, else through the
worker's client) and unpickles a fresh copy on every call: ranks and trials never share one object.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
from distributed import Client, Future, default_client, get_client, get_worker

from ddp_runtime import _compat

#: Every object's Dask key starts with this (the scheduler's task list shows them as one task group).
KEY_PREFIX = "ddp_runtime-object-"

__all__ = ["GetTimeoutError", "ObjectLostError", "ObjectRef", "get", "object_store", "put", "wait"]


class GetTimeoutError(TimeoutError):
    """``get`` did not have the object within its ``timeout`` (Ray: ``ray.exceptions.GetTimeoutError``)."""


class ObjectLostError(RuntimeError):
    """The object is not on this Dask cluster: every scope that placed it has ended and no process that can
    place it again holds it (Ray: ``ray.exceptions.ObjectLostError``)."""


class ObjectRef:
    """A reference to an object ``put`` in the object store (Ray: ``ray.ObjectRef``).

    Pickles to its key alone: put it in a trial's config, a closure or a task's arguments and ``get`` it on any
    worker of a cluster the object is placed on. Two refs to the same object compare equal.

    Args:
        key: The object's Dask key (``KEY_PREFIX`` + a random hex id).
    """

    __slots__ = ("__weakref__", "key")

    def __init__(self, key: str) -> None:
        self.key = key

    def hex(self) -> str:
        """The object's id, as Ray's ``ObjectRef.hex()`` gives it (here: its Dask key)."""
        return self.key

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return ObjectRef, (self.key,)

    def __repr__(self) -> str:
        return f"ObjectRef({self.key!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)


@dataclass
class _Entry:
    """One object this process put: its pickled value, and its placements (one future per client)."""

    payload: bytes
    futures: dict[str, Future | None] = field(
        default_factory=dict
    )  # client.id -> its future (None: being placed)
    scoped: set[str] = field(default_factory=set)  # the client ids whose placement an object_store scope made


_LOCK = threading.RLock()
_ENTRIES: dict[str, _Entry] = {}
_SCOPES: dict[str, list[Client]] = {}  # client.id -> that client, once per open object_store scope


def _hold(payload: bytes) -> bytes:
    """The task whose result is an object on the cluster: its pickled value (the scheduler keeps the argument,
    so the task can run again when the worker holding the result is lost)."""
    return payload


def _task_state(key: str, dask_scheduler: Any = None) -> str | None:
    """On the scheduler: the state of ``key``'s task (None: the scheduler does not know the key)."""
    ts = dask_scheduler.tasks.get(key)
    return ts.state if ts is not None else None


def _on_worker() -> Any | None:
    try:
        return get_worker()
    except ValueError:
        return None


def _current_client() -> Client | None:
    """The Dask client of this process: the worker's on a worker, else the default client (None: none)."""
    if _on_worker() is not None:
        return get_client()
    try:
        client = default_client()
    except ValueError:
        return None
    return client if client.status == "running" else None


def _place(key: str, entry: _Entry, client: Client, *, scoped: bool) -> None:
    """``entry`` on ``client``'s cluster, once per client (submitted outside the lock: a garbage-collected
    ``ObjectRef`` releases its object from whichever thread the collector runs in, Dask's event loop's too).
    ``scoped``: an ``object_store`` scope places it, and releases it when the scope ends; otherwise ``put``
    placed it on the current client and it lives while the ``ObjectRef`` does. The first placement decides."""
    with _LOCK:
        if client.id in entry.futures:
            return
        entry.futures[client.id] = None
        if scoped:
            entry.scoped.add(client.id)
    with warnings.catch_warnings():  # "Sending large graph": the value is meant to travel once, this way
        warnings.simplefilter("ignore", UserWarning)
        future = client.submit(_hold, entry.payload, key=key, pure=False)
    with _LOCK:
        entry.futures[client.id] = future


def _forget(key: str) -> None:
    """The ``ObjectRef`` ``put`` returned is gone: the bytes and every placement are released."""
    with _LOCK:
        entry = _ENTRIES.pop(key, None)
    if entry is None:
        return
    for future in [f for f in entry.futures.values() if f is not None]:
        with contextlib.suppress(Exception):  # the client may be closed already (its keys went with it)
            future.release()
    entry.futures.clear()


def put(value: Any) -> ObjectRef:
    """Store ``value`` and return a reference any worker can ``get`` it with (Ray: ``ray.put``).

    The value is pickled now (cloudpickle; later changes to it are not seen) and kept in this process; it is
    placed on the current Dask client's cluster if there is one (there it lives while the returned
    ``ObjectRef`` does), and on every cluster an ``object_store`` scope opens (each experiment, each
    ``TorchTrainer.fit``; released when it ends). Survives a worker restart by lineage: see the module's
    docstring.

    Args:
        value: Any picklable object (a model, a dataset, a table).

    Returns:
        The object's ``ObjectRef``. Keep it referenced while the object is used: once it is garbage-collected
        the object is released.
    """
    payload = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    ref = ObjectRef(KEY_PREFIX + uuid.uuid4().hex)
    entry = _Entry(payload)
    with _LOCK:
        _ENTRIES[ref.key] = entry
        scoped = [scopes[-1] for scopes in _SCOPES.values()]
    for client in scoped:
        _place(ref.key, entry, client, scoped=True)
    current = _current_client()
    if current is not None and all(c.id != current.id for c in scoped):
        _place(ref.key, entry, current, scoped=False)
    weakref.finalize(ref, _forget, ref.key).atexit = False  # at exit the clients close, and their keys go
    return ref


@contextlib.contextmanager
def object_store(client: Client | None = None) -> Iterator[Client]:
    """A scope in which the objects this process ``put`` are on ``client``'s cluster (Ray: the objects of a
    job, freed when it ends).

    On entry every object this process holds is placed on the cluster, as is every object ``put`` while the
    scope is open; when the last scope open on ``client`` ends, the scopes' placements are released from that
    cluster (the scheduler forgets their keys). An object ``put`` placed on ``client`` before, as the current
    client, is not the scope's: it stays while its ``ObjectRef`` lives. Experiments (``tune.run``,
    ``Tuner.fit``, the pipeline) and ``TorchTrainer.fit`` open one around their run; open your own when you
    drive Dask yourself. Scopes nest.

    Args:
        client: The Dask client of the cluster; default: the current default client.

    Yields:
        The client.
    """
    client = client or default_client()
    with _LOCK:
        _SCOPES.setdefault(client.id, []).append(client)
        entries = list(_ENTRIES.items())
    try:
        for key, entry in entries:
            _place(key, entry, client, scoped=True)
        yield client
    finally:
        with _LOCK:
            scopes = _SCOPES[client.id]
            scopes.pop()
            last = not scopes
            placed = []
            if last:
                del _SCOPES[client.id]
                for entry in _ENTRIES.values():
                    if client.id in entry.scoped:
                        entry.scoped.discard(client.id)
                        placed.append(entry.futures.pop(client.id, None))
                placed = [f for f in placed if f is not None]
        if placed and client.status == "running":
            # Asks the scheduler to forget them; it does so on its own schedule (a key whose submission has
            # not reached it yet is cancelled on arrival), so callers that count keys poll.
            client.cancel(placed)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _payload(ref: ObjectRef, deadline: float | None) -> bytes:
    """``ref``'s pickled value: this process's own copy, the worker's, or fetched through the current client."""
    with _LOCK:
        entry = _ENTRIES.get(ref.key)
    if entry is not None:
        return entry.payload
    worker = _on_worker()
    if worker is not None:
        with contextlib.suppress(KeyError):
            return worker.data[ref.key]
    client = _current_client()
    if client is None:
        raise ObjectLostError(
            f"{ref} cannot be read here: this process did not put it and has no Dask client; call get on a Dask "
            "worker of the cluster the object is on (a trainable, a rank), or connect a Client"
        )
    if client.run_on_scheduler(_task_state, ref.key) is None:
        raise ObjectLostError(
            f"{ref} is not on this Dask cluster: the experiment (object_store scope) that placed it has ended, or "
            "the ObjectRef that put returned was garbage-collected in the process that put it"
        )
    future = _compat.future_of_key(client, ref.key)
    try:
        return future.result(timeout=_remaining(deadline))
    except TimeoutError as exc:
        raise GetTimeoutError(f"get({ref}): not available within the timeout") from exc
    except CancelledError as exc:
        raise ObjectLostError(f"{ref} was released from this Dask cluster while get waited for it") from exc
    finally:
        future.release()


def _get_one(ref: Any, deadline: float | None) -> Any:
    if isinstance(ref, Future):
        try:
            return ref.result(timeout=_remaining(deadline))
        except TimeoutError as exc:
            raise GetTimeoutError(f"get({ref}): not finished within the timeout") from exc
    if not isinstance(ref, ObjectRef):
        raise TypeError(
            f"get() takes an ObjectRef, a Dask Future or a list of them, not {type(ref).__name__}"
        )
    return pickle.loads(_payload(ref, deadline))


def get(refs: ObjectRef | Future | Sequence[ObjectRef | Future], *, timeout: float | None = None) -> Any:
    """The object(s) behind ``refs`` (Ray: ``ray.get``); a fresh copy on every call.

    Works in the driver and on any Dask worker of a cluster the object is placed on (a trainable, a
    TorchTrainer rank, a task). Dask futures (``client.submit``'s) are accepted too: their results.

    Args:
        refs: An ``ObjectRef`` or a Dask ``Future``, or a list of them.
        timeout: Seconds to wait at most, for all of them together; None: no limit.

    Returns:
        The value, or a list of values in the order of ``refs``.

    Raises:
        GetTimeoutError: not all were available within ``timeout``.
        ObjectLostError: the object is not on this cluster (its experiment has ended, or its ``put`` ref was
            garbage-collected).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    if isinstance(refs, list | tuple):
        return [_get_one(ref, deadline) for ref in refs]
    return _get_one(refs, deadline)


def wait(
    refs: Iterable[ObjectRef | Future],
    *,
    num_returns: int = 1,
    timeout: float | None = None,
    fetch_local: bool = True,
) -> tuple[list[Any], list[Any]]:
    """Wait until ``num_returns`` of ``refs`` are ready, or ``timeout`` passes (Ray: ``ray.wait``).

    An ``ObjectRef`` this process put is ready at once (its value is here); another one when its cluster holds
    it; a Dask ``Future`` when its task has finished (or failed: ``get`` then raises its error).

    Args:
        refs: ``ObjectRef``s and/or Dask ``Future``s, each once.
        num_returns: How many to wait for (at most ``len(refs)``).
        timeout: Seconds to wait at most; None: until ``num_returns`` are ready.
        fetch_local: Accepted for Ray's signature; nothing is fetched by ``wait``.

    Returns:
        ``(ready, not_ready)``: at most ``num_returns`` ready refs, and the rest; each in the order of ``refs``.

    Raises:
        ValueError: a ref is given twice, or ``num_returns`` is not between 1 and ``len(refs)``.
    """
    del fetch_local
    refs = list(refs)
    if not refs:
        return [], []
    keys = [r.key for r in refs]
    if len(set(keys)) != len(keys):
        raise ValueError("wait() requires a list of unique refs")
    if not 1 <= num_returns <= len(refs):
        raise ValueError(f"wait(num_returns={num_returns}): give 1 to len(refs) ({len(refs)})")
    deadline = None if timeout is None else time.monotonic() + timeout
    watched: list[Future | None] = []  # per ref: the future that says when it is ready (None: ready now)
    made: list[Future] = []
    for ref in refs:
        if isinstance(ref, Future):
            watched.append(ref)
            continue
        with _LOCK:
            here = ref.key in _ENTRIES
        worker = _on_worker()
        if here or (worker is not None and ref.key in worker.data):
            watched.append(None)
            continue
        client = _current_client()
        if client is None:
            raise ObjectLostError(f"wait: {ref} is not in this process and there is no Dask client to ask")
        made.append(future := _compat.future_of_key(client, ref.key))
        watched.append(future)
    changed = threading.Event()  # set whenever one of them finishes (callbacks: futures of any client)
    for future in {id(f): f for f in watched if f is not None}.values():
        future.add_done_callback(lambda _: changed.set())
    try:
        while True:
            changed.clear()
            done = [i for i, f in enumerate(watched) if f is None or f.done()]
            remaining = _remaining(deadline)
            if len(done) >= num_returns or remaining == 0:
                break
            changed.wait(remaining)
    finally:
        for future in made:
            future.release()
    chosen = set(done[:num_returns])
    ready = [r for i, r in enumerate(refs) if i in chosen]
    return ready, [r for i, r in enumerate(refs) if i not in chosen]
