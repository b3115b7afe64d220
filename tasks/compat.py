"""Every place sweepflow's tasks and flows (``sweepflow.tasks``, ``.flows``) rely on another library's internals,
or on behaviour it does not document: MLflow, Prefect, Ax (``AxSearch``). (The services' own, for Dask's HTTP
routes and CPython, are in ``sweepflow.infra.services.compat``; ddp_runtime's, for torch and Dask, in
``ddp_runtime._compat``.)

Each reliance is one function here, saying what it works around, the version it was written against and what
to do when it breaks; ``tests/repo/test_compat.py`` has a test per function that fails when the library changes
what we rely on. Upgrading one of these libraries: run ``pytest tests/repo/test_compat.py`` first.

Imports are inside the functions: the pre-flight checks import this module before a run and must stay light.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from uuid import UUID

    from mlflow.tracking import MlflowClient
    from prefect.context import TaskRunContext
    from prefect.states import State

#: ``cached_task_result`` found no usable record.
NO_RESULT: Any = type("NoResult", (), {"__repr__": lambda self: "NO_RESULT"})()

# ------------------------------------------------------------------------------------------------------ MLflow


def update_run_status(client: MlflowClient, run_id: str, status: str, end_time: int | None) -> None:
    """Set a run's status (and its end time, unless ``end_time`` is None) with one UpdateRun request.

    Works around: ``MlflowClient.set_terminated`` and ``update_run`` first fetch the whole run (params,
    metrics, tags) — to print a link, or to keep its end time — which for every trial doubled the tracking
    server's work on status changes. The store beneath them (``MlflowClient._tracking_client.store``, private)
    has ``update_run_info(run_id, run_status, end_time, run_name)``, which sends only the update. Written for
    MLflow 3.17. If it breaks: call ``client.update_run(run_id, status)`` / ``client.set_terminated(run_id,
    status, end_time)`` (correct, one extra GetRun per call).
    """
    from mlflow.entities import RunStatus

    client._tracking_client.store.update_run_info(
        run_id, run_status=RunStatus.from_string(status), end_time=end_time, run_name=None
    )


@contextmanager
def tracking_uri_scope(tracking_uri: str | None) -> Iterator[None]:
    """Point MLflow's fluent API at ``tracking_uri`` for the block, then restore exactly what was there.

    Works around: ``mlflow.pytorch.log_model`` and its registration step only use the process-global tracking
    URI. ``mlflow.get_tracking_uri()`` cannot tell a URI set with ``set_tracking_uri`` from one that only comes
    from ``MLFLOW_TRACKING_URI`` (or the default), so the global itself is read from
    ``mlflow.tracking._tracking_service.utils._tracking_uri`` (private). ``set_tracking_uri`` also writes
    ``MLFLOW_TRACKING_URI`` into ``os.environ`` (setting ``None`` deletes it; undocumented), so the variable is
    saved and put back too; MLflow's own ``_use_tracking_uri`` would drop a URI that came only from the
    environment. Written for MLflow 3.17. If it breaks: find where ``set_tracking_uri`` keeps the URI now (the
    test shows what is expected) and read it from there.
    """
    if tracking_uri is None:
        yield
        return
    import mlflow
    from mlflow.tracking._tracking_service import utils as tracking_utils

    previous_global = tracking_utils._tracking_uri
    previous_env = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous_global)
        if previous_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env


def read_run_artifact(client: MlflowClient, run_id: str, path: str) -> bytes:
    """The bytes of one file of run ``run_id``'s artifacts, with no progress bar on stderr.

    Works around: ``MlflowClient.download_artifacts`` (and ``mlflow.artifacts``) draw a tqdm progress bar on
    stderr for every download, one small file included, unless MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR is off in
    the process's environment; turning it off there and back around a read is seen by every other thread (a
    user's script's too). So the file is fetched through the run's artifact repository's ``_download_file``
    (private; every repository implements it: local, HTTP/proxied, S3, ...), found by the tracking client's
    ``_get_artifact_repo(run_id)`` (private, MLflow 3.17: how ``download_artifacts`` finds it, cached per run).
    If it breaks: find where ``ArtifactRepository.download_artifacts`` fetches one file now
    (``mlflow/store/artifact/artifact_repo.py``), or fall back to ``client.download_artifacts`` (a bar shows).
    """
    import tempfile

    repo = client._tracking_client._get_artifact_repo(run_id)
    with tempfile.TemporaryDirectory(prefix="sweepflow-artifact-") as tmp:
        local = os.path.join(tmp, os.path.basename(path) or "artifact")
        repo._download_file(path, local)
        with open(local, "rb") as f:
            return f.read()


def detach_active_run(run_id: str) -> None:
    """Take run ``run_id`` off this thread's stack of active MLflow runs without ending it.

    Works around: ``mlflow.start_run(run_id=...)`` makes an existing run the thread's active run, and the fluent
    API's only way to let go of it, ``mlflow.end_run()``, also ends it (FINISHED). ``setup_mlflow`` binds a
    trial's rank to the trial's own run, which the flow ends later with the trial's real status (and which
    lives on across a PBT exploit or a HyperBand pause), so at the training function's end the run is taken off
    the stack kept in ``mlflow.tracking.fluent._active_run_stack`` (private; a ``ThreadLocalVariable`` holding a
    list of ``ActiveRun``). Written for MLflow 3.17. If it breaks: find where the fluent API keeps its active
    runs now (``mlflow/tracking/fluent.py``), or fall back to ``mlflow.end_run()`` (the run shows FINISHED until
    the flow ends it).
    """
    from mlflow.tracking import fluent

    stack = fluent._active_run_stack.get()
    stack[:] = [active for active in stack if active.info.run_id != run_id]


def mlflow_model_name_problem(name: str) -> str | None:
    """Why MLflow would refuse ``name`` as a registered model name, or None.

    Works around: MLflow checks the name only when a model is registered (after a whole sweep); its rules
    live in the private ``mlflow.utils.validation._validate_model_name``, which the pre-flight check calls
    directly. Written for MLflow 3.17. If it breaks: copy its rules (not empty, no '/' or ':', no '..'-style
    path segments) here.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_model_name

    try:
        _validate_model_name(name)
    except MlflowException as exc:
        return exc.message
    return None


#: Modules MLflow's REST client tries to import on every request to tell whether it runs inside Databricks.
DATABRICKS_PROBES = ("dbruntime", "IPython", "pyspark")


def skip_databricks_request_headers() -> bool:
    """Outside a Databricks runtime, stop MLflow's client from asking on every request whether it runs in a
    Databricks notebook, job or cluster; returns whether it asked until now.

    Works around: each request's headers (``mlflow.tracking.request_header.registry.resolve_request_headers``)
    ask every registered header provider whether it applies; the Databricks one tries to import
    ``dbruntime.databricks_repl_context`` (five times), ``IPython`` (four) and ``pyspark``, and an import that
    fails is not remembered, so each attempt searches all of ``sys.path`` again: 0.43 ms of CPU per request
    here, in the flow process (three requests per trial) and on the workers (system metrics). Without
    ``DATABRICKS_RUNTIME_VERSION`` (MLflow's own test of a Databricks runtime) that provider never applies, so
    it is taken out of the registry: 0.001 ms per request (side by side), the same headers. Written for MLflow
    3.17 (the private ``_request_header_provider_registry._registry`` list). If it breaks: drop this (a cost,
    not an error).
    """
    from mlflow.tracking.request_header import registry
    from mlflow.tracking.request_header.databricks_request_header_provider import (
        DatabricksRequestHeaderProvider,
    )
    from mlflow.utils.databricks_utils import is_in_databricks_runtime

    if is_in_databricks_runtime():
        return False
    providers = registry._request_header_provider_registry._registry
    kept = [p for p in providers if not isinstance(p, DatabricksRequestHeaderProvider)]
    asked = len(kept) != len(providers)
    providers[:] = kept
    return asked


class MlflowServerError(RuntimeError):
    """The MLflow server answered HTTP 500: an exception in its code (not an outage, which answers 502/503/504,
    times out or refuses the connection). ``message`` is the server's own (MLflow's JSON error, or the text of
    an error page)."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(f"{endpoint} answered HTTP 500: {message}")
        self.endpoint = endpoint
        self.message = message


_server_errors = threading.local()  # .raise_at_once: this thread is inside ``mlflow_server_errors_raised()``


@contextmanager
def mlflow_server_errors_raised() -> Iterator[None]:
    """In the block, an HTTP 500 from the MLflow server raises ``MlflowServerError`` with the server's message
    at once, in this thread; other answers and failures are as MLflow's client makes them.

    Works around: MLflow's REST client (``mlflow.utils.rest_utils.http_request``) retries 500 as it retries an
    outage (urllib3's ``status_forcelist``: ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` times, backoff
    ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR``: about four minutes by default), then says "too many 500 error
    responses", the server's message lost. A server whose code raises answers the same way on every attempt.
    MLflow's store calls the module's ``http_request`` with its default ``retry_codes``, and has no setting
    for them, so the function is wrapped (once, for the process): inside this block it is called without 500
    among the retried codes, and a 500 answer becomes ``MlflowServerError``; outside it, the wrapper passes
    every call on unchanged. MLflow's stores answer a database that is away with 503 (``TEMPORARILY_UNAVAILABLE``),
    which is still retried. Written for MLflow 3.17 (``http_request``'s ``retry_codes`` keyword, its default
    ``mlflow.utils.request_utils._TRANSIENT_FAILURE_RESPONSE_CODES``, and ``call_endpoint`` calling it through the
    module). If it breaks: drop the wrapper (500s are then retried for minutes, as before).
    """
    _wrap_http_request()
    previous = getattr(_server_errors, "raise_at_once", False)
    _server_errors.raise_at_once = True
    try:
        yield
    finally:
        _server_errors.raise_at_once = previous


def _wrap_http_request() -> None:
    from mlflow.utils import rest_utils
    from mlflow.utils.request_utils import _TRANSIENT_FAILURE_RESPONSE_CODES

    original = rest_utils.http_request
    if getattr(original, "__sweepflow_wrapped__", False):
        return

    def http_request(host_creds: Any, endpoint: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if not getattr(_server_errors, "raise_at_once", False) or args:
            return original(host_creds, endpoint, method, *args, **kwargs)
        kwargs["retry_codes"] = frozenset(kwargs.get("retry_codes", _TRANSIENT_FAILURE_RESPONSE_CODES)) - {500}
        response = original(host_creds, endpoint, method, **kwargs)
        if response.status_code == 500:
            raise MlflowServerError(endpoint, server_message(response.text))
        return response

    http_request.__sweepflow_wrapped__ = True  # type: ignore[attr-defined]
    http_request.__wrapped__ = original  # type: ignore[attr-defined]
    rest_utils.http_request = http_request


def database_outages_answered_503() -> None:
    """Make this MLflow server answer 503 (``TEMPORARILY_UNAVAILABLE``, which clients retry), not 500, when a
    request failed because its database dropped or refused the connection. Call it in the server's process only.

    Works around: MLflow's SQL store turns an ``OperationalError`` in its session into 503, but several store
    methods (``log_batch`` among them, and so sweepflow's finish route) first wrap every exception as
    ``INTERNAL_ERROR``, which the server answers 500: during a PostgreSQL restart, a trial's last writes were
    refused as the server's own error, not retried, and the sweep failed (benchmarks/bench_chaos.py). Here the
    status of an ``MlflowException`` whose cause is a lost connection (SQLAlchemy marked it invalidated, or
    psycopg2 raised ``OperationalError``: refused, closed, the server starting up or shutting down) is 503;
    every other error keeps its status (a missing table stays 500, said at once). Written for MLflow 3.17
    (``MlflowException.get_http_status_code``, read by ``catch_mlflow_exception`` for each answer). If it breaks:
    find where the server maps an exception to its status now.
    """
    from mlflow.exceptions import MlflowException

    current = MlflowException.get_http_status_code
    original = getattr(current, "__wrapped__", current)

    def get_http_status_code(self: MlflowException) -> int:
        status = original(self)
        return 503 if status == 500 and lost_database_connection(self) else status

    get_http_status_code.__wrapped__ = original  # type: ignore[attr-defined]
    MlflowException.get_http_status_code = get_http_status_code  # type: ignore[method-assign]


def lost_database_connection(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception in its cause/context chain) is a database connection that was lost or
    refused: SQLAlchemy marked it invalidated, or psycopg2 raised ``OperationalError``."""
    import sqlalchemy.exc

    def pg_operational(error: object) -> bool:  # psycopg2's OperationalError, without importing the driver
        return any(
            c.__name__ == "OperationalError" and c.__module__.startswith("psycopg2") for c in type(error).__mro__
        )

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlalchemy.exc.DBAPIError) and current.connection_invalidated:
            return True
        if pg_operational(current) or pg_operational(getattr(current, "orig", None)):
            return True
        current = current.__cause__ or current.__context__
    return False


def build_mlflow_requirement_map() -> bool:
    """Build, once for this process, the map MLflow reads to check a logged model's requirements; returns
    whether it did (False: this MLflow has no such map, and the first ``log_model`` builds what it needs).

    Works around: ``log_model`` with ``pip_requirements`` checks each against the installed version
    (``mlflow.utils.requirements_utils.warn_dependency_requirement_mismatches``), and first maps every installed
    distribution to its modules by reading every distribution's file list
    (``importlib_metadata.packages_distributions``): 1.7 CPU-seconds here, once per process, nearly all of it
    one ``pathlib`` object and one ``stat`` per installed file (40,000). Built in a worker's registration
    warm-up (``finalize_on_worker.warm_registry``), it is off the registration's path, and it is built by
    ``packages_distributions`` below, which gives the same map in a third of the time (0.55 CPU-s here).
    Written for MLflow 3.17 (``_init_packages_to_modules_map``, which caches in the module, and reads
    ``requirements_utils.importlib_metadata.packages_distributions`` once). If it breaks: drop the call; the
    first registration pays the map again.
    """
    from mlflow.utils import requirements_utils

    build = getattr(requirements_utils, "_init_packages_to_modules_map", None)
    library = getattr(requirements_utils, "importlib_metadata", None)
    if build is None or library is None:
        return False
    with _REQUIREMENT_MAP_LOCK:
        requirements_utils.importlib_metadata = _FastPackageMap(library)
        try:
            build()
        finally:
            requirements_utils.importlib_metadata = library
    return True


_REQUIREMENT_MAP_LOCK = threading.Lock()


class _FastPackageMap:
    """``importlib_metadata`` as MLflow's module sees it, with ``packages_distributions`` below."""

    def __init__(self, library: Any) -> None:
        self._library = library

    def __getattr__(self, name: str) -> Any:
        return getattr(self._library, name)

    def packages_distributions(self) -> dict[str, list[str]]:
        return packages_distributions(self._library)


def packages_distributions(library: Any) -> dict[str, list[str]]:
    """``library.packages_distributions()`` (``importlib_metadata``'s or ``importlib.metadata``'s: top-level
    importable names -> the distributions that provide them), computed from each distribution's ``RECORD`` with
    string operations instead of a ``PackagePath`` and a ``locate()`` per file. A distribution without a
    ``RECORD`` (an egg-info install) is left to the library's own code. ``tests/repo/test_compat.py`` compares both
    on the installed environment."""
    import csv
    import inspect

    found: dict[str, list[str]] = {}
    for dist in library.distributions():
        declared = (dist.read_text("top_level.txt") or "").split()
        if declared:
            names = declared
        else:
            record = dist.read_text("RECORD")
            if not record:
                names = list(library._top_level_inferred(dist))  # noqa: SLF001 - the rare egg-info case
            else:
                base = str(dist.locate_file(""))
                tops = set()
                for row in csv.reader(record.splitlines()):
                    if not row or not os.path.exists(os.path.join(base, row[0])):
                        continue  # as ``Distribution.files`` skips what is not installed
                    parts = [part for part in row[0].split("/") if part not in ("", ".")]  # PurePosixPath's parts
                    if row[0].startswith("/"):
                        parts.insert(0, "/")
                    if not parts:
                        continue
                    tops.add(parts[0] if len(parts) > 1 else inspect.getmodulename(parts[0]) or parts[0])
                names = [name for name in tops if "." not in name]
        if names:
            distribution = dist.metadata["Name"]  # parsed once, not once per name
            for name in names:
                found.setdefault(name, []).append(distribution)
    return found


def server_message(body: str) -> str:
    """The message of an error answer: MLflow's JSON ``message``, else the page's text, in one bounded line."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        text = parsed["message"]
    else:
        text = re.sub(r"<[^>]*>", " ", body)
    text = " ".join(text.split())
    return (text[:500] + "...") if len(text) > 500 else (text or "(no message)")


# ----------------------------------------------------------------------------------------------------- Prefect


def cached_task_result(task_ctx: TaskRunContext | None, key: str) -> Any:
    """The result Prefect has stored for this task under cache key ``key``, or ``NO_RESULT``.

    Works around: Prefect has no hook to validate a cache hit, so a ``CachePolicy.compute_key`` that must
    refuse stale records reads them itself, through the task run context's ``result_store`` (a field of
    ``TaskRunContext``; ``ResultStore.exists``/``read`` are not documented for this use). Written for
    Prefect 3.8. If it breaks: see where the task engine keeps the result store now (``prefect/context.py``,
    ``prefect/task_engine.py``), or read the record from the task's result storage by key.
    """
    store = getattr(task_ctx, "result_store", None) if task_ctx is not None else None
    if store is None or not store.exists(key):
        return NO_RESULT
    return store.read(key).result


def forget_ended_task_run(task_run_id: UUID) -> None:
    """Let go of what Prefect's flow engine keeps in the flow's process for a task run that has ended, once its
    result has been read: a sweep submits one task run per trial and would hold all of them until the flow ends.

    Works around: the ``ThreadPoolTaskRunner`` keeps a ``threading.Event`` per submitted task run
    (``_cancel_events``, cleared only when the runner shuts down); the ``FlowRunContext`` keeps each task run's
    final State with its result (``run_results``, keyed by ``id(result)``, to draw a dependency arrow if the
    result is passed to another task) and its assets (``task_run_assets``): a few KiB per trial
    (benchmarks/bench_load.py). A trial's result is never passed on as a task argument, so no arrow is
    lost. Written for Prefect 3.9; a missing attribute is left alone (``tests/repo/test_compat.py`` fails then). If
    it breaks: see what ``ThreadPoolTaskRunner.submit`` and ``FlowRunContext`` keep per task run now.
    """
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None:
        return
    cancel_events = getattr(ctx.task_runner, "_cancel_events", None)
    if isinstance(cancel_events, dict):
        cancel_events.pop(task_run_id, None)
    ctx.task_run_assets.pop(task_run_id, None)
    ended = [key for key, (state, *_) in ctx.run_results.items() if state.state_details.task_run_id == task_run_id]
    for key in ended:
        del ctx.run_results[key]


def failed_state_exception(state: State[Any]) -> BaseException | None:
    """The exception a failed task run raised, from the state handed to a ``retry_condition_fn``.

    Relies on (undocumented): the task engine wraps the raised exception as ``Failed(data=exc)`` before calling
    ``retry_condition_fn(task, task_run, state)``; a state carrying a result record instead gives it back
    through ``state.result(raise_on_failure=False)``. Written for Prefect 3.8. If it breaks: look at
    ``can_retry`` in ``prefect/task_engine.py`` for what the state holds now.
    """
    data = state.data
    exc = data if isinstance(data, BaseException) else state.result(raise_on_failure=False)
    return exc if isinstance(exc, BaseException) else None


def stop_flow_heartbeats_promptly() -> bool:
    """Make a flow run's end stop its heartbeat thread at once instead of waiting for the thread's next
    one-second tick; returns whether Prefect's heartbeat context is now this one.

    Works around: Prefect 3.9 sends flow-run heartbeat events (``flows.heartbeat_frequency``, 180 s by default;
    what a zombie-flow automation watches) from a thread that sleeps in one-second steps (``time.sleep(1)``) and
    looks at its stop event between them. At the flow's end ``_send_heartbeats`` (private, in
    ``prefect.flow_engine``, entered by the engine's ``run_context``) sets the event and joins the thread, so
    every flow run ended 0 to 1 s late at random, after its last line and before its final state was reported
    (0.29-0.91 s of a 6-s warm ``sweepflow run``). This is the same context manager (same first heartbeat at
    the start, same frequency, no heartbeat once the run's state is final, same join bound) with the thread
    waiting on the stop event itself. Written for Prefect 3.9.1; a missing piece leaves Prefect's own in place
    (``tests/repo/test_compat.py`` fails then). If it breaks: drop this (a delay, not an error); check first whether
    Prefect's loop still sleeps in steps.
    """
    import contextvars
    import threading

    from prefect import flow_engine

    current = getattr(flow_engine, "_send_heartbeats", None)
    if getattr(current, "sweepflow_prompt", False):
        return True
    needed = ("heartbeat_seconds", "_build_heartbeat_event_template", "_emit_flow_run_heartbeat")
    engine_class = getattr(flow_engine, "BaseFlowRunEngine", None)
    if (
        current is None
        or not hasattr(flow_engine, "MINIMUM_HEARTBEAT_INTERVAL")
        or not all(hasattr(engine_class, name) for name in needed)
    ):
        return False

    @contextmanager
    def send_heartbeats(engine: Any, join_on_exit: bool = True) -> Iterator[None]:
        seconds = engine.heartbeat_seconds
        if seconds is None:
            yield
            return
        seconds = max(seconds, flow_engine.MINIMUM_HEARTBEAT_INTERVAL)
        resource, related = engine._build_heartbeat_event_template()
        stop = threading.Event()

        def beat() -> None:
            while not stop.is_set():
                state = engine.flow_run.state if engine.flow_run else None
                if state is not None and state.is_final():
                    return
                try:
                    engine._emit_flow_run_heartbeat(resource, related)
                except Exception:  # noqa: BLE001 - as Prefect's loop: a missed heartbeat is logged, the run goes on
                    engine.logger.debug("Failed to emit heartbeat", exc_info=True)
                stop.wait(seconds)

        # The caller's context (its SettingsContext: the API URL) in the thread, as Prefect's loop has it.
        thread = threading.Thread(
            target=contextvars.copy_context().run, args=(beat,), name="flow-run-heartbeat", daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            stop.set()
            if join_on_exit:
                thread.join(timeout=2)

    send_heartbeats.sweepflow_prompt = True  # type: ignore[attr-defined]
    flow_engine._send_heartbeats = send_heartbeats
    return True


def start_temporary_prefect_server(timeout_s: int) -> None:
    """Start Prefect's temporary server now and wait up to ``timeout_s`` seconds for it to answer.

    Relies on (internal): ``prefect.server.api.server.SubprocessASGIServer``, the server Prefect's clients start
    by themselves when no API URL is set (``get_client``), one per process (the instance without a port), which
    they reuse once it runs; its ``start(timeout=)`` polls ``/health`` and raises ``RuntimeError`` when the
    bound passes ("Timed out while attempting to connect ..."), its ``server_process`` is the ``Popen``, and
    ``stop()`` ends it. ``timeout_s`` counts Prefect's 0.1-s sleeps between polls, so on a loaded machine the
    wait is longer. Written for Prefect 3.9. If it breaks: set PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS
    and call ``get_client(sync_client=True)`` (which starts it), catching its ``RuntimeError``.

    Raises ``TimeoutError`` if it did not answer in time, ``ChildProcessError`` (its exit code as ``errno``) if
    it exited first; either way it is stopped.
    """
    import httpx
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    try:
        server.start(timeout=timeout_s)
    except (RuntimeError, httpx.HTTPError):  # Prefect's time-out, or the health check's 5xx at the end
        process = server.server_process
        code = process.poll() if process is not None else None
        server.stop()
        if code is not None:
            raise ChildProcessError(code, f"Prefect's temporary server exited with code {code}") from None
        raise TimeoutError(f"Prefect's temporary server did not answer within {timeout_s} s") from None


# ---------------------------------------------------------------------------------------------------------- Ax


def ax_experiment(client: Any) -> Any:
    """The ``Experiment`` of Ax's ``ax.api.Client``, or None before ``configure_experiment``: ``AxSearch`` reads a
    given Client's objective and outcome constraints, and checks points to evaluate against its search space.
    Ax 1.x has no public getter (its ``_experiment`` property raises when none is set), so this reads the
    ``_maybe_experiment`` attribute ``configure_experiment`` sets. Written for Ax 1.2 and 1.3. If it breaks: read
    the attribute Ax's ``Client._experiment`` property now returns."""
    return client._maybe_experiment


__all__ = [
    "NO_RESULT",
    "ax_experiment",
    "cached_task_result",
    "failed_state_exception",
    "start_temporary_prefect_server",
    "stop_flow_heartbeats_promptly",
    "tracking_uri_scope",
    "update_run_status",
]
