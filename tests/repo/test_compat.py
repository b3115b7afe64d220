"""What we rely on in other libraries' internals (sweepflow.tasks.compat, sweepflow.infra.services.compat,
ddp_runtime._compat): each test fails when the library stops behaving as the workaround assumes. Run this file
first after upgrading MLflow, Prefect, Dask or torch; the failing test names the function, whose docstring says
what to do."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ddp_runtime import _compat as ddp_compat
from sweepflow.infra.services import compat as services_compat
from sweepflow.tasks import compat

# ------------------------------------------------------------------------------------------------------ MLflow


def _stand_in_server(
    answer: Callable[[dict], tuple[int, dict]],
) -> Iterator[tuple[str, list[tuple[str, str, dict]]]]:
    """An HTTP server on a free loopback port that records each request (method, path, JSON body) and answers
    what ``answer(body)`` returns (status, JSON); yields its URL and the requests."""
    requests: list[tuple[str, str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            requests.append((self.command, self.path.split("?")[0], body))
            status, payload = answer(body)
            out = json.dumps(payload)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out.encode())

        do_GET = do_POST = do_PATCH = _answer

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake_tracking_server() -> Iterator[tuple[str, list[tuple[str, str, dict]]]]:
    """A stand-in for an MLflow tracking server that records each request and answers UpdateRun."""
    yield from _stand_in_server(
        lambda body: (200, {"run_info": {"run_id": body.get("run_id", ""), "status": body.get("status")}})
    )


def test_update_run_status_sends_one_update_run_request_and_nothing_else(fake_tracking_server):
    from mlflow.tracking import MlflowClient

    url, requests = fake_tracking_server
    client = MlflowClient(url)
    compat.update_run_status(client, "run-1", "FINISHED", 1234)
    compat.update_run_status(client, "run-1", "RUNNING", None)
    assert [(method, path) for method, path, _ in requests] == [("POST", "/api/2.0/mlflow/runs/update")] * 2
    finished, running = (body for _, _, body in requests)
    assert finished["run_id"] == "run-1" and finished["status"] == "FINISHED" and finished["end_time"] == 1234
    assert running["status"] == "RUNNING" and "end_time" not in running, "end_time=None must leave it alone"


def test_tracking_uri_scope_restores_the_global_and_the_environment(monkeypatch):
    import mlflow
    from mlflow.tracking._tracking_service import utils as tracking_utils

    assert hasattr(tracking_utils, "_tracking_uri"), "MLflow no longer keeps the global URI where we read it"
    monkeypatch.setattr(tracking_utils, "_tracking_uri", None)  # nothing set: the URI comes from the env
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:7")
    with compat.tracking_uri_scope("http://127.0.0.1:9"):
        assert mlflow.get_tracking_uri() == "http://127.0.0.1:9"
        # set_tracking_uri sets the private global, and writes the environment variable
        assert tracking_utils._tracking_uri == "http://127.0.0.1:9"
        assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:9"
    assert tracking_utils._tracking_uri is None
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:7"
    assert mlflow.get_tracking_uri() == "http://127.0.0.1:7"

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with compat.tracking_uri_scope("http://127.0.0.1:9"):
        assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:9"
    assert "MLFLOW_TRACKING_URI" not in os.environ and tracking_utils._tracking_uri is None


def test_read_run_artifact_reads_one_file_with_no_progress_bar(tmp_path, capfd, monkeypatch):
    """MLflow's own download draws its bar (tqdm is installed: MLflow's requirement) for one small file, by
    default and when asked to; our read of the same file through the run's artifact repository draws none, and
    changes no environment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("reads", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    source = tmp_path / "key.json"
    source.write_text('{"sweep.num_samples": 4}')
    client.log_artifact(run_id, str(source), "resume")
    for bar in (None, "true"):
        if bar is None:
            monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
        else:
            monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", bar)
        capfd.readouterr()
        client.download_artifacts(run_id, "resume/key.json", str(tmp_path / f"theirs-{bar}"))
        assert "Downloading artifacts" in capfd.readouterr().err, "MLflow no longer draws its bar: simplify the read"
        environ = dict(os.environ)
        assert compat.read_run_artifact(client, run_id, "resume/key.json") == b'{"sweep.num_samples": 4}'
        assert capfd.readouterr().err == ""
        assert dict(os.environ) == environ


def test_detach_active_run_lets_go_of_the_run_without_ending_it():
    from types import SimpleNamespace

    import mlflow
    from mlflow.tracking import fluent

    assert hasattr(fluent, "_active_run_stack"), "MLflow no longer keeps the active runs where we read them"
    stack = fluent._active_run_stack.get()
    assert isinstance(stack, list) and not stack
    ours, other = (SimpleNamespace(info=SimpleNamespace(run_id=run_id)) for run_id in ("ours", "other"))
    stack.extend([other, ours])
    try:
        assert mlflow.active_run() is ours  # what start_run(run_id=...) leaves: the run on top of the stack
        compat.detach_active_run("ours")  # no request to a server: nothing ends the run
        assert mlflow.active_run() is other and fluent._active_run_stack.get() == [other]
    finally:
        stack.clear()


@pytest.fixture
def failing_tracking_server() -> Iterator[tuple[str, list[tuple[str, str, dict]]]]:
    """A stand-in for an MLflow server whose code raises on every request: 500 with MLflow's JSON error."""
    error = {"error_code": "INTERNAL_ERROR", "message": "KeyError: 'end_time'"}
    yield from _stand_in_server(lambda body: (500, error))


def test_mlflow_server_errors_raised_gives_the_servers_500_at_once_and_only_in_its_block(
    failing_tracking_server, monkeypatch
):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    url, requests = failing_tracking_server
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    client = MlflowClient(url)
    with compat.mlflow_server_errors_raised(), pytest.raises(compat.MlflowServerError) as raised:
        client.get_run("r1")
    assert raised.value.message == "KeyError: 'end_time'" and raised.value.endpoint.endswith("/runs/get")
    assert len(requests) == 1, "a server error was retried"
    requests.clear()
    with pytest.raises(MlflowException) as outside:  # MLflow's own behaviour outside the block: retried
        client.get_run("r1")
    assert not isinstance(outside.value, compat.MlflowServerError) and len(requests) == 3


@pytest.mark.subprocess
@pytest.mark.parametrize("databricks", [False, True], ids=["elsewhere", "in-databricks"])
def test_skip_databricks_request_headers_ends_the_imports_mlflow_tries_on_every_request(databricks):
    """In a process of its own (it changes MLflow's registry): MLflow's request headers try to import the
    Databricks modules, each time; outside Databricks they stop, with the same headers; inside, nothing changes."""
    script = "\n".join(
        [
            "import builtins, json",
            "from mlflow.tracking.request_header.registry import resolve_request_headers",
            "from sweepflow.tasks.compat import DATABRICKS_PROBES, skip_databricks_request_headers",
            "real_import = builtins.__import__",
            "def probed():",
            "    tried = []",
            "    def spy(name, *args, **kwargs):",
            "        tried.append(name.partition('.')[0])",
            "        return real_import(name, *args, **kwargs)",
            "    builtins.__import__ = spy",
            "    try:",
            "        headers = resolve_request_headers()",
            "    finally:",
            "        builtins.__import__ = real_import",
            "    return sorted({n for n in tried if n in DATABRICKS_PROBES}), headers",
            "before, headers_before = probed()",
            "asked = skip_databricks_request_headers()",
            "after, headers_after = probed()",
            "print(json.dumps({'before': before, 'asked': asked, 'after': after,",
            "                  'same_headers': headers_after == headers_before}))",
        ]
    )
    env = {k: v for k, v in os.environ.items() if k != "DATABRICKS_RUNTIME_VERSION"}
    if databricks:
        env["DATABRICKS_RUNTIME_VERSION"] = "15.4"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not databricks:  # in a Databricks runtime the provider asks for other things first
        assert out["before"] == sorted(compat.DATABRICKS_PROBES), out  # MLflow still probes each, per request
    assert out["asked"] is not databricks, out
    assert out["after"] == ([] if not databricks else out["before"]), out
    assert out["same_headers"], out


# ----------------------------------------------------------------------------------------------------- Prefect


def test_cached_task_result_reads_the_record_prefect_stored_under_a_cache_key(tmp_path):
    import inspect
    from types import SimpleNamespace

    from prefect.cache_policies import CachePolicy
    from prefect.context import TaskRunContext
    from prefect.filesystems import LocalFileSystem
    from prefect.results import ResultStore

    # The task engine hands compute_key the task run context, and that context carries the result store.
    assert {"task_ctx", "inputs", "flow_parameters"} <= set(
        inspect.signature(CachePolicy.compute_key).parameters
    )
    assert "result_store" in TaskRunContext.model_fields
    store = ResultStore(result_storage=LocalFileSystem(basepath=str(tmp_path)))
    store.write({"path": "/data/prepared"}, key="key-1")
    ctx = SimpleNamespace(result_store=store)
    assert compat.cached_task_result(ctx, "key-1") == {"path": "/data/prepared"}
    assert compat.cached_task_result(ctx, "key-2") is compat.NO_RESULT
    assert compat.cached_task_result(None, "key-1") is compat.NO_RESULT


def test_forget_ended_task_run_lets_go_of_what_the_flow_engine_keeps_per_task_run(prefect_harness):
    """Without it, the flow's process keeps a cancel event, a State with its result and an assets entry per task
    run until the flow ends (one per trial of a sweep); with it, nothing of an ended task run is left."""
    from prefect import flow, task
    from prefect.context import FlowRunContext

    @task
    def trial(i: int) -> dict:
        return {"trial": i}

    def kept(ctx) -> dict[str, int]:
        return {
            "cancel events": len(ctx.task_runner._cancel_events),
            "run results": sum(v[0].state_details.task_run_id is not None for v in ctx.run_results.values()),
            "assets": len(ctx.task_run_assets),
        }

    @flow
    def sweep(n: int, forget: bool) -> dict[str, int]:
        ctx = FlowRunContext.get()
        for i in range(n):
            future = trial.submit(i)
            assert future.result() == {"trial": i}
            if forget:
                compat.forget_ended_task_run(future.task_run_id)
        return kept(ctx)

    held = sweep(5, forget=False)  # what Prefect keeps per task run
    assert held["cancel events"] == 5 and held["run results"] >= 5 and held["assets"] == 5, held
    assert sweep(5, forget=True) == {"cancel events": 0, "run results": 0, "assets": 0}
    compat.forget_ended_task_run(uuid.uuid4())  # outside a flow run: nothing to do


@pytest.mark.prefect
def test_stop_flow_heartbeats_promptly_ends_the_heartbeat_thread_without_waiting_for_its_tick(
    prefect_harness, monkeypatch
):
    """Prefect's flow-run heartbeat thread sleeps in one-second steps and the run's end joins it (0-1 s late at
    random). With the compat context, the run still sends its first heartbeat at its start, and nothing sleeps:
    the thread waits on its stop event and is gone when the flow returns."""
    from prefect import flow, flow_engine
    from prefect.settings import get_current_settings

    assert get_current_settings().flows.heartbeat_frequency is not None  # heartbeats are on (Prefect's default)
    assert compat.stop_flow_heartbeats_promptly()
    assert compat.stop_flow_heartbeats_promptly()  # in place: a second call changes nothing
    beats: list[str] = []
    monkeypatch.setattr(
        flow_engine.BaseFlowRunEngine,
        "_emit_flow_run_heartbeat",
        lambda engine, resource, related: beats.append(str(engine.flow_run.id)),
    )
    slept: list[str] = []

    class Clock:  # flow_engine's ``time`` module, noting who sleeps (Prefect's heartbeat loop did, in 1-s steps)
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            slept.append(threading.current_thread().name)
            time.sleep(seconds)

    monkeypatch.setattr(flow_engine, "time", Clock())

    @flow
    def quick() -> str:
        return "done"

    assert quick() == "done"
    assert len(beats) == 1, beats  # the heartbeat at the run's start
    assert slept == []
    assert not [t for t in threading.enumerate() if t.name == "flow-run-heartbeat"]


def test_failed_state_exception_is_what_the_task_raised():
    from prefect import task
    from prefect.client.schemas.objects import TaskRun
    from prefect.task_engine import SyncTaskRunEngine

    seen: list[BaseException | None] = []

    def retry_condition(task_, task_run, state) -> bool:
        seen.append(compat.failed_state_exception(state))
        return True

    @task(retries=1, retry_condition_fn=retry_condition)
    def flaky() -> None:
        pass

    # How the engine asks retry_condition_fn after the task raised (what a real task run goes through).
    engine = SyncTaskRunEngine(task=flaky)
    engine.task_run = TaskRun(task_key="flaky", dynamic_key="0", name="flaky-0", flow_run_id=None)
    raised = ConnectionError("the mirror is down")
    assert engine.can_retry(raised) is True
    assert len(seen) == 1 and seen[0] is raised


# ----------------------------------------------------------------------------------------------- Dask (shared)

GATES: dict[str, threading.Event] = {}
RUNNING: dict[str, tuple[Any, Any]] = {}  # gate name -> (the worker, the task's key), set by the task


def _wait_at_gate(name: str) -> str:
    from distributed import get_worker

    worker = get_worker()
    RUNNING[name] = (worker, worker.get_current_task())
    GATES[name].wait(60)
    return name


def _fail() -> None:
    raise ValueError("this task fails")


async def _eventually(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _with_cluster(body: Callable[[Any, list[Any], Any], Awaitable[None]], **worker_kwargs: Any) -> None:
    """Run ``body(scheduler, workers, client)`` against an in-process scheduler with two named workers."""
    from distributed import Client, Scheduler, Worker

    async def main() -> None:
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as scheduler:
            async with (
                Worker(scheduler.address, nthreads=1, name="w0", **worker_kwargs) as w0,
                Worker(scheduler.address, nthreads=1, name="w1", **worker_kwargs) as w1,
                Client(scheduler.address, asynchronous=True) as client,
            ):
                try:
                    await body(scheduler, [w0, w1], client)
                finally:
                    for gate in GATES.values():
                        gate.set()  # never leave a worker thread blocked

    asyncio.run(main())


def test_build_mlflow_requirement_map_builds_the_map_log_models_requirement_check_reads(monkeypatch):
    """``compat.build_mlflow_requirement_map`` (run in a worker's registration warm-up) builds MLflow's package
    map; the requirement check ``log_model`` runs then reads it and scans no installed distribution again."""
    import torch
    from mlflow.utils import requirements_utils

    ours = []
    fast = compat.packages_distributions
    monkeypatch.setattr(compat, "packages_distributions", lambda library: ours.append(1) or fast(library))
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)  # as in a process that built none yet
    assert compat.build_mlflow_requirement_map() is True
    assert ours == [1], "MLflow built its map without compat.packages_distributions"
    assert "torch" in requirements_utils._PACKAGES_TO_MODULES

    scans = []
    real = requirements_utils.importlib_metadata.packages_distributions
    monkeypatch.setattr(
        requirements_utils.importlib_metadata, "packages_distributions", lambda: scans.append(1) or real()
    )
    version = torch.__version__.split("+")[0]
    requirements_utils.warn_dependency_requirement_mismatches([f"torch=={version}", "numpy"])
    assert scans == [], "the requirement check mapped the installed packages again"


def test_packages_distributions_gives_the_librarys_own_map_of_the_installed_environment():
    """``compat.packages_distributions`` (how ``build_mlflow_requirement_map`` maps the installed distributions
    to their modules, fast) against the libraries' own ``packages_distributions``, on this environment: its
    ~100 distributions with and without ``top_level.txt``, sweepflow's editable install among them."""
    import importlib.metadata

    import importlib_metadata

    # Python 3.10's importlib.metadata reads top_level.txt only (3.11 added the RECORD inference MLflow's backport
    # has); MLflow uses the backport, so that is the map to match there.
    libraries = (importlib_metadata, importlib.metadata) if sys.version_info >= (3, 11) else (importlib_metadata,)
    for library in libraries:
        expected = library.packages_distributions()
        assert compat.packages_distributions(library) == expected
    assert expected["torch"] == ["torch"] and "sweepflow" in expected.get("ddp_runtime", [])


def test_database_outages_answered_503_only_for_a_lost_database_connection(monkeypatch):
    import sqlite3

    import psycopg2
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INTERNAL_ERROR

    monkeypatch.setattr(MlflowException, "get_http_status_code", MlflowException.get_http_status_code)

    def wrapped_as_log_batch_does(error: Exception) -> MlflowException:
        try:
            try:
                raise error
            except Exception as e:  # noqa: BLE001 - as MLflow's log_batch does: the cause is only __context__
                raise MlflowException(e, INTERNAL_ERROR)  # noqa: B904
        except MlflowException as wrapped:
            return wrapped

    closed = sqlalchemy.exc.OperationalError(
        "INSERT ...", {}, psycopg2.OperationalError("server closed the connection unexpectedly")
    )
    no_table = sqlalchemy.exc.OperationalError("SELECT ...", {}, sqlite3.OperationalError("no such table: runs"))
    assert wrapped_as_log_batch_does(closed).get_http_status_code() == 500  # MLflow's own: the gap
    compat.database_outages_answered_503()
    compat.database_outages_answered_503()  # twice: wraps MLflow's method once
    assert wrapped_as_log_batch_does(closed).get_http_status_code() == 503
    assert wrapped_as_log_batch_does(no_table).get_http_status_code() == 500  # a broken schema: at once
    assert MlflowException("a bug", INTERNAL_ERROR).get_http_status_code() == 500
    assert MlflowException.invalid_parameter_value("bad").get_http_status_code() == 400


def test_an_api_exception_escaping_mlflows_handler_is_503_for_a_lost_database_and_json_500_otherwise():
    """The store's rollback on a connection PostgreSQL closed raises SQLAlchemy's OperationalError past MLflow's
    own handler (the chaos soak's restart): that is an outage the client retries, not the server's own error."""
    import psycopg2
    import sqlalchemy.exc
    from flask import Flask
    from werkzeug.exceptions import InternalServerError

    from sweepflow.tasks.tracking.server_auth import server_error_answer

    app = Flask("server-errors")
    app.register_error_handler(InternalServerError, server_error_answer)
    closed = psycopg2.OperationalError("server closed the connection unexpectedly")
    errors = {
        "rollback": sqlalchemy.exc.OperationalError("ROLLBACK", {}, closed),
        "bug": RuntimeError("no such column: runs.lifecycle_stage"),
    }

    def raising(name: str):
        raise errors[name]

    app.add_url_rule("/api/2.0/mlflow/<name>", "raising", raising, methods=["POST"])
    app.add_url_rule("/ui/<name>", "ui", raising)
    client = app.test_client()
    outage = client.post("/api/2.0/mlflow/rollback")
    assert outage.status_code == 503 and outage.json["error_code"] == "TEMPORARILY_UNAVAILABLE", outage.data
    assert "server closed the connection" in outage.json["message"]
    bug = client.post("/api/2.0/mlflow/bug")
    assert bug.status_code == 500 and bug.json["error_code"] == "INTERNAL_ERROR", bug.data
    assert bug.json["message"] == "RuntimeError: no such column: runs.lifecycle_stage"
    assert client.get("/ui/bug").status_code == 500  # not an API path: Flask's own page


def test_retry_database_connection_errors_answers_503_to_a_refused_database_and_500_to_a_bug(monkeypatch):
    import prefect.server.api.server as server

    monkeypatch.setattr(server, "is_client_retryable_exception", server.is_client_retryable_exception)
    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")  # what asyncpg raises

    def status(exc: Exception) -> int:
        return asyncio.run(server.custom_internal_exception_handler(None, exc)).status_code  # type: ignore[arg-type]

    assert status(refused) == 500  # Prefect's own handler: the gap this closes
    services_compat.retry_database_connection_errors()
    services_compat.retry_database_connection_errors()  # twice: wraps Prefect's check once
    assert status(refused) == 503
    assert status(ConnectionResetError()) == 503 and status(TimeoutError()) == 503
    assert status(ValueError("a bug")) == 500 and status(FileNotFoundError("x")) == 500
    assert server.is_client_retryable_exception.__wrapped__.__module__ == "prefect.server.api.server"


def test_an_outage_error_escaping_the_handlers_is_answered_503(monkeypatch):
    import prefect.server.api.server as server
    from starlette.applications import Starlette
    from starlette.routing import Route
    from starlette.testclient import TestClient

    monkeypatch.setattr(server, "is_client_retryable_exception", server.is_client_retryable_exception)
    monkeypatch.setattr(server, "create_app", server.create_app)
    services_compat.retry_database_connection_errors()
    assert server.create_app.__wrapped__.__module__ == "prefect.server.api.server"

    def refused(request):
        raise ConnectionRefusedError(111, "Connect call failed")

    def bug(request):
        raise ValueError("a bug")

    app = Starlette(routes=[Route("/refused", refused), Route("/bug", bug)])
    app.add_middleware(services_compat.OutageAnswer)
    with TestClient(app, raise_server_exceptions=False) as client:
        answer = client.get("/refused")
        assert answer.status_code == 503 and answer.json() == {"exception_message": "Service Unavailable"}
        assert client.get("/bug").status_code == 500


@pytest.mark.dask
def test_the_worker_names_route_lists_the_workers_while_a_heartbeat_carries_task_metrics():
    """``serve_dask_worker_names`` (through the scheduler preload ``sweepflow.infra.services.dask_worker_names``): the
    route the stack's probe of each `dask worker` service reads lists the workers by name, also while a worker's
    metrics hold tuple-keyed digests, as a heartbeat after a task leaves them (Dask's identity document cannot
    be encoded then)."""
    from sweepflow.infra.services import dask_worker_names
    from sweepflow.infra.services.supervisor import dask_worker_registered

    async def body(scheduler, workers, client) -> None:
        dask_worker_names.dask_setup(scheduler)
        url = f"http://127.0.0.1:{scheduler.http_server.port}{dask_worker_names.PATH}"
        assert await asyncio.to_thread(dask_worker_registered, url, "w0")
        assert await asyncio.to_thread(dask_worker_registered, url, "w1")
        assert not await asyncio.to_thread(dask_worker_registered, url, "w2")
        digests = {("execute", "trial", "thread-cpu", "seconds"): 0.5}
        for worker in scheduler.workers.values():
            worker.metrics = {**worker.metrics, "digests_total_since_heartbeat": digests}
        assert await asyncio.to_thread(dask_worker_registered, url, "w1")
        assert not await asyncio.to_thread(dask_worker_registered, url.replace(dask_worker_names.PATH, "/nope"), "w1")

    _with_cluster(body)


# ------------------------------------------------------------------------------------- Dask (ddp_runtime._compat)


@pytest.mark.dask
def test_scheduler_state_the_gang_scheduler_reads():
    async def body(scheduler, workers, client) -> None:
        w0, _ = workers
        GATES["held"] = threading.Event()
        future = client.submit(_wait_at_gate, "held", key="not-a-rank", resources={"GPU": 1}, pure=False)
        await _eventually(lambda: "held" in RUNNING, "the task to start")
        ws = next(
            ws
            for ws in ddp_compat.running_workers(scheduler)
            if "not-a-rank" in ddp_compat.processing_keys(ws)
        )
        assert {w.address for w in ddp_compat.running_workers(scheduler)} == {w.address for w in workers}
        assert ddp_compat.used_resources(ws) == {"GPU": 1}
        assert ws.nthreads == 1 and ws.resources == {"GPU": 1} and ws.host == "127.0.0.1"
        assert ddp_compat.has_worker(scheduler, ws.address)
        assert not ddp_compat.has_worker(scheduler, "tcp://127.0.0.1:1")
        GATES["held"].set()
        assert await future == "held"
        await _eventually(lambda: not ddp_compat.processing_keys(ws), "the task to leave the worker")
        assert ddp_compat.used_resources(ws).get("GPU", 0) == 0
        await w0.close()
        await _eventually(lambda: not ddp_compat.has_worker(scheduler, w0.address), "the worker to be gone")
        assert [w.address for w in ddp_compat.running_workers(scheduler)] == [workers[1].address]

    _with_cluster(body, resources={"GPU": 1})


@pytest.mark.dask
def test_scheduler_singleton_keeps_one_object_per_scheduler():
    async def body(scheduler, workers, client) -> None:
        made = []
        first = ddp_compat.scheduler_singleton(
            scheduler, "sweepflow-test", lambda: made.append(1) or object()
        )
        again = ddp_compat.scheduler_singleton(
            scheduler, "sweepflow-test", lambda: made.append(1) or object()
        )
        assert first is again and made == [1]

    _with_cluster(body)


@pytest.mark.dask
def test_a_task_that_stops_running_on_its_worker_leaves_processing():
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Recorder(SchedulerPlugin):
        def __init__(self) -> None:
            self.seen: list[tuple[str, str, str]] = []

        def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
            self.seen.append((key, start, finish))

    async def body(scheduler, workers, client) -> None:
        recorder = Recorder()
        scheduler.add_plugin(recorder, name="sweepflow-test-recorder")
        await client.submit(len, [1], key="returns", pure=False)
        with pytest.raises(ValueError):
            await client.submit(_fail, key="raises", pure=False)
        GATES["cancelled"], GATES["lost"] = threading.Event(), threading.Event()
        cancelled = client.submit(_wait_at_gate, "cancelled", key="cancelled", pure=False)
        lost = client.submit(_wait_at_gate, "lost", key="worker-lost", pure=False)
        await _eventually(lambda: "cancelled" in RUNNING and "lost" in RUNNING, "both tasks to start")
        await cancelled.cancel()
        lost_worker = RUNNING["lost"][0].address
        # What the scheduler does when a worker dies (its connection breaks):
        await scheduler.remove_worker(lost_worker, stimulus_id="sweepflow-test", close=False)
        for key in ("returns", "raises", "cancelled", "worker-lost"):
            await _eventually(
                lambda key=key: any(
                    k == key and ddp_compat.task_left_its_worker(s, f) for k, s, f in recorder.seen
                ),
                f"a transition that ends {key!r} on its worker; seen: {recorder.seen}",
            )
        lost.release()

    _with_cluster(body)


@pytest.mark.dask
def test_task_abandoned_once_its_client_cancels_it():
    async def body(scheduler, workers, client) -> None:
        GATES["abandoned"] = threading.Event()
        future = client.submit(_wait_at_gate, "abandoned", key="rank-task", pure=False)
        await _eventually(lambda: "abandoned" in RUNNING, "the task to start")
        worker, key = RUNNING["abandoned"]
        assert key == "rank-task"
        assert not ddp_compat.task_abandoned(worker, key)
        await future.cancel()
        await _eventually(
            lambda: ddp_compat.task_abandoned(worker, key),
            f"the worker to mark the task given up (its state: {worker.state.tasks.get(key)})",
        )

    _with_cluster(body)


@pytest.mark.dask
def test_runs_alone_in_its_process_is_false_for_a_worker_without_a_nanny():
    async def body(scheduler, workers, client) -> None:
        w0, _ = workers
        # In-process workers (no nanny) share this process with each other and the client.
        assert w0.nanny is None and w0.state.nthreads == 1
        assert not ddp_compat.runs_alone_in_its_process(w0)
        # What a nanny's worker process with one task thread looks like (tests/flows/tune/test_tune.py runs trials there).
        w0.nanny = "tcp://127.0.0.1:1"
        try:
            assert ddp_compat.runs_alone_in_its_process(w0)
        finally:
            w0.nanny = None

    _with_cluster(body)


@pytest.mark.dask
def test_scheduler_address_of_a_client():
    async def body(scheduler, workers, client) -> None:
        assert ddp_compat.scheduler_address(client) == scheduler.address

    _with_cluster(body)


@pytest.mark.dask
def test_client_singleton_keeps_one_object_per_client():
    from distributed import Client

    async def body(scheduler, workers, client) -> None:
        made = []
        first = ddp_compat.client_singleton(client, "sweepflow-test", lambda: made.append(1) or object())
        again = ddp_compat.client_singleton(client, "sweepflow-test", lambda: made.append(1) or object())
        assert first is again and made == [1]
        async with Client(scheduler.address, asynchronous=True) as other:
            assert ddp_compat.client_singleton(other, "sweepflow-test", object) is not first

    _with_cluster(body)


@pytest.mark.dask
def test_future_of_key_resolves_a_key_another_client_computed():
    from distributed import Client

    async def body(scheduler, workers, client) -> None:
        made = client.submit(lambda: 41 + 1, key="ddp_runtime-compat-key")
        assert await made == 42
        async with Client(scheduler.address, asynchronous=True) as other:
            future = ddp_compat.future_of_key(other, "ddp_runtime-compat-key")
            assert await asyncio.wait_for(future, 10) == 42

    _with_cluster(body)


# ------------------------------------------------------------------------------------------------------ torch


def test_tcp_store_on_free_port_binds_a_port_a_peer_can_reach():
    import torch.distributed as dist

    master, port = ddp_compat.tcp_store_on_free_port("127.0.0.1", 2, timedelta(seconds=30))
    assert isinstance(port, int) and port > 0
    peer = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=30))
    master.set("rendezvous", "ok")
    assert peer.get("rendezvous") == b"ok"


_DDP_PROBE = """
import json, sys
from datetime import timedelta
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
before = "torch._dynamo" in sys.modules
if sys.argv[1] == "optimizer":
    torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
else:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30))
    DistributedDataParallel(torch.nn.Linear(2, 2))
    dist.destroy_process_group()
after = "torch._dynamo" in sys.modules
from ddp_runtime._compat import warm_torch_imports
warm_torch_imports()
print(json.dumps({"before": before, "after": after, "warmed": "torch._dynamo" in sys.modules}))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("first", ["optimizer", "ddp"])
def test_warm_torch_imports_imports_what_the_first_optimizer_and_the_first_ddp_import(first):
    proc = subprocess.run([sys.executable, "-c", _DDP_PROBE, first], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not seen["before"], seen
    assert seen["after"], f"the first {first} no longer imports torch._dynamo: the start-up's warm-up is moot ({seen})"
    assert seen["warmed"]


_FORK_SERVER_PROBE = """
import json, multiprocessing.forkserver, sys
import dask.config
from distributed.utils import get_mp_context
from ddp_runtime._compat import set_fork_server_imports
set_fork_server_imports(["torch", "distributed"])
with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
    context = get_mp_context()  # as each nanny asks for it when it starts a worker
print(json.dumps({
    "kind": type(context).__name__,
    "preload": multiprocessing.forkserver._forkserver._preload_modules,
    "pandas": "pandas" in sys.modules,
}))
"""


@pytest.mark.subprocess
def test_set_fork_server_imports_sets_a_list_dasks_nannies_keep():
    """In a process of its own: the fork server's list is process-wide."""
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_SERVER_PROBE], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    # ... and Dask did not import its optional packages here to build a list of its own.
    assert seen == {"kind": "ForkServerContext", "preload": ["torch", "distributed"], "pandas": False}, seen


# ------------------------------------------------------------------------------------------------- the stdlib


def test_queued_items_shows_the_queue_without_consuming_it():
    q: queue.Queue[int] = queue.Queue()
    for item in (1, 2, 3):
        q.put(item)
    q.get()
    assert ddp_compat.queued_items(q) == [2, 3]
    assert q.qsize() == 2 and q.get_nowait() == 2


def test_run_atexit_handlers_runs_them_before_os_exit():
    script = (
        "import atexit, os\n"
        "from sweepflow.infra.services.compat import run_atexit_handlers\n"
        "atexit.register(print, 'flushed', flush=True)\n"
        "run_atexit_handlers()\n"
        "os._exit(0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["flushed"]


# ------------------------------------------------------------------------ Prefect (its temporary server)


@pytest.mark.prefect
@pytest.mark.subprocess
def test_start_temporary_prefect_server_gives_up_at_its_bound_and_stops_the_server(tmp_path):
    """In a process of its own: Prefect keeps one temporary server per process (a test harness's, here)."""
    script = "\n".join(
        [
            "import psutil",
            "from sweepflow.tasks.compat import start_temporary_prefect_server",
            "try:",
            "    start_temporary_prefect_server(1)",  # its imports alone take longer
            "except TimeoutError as exc:",
            "    print('gave up:', exc)",
            "print('stopped:', not psutil.Process().children(recursive=True))",
        ]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path), PREFECT_SERVER_EPHEMERAL_ENABLED="true")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gave up: Prefect's temporary server did not answer within 1 s" in proc.stdout, proc.stdout
    assert "stopped: True" in proc.stdout, proc.stdout


# ---------------------------------------------------------------------------------------- Prefect (its server)


@pytest.mark.prefect
@pytest.mark.subprocess
def test_bound_prefect_sqlite_page_cache_sets_the_cache_of_every_connection_prefect_opens(tmp_path):
    """In a process of its own (the patch is for a server's whole life): Prefect's engine sets 20,000 pages on
    a connection; bounded, the same engine's connections get ours, also when bounded twice."""
    script = "\n".join(
        [
            "import asyncio, sys",
            "from prefect.server.database.configurations import AioSqliteConfiguration",
            "from sweepflow.infra.services.compat import bound_prefect_sqlite_page_cache",
            "async def cache_size(url):",
            "    engine = await AioSqliteConfiguration(connection_url=url).engine()",
            "    async with engine.connect() as conn:",
            "        size = (await conn.exec_driver_sql('PRAGMA cache_size')).scalar()",
            "    await engine.dispose()",
            "    return size",
            "print('prefect:', asyncio.run(cache_size(sys.argv[1])))",
            "bound_prefect_sqlite_page_cache(4096)",
            "bound_prefect_sqlite_page_cache(2048)",
            "print('bounded:', asyncio.run(cache_size(sys.argv[2])))",
        ]
    )
    urls = [f"sqlite+aiosqlite:///{tmp_path / name}" for name in ("a.db", "b.db")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", script, *urls], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["prefect: 20000", "bounded: -2048"], proc.stdout


def test_prefect_block_types_key_names_prefects_version_and_its_installed_collections(monkeypatch):
    """The template's name changes with what decides the block types a server registers. (That the template then
    holds exactly what a server's start-up registers, ``register_prefect_block_types``, is checked on a real
    temporary server in test_cli's ``test_no_servers_temporary_server_sends_no_telemetry``.)"""
    import importlib.metadata as metadata

    from sweepflow.infra.services.compat import prefect_block_types_key

    assert prefect_block_types_key() == metadata.version("prefect")  # no Prefect collection installed here

    class Dist:
        name, version = "prefect-aws", "0.5.0"

    class EntryPoint:
        dist = Dist()

    monkeypatch.setattr(metadata, "entry_points", lambda group: [EntryPoint()] if group == "prefect.collections" else [])
    with_aws = prefect_block_types_key()
    assert with_aws.startswith(metadata.version("prefect") + "-") and len(with_aws.split("-")[-1]) == 12
    Dist.version = "0.6.0"
    assert prefect_block_types_key() != with_aws


@pytest.mark.mlflow_server
def test_fork_mlflow_gunicorn_serves_from_a_fork_of_the_command_and_stops_with_it(tmp_path):
    """``sweepflow.infra.services.compat.fork_mlflow_gunicorn`` (through ``python -m sweepflow.infra.services.mlflow_server``):
    the gunicorn master and its worker are forks of MLflow's command (same command line, no ``-m gunicorn``
    process), the worker opens its own store and serves writes and reads, and SIGTERM to the command stops them
    all. Fails if MLflow starts its gunicorn otherwise (a ``-m gunicorn`` child appears)."""
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    import psutil
    from mlflow.tracking import MlflowClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [
        sys.executable, "-m", "sweepflow.infra.services.mlflow_server",
        "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db", "--no-serve-artifacts",
        "--default-artifact-root", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--gunicorn-opts", "--worker-class gthread --threads 2 --graceful-timeout 3",
        "--app-name", "sweepflow",
    ]  # fmt: skip
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not answer within 120 s"
                time.sleep(0.1)
        tree = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
        assert len(tree) == 3 and all(p.cmdline() == tree[0].cmdline() for p in tree), [p.cmdline() for p in tree]

        client = MlflowClient(f"http://127.0.0.1:{port}")
        run = client.create_run(client.create_experiment("forked"))
        for step in range(5):
            client.log_metric(run.info.run_id, "loss", 1.0 / (step + 1), step=step)
        assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1, 2, 3, 4]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)  # gunicorn's graceful stop: at most 3 s for the client's keep-alive connection
        finally:
            log.close()
            for process in tree:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    process.kill()
    assert server.returncode == 0
    assert not [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_main_not_rerun_in_leaves_the_main_module_out_of_that_process_names_preparation_only(monkeypatch, tmp_path):
    """``ddp_compat.main_not_rerun_in``: multiprocessing still sends a child the main module (by name or path)
    under the keys we leave out, and only the named processes lose them, only inside the block. The main module
    is a script's here (pytest's own, or an xdist worker's, may have neither a file nor a spec)."""
    from multiprocessing import spawn

    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__spec__", None, raising=False)
    monkeypatch.setattr(main, "__file__", str(tmp_path / "script.py"), raising=False)
    keys = {"init_main_from_name", "init_main_from_path"}
    assert keys & set(spawn.get_preparation_data("probe")), "multiprocessing no longer sends the main module so"
    with ddp_compat.main_not_rerun_in("probe"):
        assert not keys & set(spawn.get_preparation_data("probe"))
        assert keys & set(spawn.get_preparation_data("another"))
    assert keys & set(spawn.get_preparation_data("probe"))


def test_dask_names_its_nannys_worker_process_as_main_not_rerun_in_is_told(cluster):
    import multiprocessing

    names = cluster.run(lambda: multiprocessing.current_process().name)
    assert set(names.values()) == {ddp_compat.NANNY_WORKER_PROCESS_NAME}, names


# ---------------------------------------------------------------------------------------------------------- Ax


def test_ax_experiment_is_none_before_configure_experiment_and_the_clients_experiment_after():
    pytest.importorskip("ax")
    from ax.api import Client
    from ax.api.configs import RangeParameterConfig

    client = Client()
    assert compat.ax_experiment(client) is None
    client.configure_experiment(parameters=[RangeParameterConfig(name="x", parameter_type="float", bounds=(0.0, 1.0))])
    experiment = compat.ax_experiment(client)
    assert experiment is client._experiment and list(experiment.search_space.parameters) == ["x"]
