"""MLflow as the system of record: one parent run per pipeline run, one nested child run per trial.

Everything goes through ``MlflowClient`` with explicit run ids (no global "active run"), because trials are
driven from several threads of the flow process at once; each run is written by exactly one thread. Metric
writes are batched: one ``log_batch`` per report.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from typing import Any
from urllib.parse import unquote, urlparse

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from sweepflow.tasks.compat import update_run_status
from sweepflow.tasks.datasets.uris import redact

PARENT_TAG = "mlflow.parentRunId"
_MAX_PARAM_LEN = 6000


def _param_value(value: Any) -> str:
    return str(value)[:_MAX_PARAM_LEN]


def param_items(params: dict[str, Any]) -> list[Param]:
    """MLflow params from a (possibly nested) dict: dotted keys, values as bounded strings."""
    return [Param(k, _param_value(v)) for k, v in flatten("", params).items()]


def tag_items(tags: dict[str, Any]) -> list[RunTag]:
    return [RunTag(k, _param_value(v)) for k, v in tags.items()]


def metric_batch(metrics: dict[str, Any], step: int, timestamp_ms: int) -> list[Metric]:
    """The numeric entries of a report as MLflow metrics (strings, bools and nested values are not metrics)."""
    return [
        Metric(key, float(value), timestamp_ms, step)
        for key, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]


def flatten(prefix: str, value: Any) -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: MLflow params are flat."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), sub))
        return out
    return {prefix: value}


def public_params(params: dict[str, Any]) -> dict[str, Any]:
    """Params everyone who can read the experiment may see: credentials in URIs (``user:token@``) removed, and
    storage options (keys, secrets, tokens) left out entirely."""
    return {
        key: redact(value) if isinstance(value, str) else value
        for key, value in params.items()
        if "storage_options" not in key
    }


class RunTracker:
    """Creates and writes the runs of one experiment."""

    def __init__(self, tracking_uri: str, experiment_name: str, *, artifact_root: str | None = None) -> None:
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri)
        experiment = self.client.get_experiment_by_name(experiment_name)
        if experiment is None:
            self.experiment_id = self.client.create_experiment(
                experiment_name, artifact_location=artifact_root
            )
        else:
            self.experiment_id = experiment.experiment_id

    def start_run(
        self,
        run_name: str,
        *,
        parent_run_id: str | None = None,
        params: dict[str, Any] | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        run_id, _ = self.create_run(run_name, parent_run_id=parent_run_id, tags=tags)
        if params:
            self.log_params(run_id, params)
        return run_id

    def create_run(
        self, run_name: str, *, parent_run_id: str | None = None, tags: dict[str, str] | None = None
    ) -> tuple[str, str]:
        """One round trip: a RUNNING run with its tags; returns (run id, artifact URI)."""
        all_tags = dict(tags or {})
        if parent_run_id:
            all_tags[PARENT_TAG] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=all_tags)
        return run.info.run_id, run.info.artifact_uri

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        items = param_items(params)
        for i in range(0, len(items), 100):  # MLflow caps a batch at 100 params
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, Any], step: int) -> None:
        batch = metric_batch(metrics, step, int(time.time() * 1000))
        if batch:
            self.client.log_batch(run_id, metrics=batch)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        self.client.log_batch(run_id, tags=tag_items(tags))

    def set_status(self, run_id: str, status: str) -> None:
        """SCHEDULED (queued for a slot) or RUNNING."""
        self._update_run_info(run_id, status, end_time=None)

    def delete_run(self, run_id: str) -> None:
        self.client.delete_run(run_id)

    def end_run(self, run_id: str, status: str) -> None:
        """status: FINISHED, KILLED (early-stopped) or FAILED."""
        self._update_run_info(run_id, status, end_time=int(time.time() * 1000))

    def _update_run_info(self, run_id: str, status: str, end_time: int | None) -> None:
        # One UpdateRun request (MlflowClient.set_terminated/update_run fetch the whole run first): see compat.
        update_run_status(self.client, run_id, status, end_time)

    def artifact_uri(self, run_id: str) -> str:
        return self.client.get_run(run_id).info.artifact_uri

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        if os.path.isdir(local_path):
            self.client.log_artifacts(run_id, local_path, artifact_path)
        else:
            self.client.log_artifact(run_id, local_path, artifact_path)


def direct_storage_uri(artifact_uri: str, artifacts_destination: str | None = None) -> str | None:
    """The fsspec location behind a run's artifact URI, when trainers can write there directly: a local/file
    store, an s3:// (gs, abfs) artifact root, or a proxied ``mlflow-artifacts:`` URI when the server's
    ``--artifacts-destination`` is known. None otherwise: then only the tracking server can write there."""
    parsed = urlparse(artifact_uri)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path) if parsed.scheme == "file" else artifact_uri
    if parsed.scheme in ("s3", "gs", "gcs", "abfs", "az"):
        return artifact_uri
    if parsed.scheme == "mlflow-artifacts" and artifacts_destination:
        # The server stores mlflow-artifacts:/<path> at <artifacts-destination>/<path>.
        return f"{artifacts_destination.rstrip('/')}/{unquote(parsed.path).lstrip('/')}"
    return None


def check_direct_writes(tracker: RunTracker, run_id: str, direct_uri: str) -> None:
    """Write a small file straight to ``direct_uri`` and make sure the tracking server lists it as one of the
    run's artifacts, so a wrong ``artifacts_destination`` fails the run at its start, not after training."""
    import fsspec

    marker = "storage-check.json"
    with fsspec.open(f"{direct_uri.rstrip('/')}/sweepflow/{marker}", "w") as f:
        json.dump({"run_id": run_id, "written_at": time.time()}, f)
    listed = {os.path.basename(a.path) for a in tracker.client.list_artifacts(run_id, "sweepflow")}
    if marker not in listed:
        raise RuntimeError(
            f"checkpoints written to {direct_uri} are not visible in MLflow run {run_id} "
            f"(artifact URI {tracker.artifact_uri(run_id)}): mlflow.artifacts_destination (or "
            "$SWEEPFLOW_STORAGE/mlflow) must equal the tracking server's --artifacts-destination. Set it to that "
            "value, or unset it to let the server upload checkpoints (one extra copy)"
        )


class RunWriter:
    """All writes of one run, from one background thread, in order: params, metrics, tags, artifacts, end.

    A trial's training reports and its start/finish are then not held up by the tracking server's latency
    (an HTTP round trip, a SQLite commit); what is queued within ``linger_s`` of a write, or while one is in
    flight, goes out together as one ``log_batch``. Still one writer per run. ``finish(status)`` queues the run's end and returns; the
    sweep joins every writer (``join()``) before it closes the parent run, and ``join`` raises what a
    background write raised, so nothing is dropped silently.
    """

    _STOP = object()

    def __init__(self, tracker: RunTracker, run_id: str, *, linger_s: float = 0.5) -> None:
        self.linger_s = linger_s  # how long a write waits for more to go out with it
        self._tracker = tracker
        self.run_id = run_id
        self._queue: queue.Queue[Any] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"mlflow-run-{run_id[:8]}", daemon=True)
        self._thread.start()

    # ---- queued operations (return at once)
    def log_params(self, params: dict[str, Any]) -> None:
        self._queue.put(("params", dict(params)))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._queue.put(("metrics", (dict(metrics), step, int(time.time() * 1000))))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._queue.put(("tags", dict(tags)))

    def set_status(self, status: str) -> None:
        """SCHEDULED or RUNNING; of several queued together only the last is written."""
        self._queue.put(("status", status))

    def delete(self) -> None:
        """Queue the run's deletion (a trial that never started); nothing can be queued after it."""
        self._queue.put(("delete", None))
        self._queue.put(self._STOP)

    def log_artifacts(self, local_dir: str, artifact_path: str) -> None:
        """Upload ``local_dir`` (which must stay until ``join``) as ``artifact_path``."""
        self._queue.put(("artifacts", (local_dir, artifact_path)))

    def finish(self, status: str) -> None:
        """Queue the run's end (FINISHED, KILLED or FAILED); nothing can be queued after it."""
        self._queue.put(("end", status))
        self._queue.put(self._STOP)

    def join(self) -> None:
        """Wait until everything queued is written; raise what a background write raised."""
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"writing MLflow run {self.run_id} failed: {self._error}") from self._error

    # ---- the writer thread
    def _loop(self) -> None:
        while True:
            items = [self._queue.get()]
            # Linger briefly so a burst (params, status, a report or two) becomes one request: every request
            # costs the tracking server a transaction and CPU that the trainers beside it would rather have.
            # The run's end (and a deletion) cuts the wait short.
            deadline = time.monotonic() + self.linger_s
            while items[-1] is not self._STOP and (timeout := deadline - time.monotonic()) > 0:
                try:
                    items.append(self._queue.get(timeout=timeout))
                except queue.Empty:
                    break
            try:
                self._write(items)
            except BaseException as exc:  # noqa: BLE001 - re-raised by join() in the sweep's thread
                self._error = self._error or exc
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

        def flush() -> None:
            while params or metrics or tags:  # MLflow caps a batch at 100 params, 100 tags, 1000 metrics
                tracker.client.log_batch(
                    self.run_id, metrics=metrics[:1000], params=params[:100], tags=tags[:100]
                )
                del metrics[:1000], params[:100], tags[:100]

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
            elif kind == "delete":
                tracker.delete_run(self.run_id)
                return
            elif kind == "artifacts":
                flush()
                tracker.log_artifact(self.run_id, *value)
            elif kind == "end":
                flush()
                tracker.end_run(self.run_id, value)
                status = None  # ended: a queued SCHEDULED/RUNNING is moot
        if status is not None:
            tracker.set_status(self.run_id, status)
        flush()
