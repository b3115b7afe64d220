"""A run's writes from a background thread (``RunWriter``), and a sweep's set of them (``RunWriters``): a trial's
reports and its start and end are not held up by the tracking server's latency, and nothing is dropped silently.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from mlflow.entities import Metric, Param, RunTag

from sweepflow.tasks.tracking.runs import (
    RunTracker,
    TrackingServerError,
    TrackingServerUnavailable,
    metric_batch,
    param_items,
    tag_items,
)

log = logging.getLogger(__name__)


class RunWriter:
    """All writes of one run, from one background thread, in order: params, metrics, tags (set and removed),
    artifacts, end.

    A trial's training reports and its start/finish are then not held up by the tracking server's latency
    (an HTTP round trip, a SQLite commit); what is queued within ``linger_s`` of a write, or while one is in
    flight, goes out together as one ``log_batch``. Still one writer per run. ``finish(status)`` queues the run's end and returns; the
    sweep joins every writer (``join()``) before it closes the parent run, and ``join`` raises what a
    background write raised, so nothing is dropped silently.

    Each write is retried by the tracker while the server is away (``RunTracker``: up to its ``retry_s``,
    without writing anything twice); the trial keeps training meanwhile and its reports queue up here. A write
    that fails for good stops the writer: nothing after it is sent, and ``join`` raises the failure.
    """

    _STOP = object()

    def __init__(
        self,
        tracker: RunTracker,
        run_id: str,
        *,
        linger_s: float = 0.5,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """``on_error``: told (from the writer's thread) the failure that stopped it, when it happens."""
        self.linger_s = linger_s  # how long a write waits for more to go out with it
        self._on_error = on_error
        self._tracker = tracker
        self.run_id = run_id
        self._queue: queue.Queue[Any] = queue.Queue()
        self._error: BaseException | None = None
        self._finished = False
        self._thread = threading.Thread(target=self._loop, name=f"mlflow-run-{run_id[:8]}", daemon=True)
        self._thread.start()

    # ---- queued operations (return at once)
    def log_params(self, params: dict[str, Any]) -> None:
        self._queue.put(("params", dict(params)))

    def log(self, metrics: dict[str, Any], step: int, *, timestamp_ms: int | None = None) -> None:
        """``timestamp_ms``: when the values were taken (default: now)."""
        at_ms = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        self._queue.put(("metrics", (dict(metrics), step, at_ms)))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._queue.put(("tags", dict(tags)))

    def delete_tags(self, keys: list[str] | tuple[str, ...]) -> None:
        """Remove these tags (those the run holds); in order with the writes queued before and after."""
        if keys:
            self._queue.put(("delete_tags", tuple(keys)))

    def set_status(self, status: str) -> None:
        """SCHEDULED or RUNNING; of several queued together only the last is written."""
        self._queue.put(("status", status))

    def log_artifacts(self, local_dir: str, artifact_path: str) -> None:
        """Upload ``local_dir`` (which must stay until ``join``) as ``artifact_path``."""
        self._queue.put(("artifacts", (local_dir, artifact_path)))

    def finish(self, status: str) -> None:
        """Queue the run's end (FINISHED, KILLED or FAILED); nothing can be queued after it. Only the first
        call counts, so whoever holds the writer when an error goes by can end the run without asking whether it
        was ended: a writer never finished would keep ``join`` waiting for ever."""
        if self._finished:
            return
        self._finished = True
        self._queue.put(("end", status))
        self._queue.put(self._STOP)

    def running(self) -> bool:
        """Its thread is still writing (or waiting for more): ``join`` would wait."""
        return self._thread.is_alive()

    def join(self) -> None:
        """Wait until everything queued is written; raise what a background write raised."""
        self._thread.join()
        if isinstance(self._error, TrackingServerUnavailable | TrackingServerError):  # names run and server
            raise type(self._error)(str(self._error)) from self._error
        if self._error is not None:
            raise RuntimeError(f"writing MLflow run {self.run_id} failed: {self._error}") from self._error

    # ---- the writer thread
    def _loop(self) -> None:
        while True:
            items = [self._queue.get()]
            # Linger briefly so a burst (params, status, a report or two, system metrics, the run's outcome)
            # becomes one request: every request costs the tracking server a transaction and CPU that the
            # trainers beside it would rather have. The run's end cuts the wait short.
            deadline = time.monotonic() + self.linger_s
            while (timeout := deadline - time.monotonic()) > 0 and items[-1] is not self._STOP:
                try:
                    items.append(self._queue.get(timeout=timeout))
                except queue.Empty:
                    break
            if self._error is None:
                try:
                    self._write(items)
                except BaseException as exc:  # noqa: BLE001 - re-raised by join() in the sweep's thread
                    self._error = exc
                    if self._on_error is not None:
                        self._on_error(exc)
            # After a failed write nothing more is sent: a later write would land without the lost one before
            # it, and the run stays as it was (RUNNING), so the pipeline run can be resumed. join() raises.
            if any(item is self._STOP for item in items):
                return

    def _write(self, items: list[Any]) -> None:
        """Params, metrics and tags queued together go out as one ``log_batch`` (each request costs the
        tracking server a database transaction); artifacts and the run's end keep their place in the order."""
        tracker = self._tracker
        params: list[Param] = []
        metrics: list[Metric] = []
        tags: list[RunTag] = []
        status: str | None = None

        def flush(end: str | None = None) -> None:
            """What is held, as one batch (retried, chunked); with ``end``, the run's end goes with it (one
            request where the server can)."""
            if end is None:
                tracker.log_batch(self.run_id, metrics=metrics, params=params, tags=tags)
            else:
                tracker.finish(self.run_id, end, metrics=metrics, params=params, tags=tags)
            metrics.clear()
            params.clear()
            tags.clear()

        for item in items:
            kind, value = item if isinstance(item, tuple) else (None, None)
            if kind == "params":
                params.extend(param_items(value))
            elif kind == "metrics":
                metrics.extend(metric_batch(*value))
            elif kind == "tags":
                tags.extend(tag_items(value))
            elif kind == "status":
                status = value
            elif kind == "artifacts":
                flush()
                tracker.log_artifact(self.run_id, *value)
            elif kind == "delete_tags":  # after what was set before it, before what is set after
                flush()
                tracker.delete_tags(self.run_id, value)
            elif kind == "end":
                flush(end=value)
                status = None  # ended: a queued SCHEDULED/RUNNING is moot
        if status is not None:
            tracker.set_status(self.run_id, status)
        flush()


class RunWriters:
    """The writers of a sweep's child runs, joined together when it ends.

    A writer whose thread has ended is let go when the next one is added (its error kept for ``join``): a
    sweep would otherwise hold every trial's writer, with its queue and thread object, until it ends (~5 KiB
    per trial, benchmarks/bench_load.py). Trials add theirs from their own threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writers: list[RunWriter] = []
        self._errors: list[RuntimeError] = []

    def __len__(self) -> int:
        """Writers held: the ones still writing when the last was added, and those added since."""
        return len(self._writers)

    def add(self, writer: RunWriter) -> None:
        with self._lock:
            running = []
            for earlier in self._writers:
                if earlier.running():
                    running.append(earlier)
                else:
                    self._join(earlier)
            self._writers = [*running, writer]

    def join(self) -> None:
        """Wait for every writer's queued writes; raise if any of them failed (now or earlier)."""
        while True:  # joined outside the lock: a trial still opening its run is not held up meanwhile
            with self._lock:
                writers, self._writers = self._writers, []
            if not writers:
                break
            for writer in writers:
                self._join(writer)
        if not self._errors:
            return
        # One sentence: the first failure (the server's own message, or how long it stayed away); the others,
        # usually the same failure of other runs, are in the log.
        first, others = self._errors[0], self._errors[1:]
        for other in others:
            log.error("%s", other)
        more = f" ({len(others)} more trial run(s) failed to write too: see the log)" if others else ""
        kind = type(first) if isinstance(first, TrackingServerError | TrackingServerUnavailable) else RuntimeError
        raise kind(f"some trial results did not reach MLflow: {first}{more}") from first

    def _join(self, writer: RunWriter) -> None:
        try:
            writer.join()
        except RuntimeError as exc:
            self._errors.append(exc)
