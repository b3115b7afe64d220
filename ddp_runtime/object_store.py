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
containers. ``get`` finds the bytes in this process when it can (the process that put it; the worker holding
it; a copy this process fetched before) and otherwise fetches them once through the worker's client (a round
trip to the scheduler and a transfer: ~10 ms on a local cluster), then unpickles:

* **A fresh copy on every call** of everything but NumPy arrays: a model, a dict, a torch tensor. Ranks and
  trials sharing a worker process never share one object, and changing what ``get`` returned changes nothing
  for the next ``get`` (as with Ray, whose ``ray.get`` deserializes anew too). What that costs is the unpickle:
  ~0.35 ms for a small CNN's module, microseconds for a small dict.
* **NumPy arrays are read-only views** of the one copy this process holds (pickle protocol 5's out-of-band
  buffers; Ray's zero-copy reads do the same): no copy, microseconds whatever their size; writing to one raises
  ``ValueError: assignment destination is read-only``; ``array.copy()`` gives a writable one.
* A copy a rank fetched from another worker is kept in its process (at most ``FETCHED_LIMIT_BYTES`` of them,
  least recently used dropped first) until the last rank running in that process ends: ``get`` in a training
  loop, once per batch, pays the round trip once per trial, not per batch. A trial's experiment outlives its
  ranks, so a kept copy never outlives the object. Elsewhere (the driver, a task of your own on a worker) every
  ``get`` of an object the process does not hold fetches it again.
"""

from __future__ import annotations

import collections
import contextlib
import pickle
import struct
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

#: At most this many bytes of objects fetched from other workers are kept in a process for later ``get`` calls.
FETCHED_LIMIT_BYTES = 1 << 30

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


# The stored form of a value whose pickle has out-of-band buffers (NumPy arrays): one bytes object holding a
# header, the pickle and the buffers, each buffer at an offset that is a multiple of _ALIGN, so the arrays ``get``
# rebuilds are views of it. A value without such buffers is stored as its plain pickle, which never starts with
# _FRAMED (a protocol-5 pickle starts with b"\x80\x05").
_FRAMED = b"DDPO"
_ALIGN = 64


def _encode(value: Any) -> bytes:
    """``value`` pickled (cloudpickle, protocol 5), its NumPy arrays' memory out of band in the same bytes."""
    buffers: list[pickle.PickleBuffer] = []
    data = cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    if not buffers:
        return data
    raws = [b.raw() for b in buffers]
    header_len = len(_FRAMED) + 4 + 8 * (1 + len(raws))
    offsets, at = [], _aligned(header_len + len(data))
    for raw in raws:
        offsets.append(at)
        at = _aligned(at + raw.nbytes)
    out = bytearray(at)
    struct.pack_into(
        f"<4sI{1 + len(raws)}Q", out, 0, _FRAMED, len(raws), len(data), *(r.nbytes for r in raws)
    )
    out[header_len : header_len + len(data)] = data
    for offset, raw in zip(offsets, raws, strict=True):
        out[offset : offset + raw.nbytes] = raw
    return bytes(out)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _decode(payload: bytes) -> Any:
    """The value ``_encode`` stored: a fresh unpickle, its NumPy arrays read-only views of ``payload``."""
    if not payload.startswith(_FRAMED):
        return pickle.loads(payload)
    (count,) = struct.unpack_from("<I", payload, len(_FRAMED))
    data_len, *sizes = struct.unpack_from(f"<{1 + count}Q", payload, len(_FRAMED) + 4)
    header_len = len(_FRAMED) + 4 + 8 * (1 + count)
    view = memoryview(payload)
    buffers, at = [], _aligned(header_len + data_len)
    for size in sizes:
        buffers.append(view[at : at + size])
        at = _aligned(at + size)
    return pickle.loads(view[header_len : header_len + data_len], buffers=buffers)


_LOCK = threading.RLock()
_ENTRIES: dict[str, _Entry] = {}
# Objects this process fetched from another worker, by key (most recently used last), and their total size.
_FETCHED: collections.OrderedDict[str, bytes] = collections.OrderedDict()
_fetched_bytes = 0
_keeping = 0  # how many keeping_fetched blocks are open in this process
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
    payload = _encode(value)
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


def _keep_fetched(key: str, payload: bytes) -> None:
    global _fetched_bytes
    if len(payload) > FETCHED_LIMIT_BYTES:
        return
    with _LOCK:
        if not _keeping or key in _FETCHED:
            return
        _FETCHED[key] = payload
        _fetched_bytes += len(payload)
        while _fetched_bytes > FETCHED_LIMIT_BYTES:
            _, dropped = _FETCHED.popitem(last=False)
            _fetched_bytes -= len(dropped)


@contextlib.contextmanager
def keeping_fetched() -> Iterator[None]:
    """While in the block (a rank's training function runs: its object store scope outlives it), the objects
    this process fetches from other workers are kept for later ``get`` calls; when the last such block in the
    process ends, they are dropped. Blocks nest and overlap (ranks on a worker with several threads)."""
    global _keeping, _fetched_bytes
    with _LOCK:
        _keeping += 1
    try:
        yield
    finally:
        with _LOCK:
            _keeping -= 1
            if not _keeping:
                _FETCHED.clear()
                _fetched_bytes = 0


def _local_payload(key: str) -> bytes | None:
    """``key``'s stored value if this process has it: its own put, the worker's copy, or one fetched before."""
    with _LOCK:
        entry = _ENTRIES.get(key)
        if entry is not None:
            return entry.payload
        fetched = _FETCHED.get(key)
        if fetched is not None:
            _FETCHED.move_to_end(key)
            return fetched
    worker = _on_worker()
    if worker is not None:
        with contextlib.suppress(KeyError):
            return worker.data[key]
    return None


def _payload(ref: ObjectRef, deadline: float | None) -> bytes:
    """``ref``'s stored value: this process's own copy, the worker's, or fetched through the current client."""
    local = _local_payload(ref.key)
    if local is not None:
        return local
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
        payload = future.result(timeout=_remaining(deadline))
        _keep_fetched(ref.key, payload)
        return payload
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
    return _decode(_payload(ref, deadline))


def get(refs: ObjectRef | Future | Sequence[ObjectRef | Future], *, timeout: float | None = None) -> Any:
    """The object(s) behind ``refs`` (Ray: ``ray.get``): a fresh copy on every call, NumPy arrays as read-only
    views (see the module's docstring for what a call costs).

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
        if _local_payload(ref.key) is not None:
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
