"""MLflow as the system of record: one parent run per pipeline run, one nested child run per trial.

Everything goes through ``MlflowClient`` with explicit run ids (no global "active run"), because trials are
driven from several threads of the flow process at once; each run is written by exactly one thread. Metric
writes are batched: one ``log_batch`` per report.

The tracking server may be away for a while (a restart, a network blip) while trials train: every call of
``RunTracker`` retries a failure that can pass (connection refused or reset, timeout, HTTP 408/429/502/503/504)
with backoff, for up to ``SWEEPFLOW_MLFLOW_RETRY_S`` seconds (default 120), then raises
``TrackingServerUnavailable`` naming the server. A server that answers with an error of its own code (HTTP 500)
is not an outage: the call raises ``TrackingServerError`` with the server's message at once. A retry cannot write anything twice: a metric batch that may
have landed is read back and only what is missing is sent again, and a run whose creation may have landed is
found by its creation id instead of being created again. MLflow's HTTP client retries on its own first (each
call: ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, default 7, with backoff ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR``, default
2: up to ~4 minutes for a server that refuses connections, re-sending POSTs too); set it lower to make
``SWEEPFLOW_MLFLOW_RETRY_S`` the bound. Its re-sent metric batches do not duplicate metrics: they carry the same
timestamps, and the server's SQL store skips a metric identical in (key, step, timestamp, value).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

from mlflow.entities import Metric, Param, RunTag, ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ddp_runtime.retry import Backoff, seconds_setting
from sweepflow.tasks.compat import (
    MlflowServerError,
    mlflow_server_errors_raised,
    skip_databricks_request_headers,
    update_run_status,
)
from sweepflow.tasks.datasets.uris import redact
from sweepflow.tasks.tracking.finish_route import FINISH_ROUTE, finish_payload, send_finish
from sweepflow.tasks.tracking.params import flatten
from sweepflow.tasks.tracking.server_routes import server_routes

PARENT_TAG = "mlflow.parentRunId"
#: A unique id set on every run at its creation: a retried creation finds the run instead of making a second one.
CREATE_ID_TAG = "sweepflow.create_id"
_MAX_PARAM_LEN = 6000

#: How long (seconds) the tracking server may stay unreachable before a write fails; env overrides the default.
RETRY_ENV = "SWEEPFLOW_MLFLOW_RETRY_S"
DEFAULT_RETRY_S = 120.0
#: HTTP statuses a later attempt can get past: timeout, rate limit, a server or its database restarting, gateway
#: errors, and 500, which is how MLflow's client reports a connection that failed. A server's own answer 500 (its
#: code failed, and will again) comes out as ``MlflowServerError`` instead (``compat.mlflow_server_errors_raised``).
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})

log = logging.getLogger(__name__)
T = TypeVar("T")


class TrackingServerUnavailable(RuntimeError):
    """The tracking server did not answer for longer than the retry bound (``SWEEPFLOW_MLFLOW_RETRY_S``)."""


class TrackingServerError(RuntimeError):
    """The tracking server answered, with an error of its own code (HTTP 500): not retried, since it is up and
    would fail the same way again. The message is the server's."""


def retry_budget_s(value: float | None = None) -> float:
    """The retry bound: ``value``, else ``$SWEEPFLOW_MLFLOW_RETRY_S``, else 120 s."""
    return seconds_setting(value, env=RETRY_ENV, default=DEFAULT_RETRY_S, what="the MLflow tracking server")


def is_transient(exc: BaseException) -> bool:
    """Whether another attempt may succeed: the server was unreachable, timed out, or answered 408/429/502/503/
    504. A refused request (no such run, invalid value, permission) and a server error (500) are not retried."""
    import requests

    if isinstance(exc, MlflowServerError):
        return False
    if isinstance(exc, MlflowException):
        # Transport failures come out of MLflow's HTTP client as INTERNAL_ERROR (HTTP 500) with the cause in
        # the message; the server's own refusals carry their 4xx code.
        return exc.get_http_status_code() in _TRANSIENT_STATUS
    return isinstance(exc, ConnectionError | TimeoutError | requests.ConnectionError | requests.Timeout)


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


class RunTracker:
    """Creates and writes the runs of one experiment; every call retries a passing failure (see the module doc).

    ``retry_s``: how long the tracking server may stay unreachable before a call raises
    ``TrackingServerUnavailable`` (default ``$SWEEPFLOW_MLFLOW_RETRY_S``, else 120 s). Once a call has given up,
    later calls try once, without waiting, until the server answers again: a sweep whose server is gone fails
    within one bound, not one bound per pending write.
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str,
        *,
        artifact_root: str | None = None,
        retry_s: float | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.retry_s = retry_budget_s(retry_s)
        skip_databricks_request_headers()  # every request would search sys.path for Databricks modules
        self.client = MlflowClient(tracking_uri)
        self._given_up = threading.Event()  # a call exhausted the bound and the server has not answered since
        #: What the retries did, for logs and tests: "retries" (attempts after a failure), "already_logged"
        #: (metrics and params a retry found written and did not send again), "found_created" (run creations
        #: a retry found done).
        self.stats: collections.Counter[str] = collections.Counter()
        self._stats_lock = threading.Lock()
        self._finish_route: bool | None = None  # the server takes a run's last writes and end in one request
        self._finish_route_lock = threading.Lock()
        self.experiment_id = self._call(
            f"opening experiment {experiment_name!r}",
            lambda _: self._experiment(experiment_name, artifact_root),
        )

    def _experiment(self, name: str, artifact_root: str | None) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifact_root)
        except MlflowException as exc:
            # Another pipeline (or an earlier attempt of this call) created it in between: use that one.
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    # ---- retries
    def _count(self, what: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[what] += n

    def _call(self, what: str, attempt: Callable[[bool], T]) -> T:
        """``attempt(retrying)`` until it succeeds, fails for good, or the server stayed away past the bound.
        ``retrying`` is True after a failed attempt, which may have reached the server before it failed."""
        budget = 0.0 if self._given_up.is_set() else self.retry_s
        backoff = Backoff(budget)
        while True:
            try:
                with mlflow_server_errors_raised():
                    result = attempt(backoff.first_failure is not None)
            except MlflowServerError as exc:
                raise TrackingServerError(
                    f"{what} failed: the MLflow tracking server at {redact(self.tracking_uri)} answered with an "
                    f"error of its own (HTTP 500 from {exc.endpoint}, not retried): {redact(exc.message)}"
                ) from None
            except Exception as exc:
                if not is_transient(exc):
                    raise
                waited = backoff.failed()
                if backoff.failures == 1:
                    log.warning(
                        "%s: MLflow tracking server %s unreachable (%s); retrying for up to %.0f s",
                        what,
                        redact(self.tracking_uri),
                        redact(str(exc))[:200],
                        budget,
                    )
                if waited >= budget:
                    self._given_up.set()
                    how_long = (
                        f"did not answer for {waited:.0f} s ({backoff.failures} attempt(s)"
                        if budget
                        else f"is still unreachable (an earlier call waited {self.retry_s:g} s for it"
                    )
                    raise TrackingServerUnavailable(
                        f"{what} failed: the MLflow tracking server at {redact(self.tracking_uri)} {how_long}; "
                        f"last error: {redact(str(exc))[:300]}). Check that the server is up and reachable from "
                        "the flow's machine (its URL, network, proxy), then resume the pipeline run; to wait "
                        f"longer for the server, raise {RETRY_ENV} (now {self.retry_s:g} s)"
                    ) from exc
                backoff.sleep()
                self._count("retries")
                continue
            if backoff.first_failure is not None or self._given_up.is_set():
                self._given_up.clear()
                first_failure = backoff.first_failure
                after = (
                    f" after {time.monotonic() - first_failure:.1f} s" if first_failure is not None else ""
                )
                log.warning(
                    "%s: MLflow tracking server %s answered again%s", what, redact(self.tracking_uri), after
                )
            return result

    # ---- runs
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
        create_id = uuid.uuid4().hex
        all_tags[CREATE_ID_TAG] = create_id

        def attempt(retrying: bool) -> tuple[str, str]:
            if retrying:  # the failed attempt may have created the run: find it rather than make a second one
                found = self.client.search_runs(
                    [self.experiment_id],
                    filter_string=f"tags.`{CREATE_ID_TAG}` = '{create_id}'",
                    run_view_type=ViewType.ACTIVE_ONLY,
                )
                if found:
                    self._count("found_created")
                    return found[0].info.run_id, found[0].info.artifact_uri
            run = self.client.create_run(self.experiment_id, run_name=run_name, tags=all_tags)
            return run.info.run_id, run.info.artifact_uri

        return self._call(f"creating MLflow run {run_name!r}", attempt)

    def log_batch(
        self,
        run_id: str,
        *,
        metrics: Sequence[Metric] = (),
        params: Sequence[Param] = (),
        tags: Sequence[RunTag] = (),
    ) -> None:
        """``log_batch`` in MLflow's batch limits (1000 metrics, 100 params, 100 tags per request), retried.
        A retry re-sends only the metrics and params the server does not hold yet (tags are overwritten, so
        re-sending them is harmless)."""
        metrics, params, tags = list(metrics), list(params), list(tags)
        while metrics or params or tags:
            chunk = (metrics[:1000], params[:100], tags[:100])
            del metrics[:1000], params[:100], tags[:100]
            self._call(
                f"writing MLflow run {run_id}",
                lambda retrying, chunk=chunk: self._log_batch_once(run_id, *chunk, retrying=retrying),
            )

    def _log_batch_once(
        self, run_id: str, metrics: list[Metric], params: list[Param], tags: list[RunTag], *, retrying: bool
    ) -> None:
        if retrying:
            metrics, params = self._not_yet_logged(run_id, metrics, params)
        if metrics or params or tags:
            self.client.log_batch(run_id, metrics=metrics, params=params, tags=tags)

    def _not_yet_logged(
        self, run_id: str, metrics: list[Metric], params: list[Param]
    ) -> tuple[list[Metric], list[Param]]:
        """The metrics and params of a batch that an earlier, failed attempt did not write after all."""

        def identity(key: str, step: int, timestamp: int, value: float) -> tuple[Any, ...]:
            return (key, step, timestamp, "nan" if math.isnan(value) else value)

        logged = set()
        for key in {m.key for m in metrics}:
            for m in self.client.get_metric_history(run_id, key):
                logged.add(identity(m.key, m.step, m.timestamp, m.value))
        missing = [m for m in metrics if identity(m.key, m.step, m.timestamp, m.value) not in logged]
        sent_params = params
        if params:
            present = self.client.get_run(run_id).data.params
            sent_params = [p for p in params if present.get(p.key) != p.value]
        self._count("already_logged", len(metrics) - len(missing) + len(params) - len(sent_params))
        return missing, sent_params

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        self.log_batch(run_id, params=param_items(params))

    def log_metrics(self, run_id: str, metrics: dict[str, Any], step: int) -> None:
        self.log_batch(run_id, metrics=metric_batch(metrics, step, int(time.time() * 1000)))

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        self.log_batch(run_id, tags=tag_items(tags))

    def delete_tags(self, run_id: str, keys: Sequence[str]) -> None:
        """Remove ``keys`` from the run's tags (one request each: MLflow deletes tags one by one). A tag the run
        does not hold (or no longer holds: a retried delete that had landed) is left as it is, absent."""

        def attempt(key: str) -> None:
            try:
                self.client.delete_tag(run_id, key)
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise

        for key in keys:
            self._call(f"removing tag {key} from MLflow run {run_id}", lambda _, key=key: attempt(key))

    def set_experiment_tag(self, key: str, value: str) -> None:
        """Set a tag on the experiment (e.g. a saved view of its runs page); setting it again is harmless."""
        self._call(f"tagging experiment {self.experiment_id}", lambda _: self.client.set_experiment_tag(self.experiment_id, key, value))

    def set_status(self, run_id: str, status: str) -> None:
        """RUNNING again (a resumed run), or SCHEDULED."""
        self._update_run_info(run_id, status, end_time=None)

    def end_run(self, run_id: str, status: str) -> None:
        """status: FINISHED, KILLED (early-stopped) or FAILED."""
        self._update_run_info(run_id, status, end_time=int(time.time() * 1000))

    def finish(
        self,
        run_id: str,
        status: str,
        *,
        metrics: Sequence[Metric] = (),
        params: Sequence[Param] = (),
        tags: Sequence[RunTag] = (),
    ) -> None:
        """The run's last writes, then its end (FINISHED, KILLED or FAILED): one request to a sweepflow tracking
        server (``finish_route``), else ``log_batch`` and ``end_run``. Retried as they are; a retry re-sends only
        what the server does not hold yet."""
        metrics, params, tags = list(metrics), list(params), list(tags)
        if len(metrics) > 1000 or len(params) > 100 or len(tags) > 100 or not self._has_finish_route():
            self.log_batch(run_id, metrics=metrics, params=params, tags=tags)
            self.end_run(run_id, status)
            return
        end_time = int(time.time() * 1000)

        def attempt(retrying: bool) -> None:
            sent_metrics, sent_params = (
                self._not_yet_logged(run_id, metrics, params) if retrying else (metrics, params)
            )
            send_finish(
                self.tracking_uri, finish_payload(run_id, sent_metrics, sent_params, tags, status, end_time)
            )

        self._call(f"ending MLflow run {run_id} as {status}", attempt)

    def _has_finish_route(self) -> bool:
        """Asked once per tracker (one GET; again at the next run's end if the server could not be asked): a
        stock ``mlflow server`` or a local store has no such route."""
        with self._finish_route_lock:
            if self._finish_route is None:
                if not self.tracking_uri.startswith(("http://", "https://")):
                    self._finish_route = False
                    return False
                routes = server_routes(self.tracking_uri, purpose="takes a run's end in one request")
                if routes is None:  # not reachable now: this run ends the long way, with the retries it needs
                    return False
                self._finish_route = routes.get("finish_route") == FINISH_ROUTE
            return self._finish_route

    def _update_run_info(self, run_id: str, status: str, end_time: int | None) -> None:
        # One UpdateRun request (MlflowClient.set_terminated/update_run fetch the whole run first): see compat.
        # Setting the same status and end time again is harmless, so a retry needs no read-back.
        self._call(
            f"setting MLflow run {run_id} to {status}",
            lambda _: update_run_status(self.client, run_id, status, end_time),
        )

    def artifact_uri(self, run_id: str) -> str:
        return self._call(
            f"reading MLflow run {run_id}", lambda _: self.client.get_run(run_id).info.artifact_uri
        )

    def log_dict(self, run_id: str, data: dict[str, Any], artifact_file: str) -> None:
        """``data`` as the JSON artifact ``artifact_file`` (e.g. "pareto_front.json") of the run."""
        # A repeated upload overwrites the same file, so a retry needs no read-back.
        self._call(
            f"uploading {artifact_file} to MLflow run {run_id}",
            lambda _: self.client.log_dict(run_id, data, artifact_file),
        )

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        # An upload that is repeated overwrites the same files.
        if os.path.isdir(local_path):
            self._call(
                f"uploading artifacts to MLflow run {run_id}",
                lambda _: self.client.log_artifacts(run_id, local_path, artifact_path),
            )
        else:
            self._call(
                f"uploading an artifact to MLflow run {run_id}",
                lambda _: self.client.log_artifact(run_id, local_path, artifact_path),
            )


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
