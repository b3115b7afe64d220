"""The local services ``sweepflow run`` starts once and reuses: a Prefect server, an MLflow server, a Dask cluster.

Prefect's ephemeral mode starts a temporary server for every flow run (9-13 s here), MLflow's SQLAlchemy store
creates/migrates its SQLite database in every process that opens it (~8 s), and a fresh Dask cluster pays its
workers' torch imports on every run. Instead the CLI keeps one of each per state directory running in the
background (see ``sweepflow.infra.services.supervisor``), checks their health and points the run at them, so every run is still a
real, recorded Prefect flow run, tracked by a real MLflow server, on a real Dask cluster.
``sweepflow server stop`` ends them. All listen on free ports on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sweepflow.infra.services import idle
from sweepflow.infra.services import supervisor as services
from sweepflow.infra.services.prefect_server import SQLITE_PAGE_CACHE_KIB

PREFECT, MLFLOW, DASK, LAUNCHER, IDLE_STOP = "prefect", "mlflow", "dask", "launcher", idle.NAME
# the launcher: see sweepflow.infra.services.launcher; the watchdog that stops the others once idle: sweepflow.infra.services.idle
LOCAL_SERVICES = (PREFECT, MLFLOW, DASK, LAUNCHER, IDLE_STOP)


def venv_executable(name: str) -> str:
    """A console script installed beside this interpreter (prefect, dask, rclone)."""
    return os.path.join(os.path.dirname(sys.executable), name)


#: Settings of every Prefect server sweepflow starts: the background one here, the stack's, and the temporary one
#: of ``sweepflow run --no-server`` (``sweepflow.flows.run_services``), which inherits them from the environment.
#: Telemetry off: nobody asked for it to be sent, and an offline machine logs "ERROR ... Failed to send
#: telemetry" at every start.
#: The task-run recorder (which turns the flows' task-run events into the task runs and states the UI shows)
#: writes up to 20 events per transaction, at least once a second, instead of one transaction per event
#: (Prefect's default batch of 1): a sweep sends three such events per trial, and at one transaction each they
#: were about half of the server's CPU per trial (benchmarks/bench_load.py, benchmarks/RESULTS.md "Batched task-run
#: states"). The price: a task run's latest state reaches the API and the UI up to a second later; nothing is
#: dropped (a batch that fails is retried, and the service flushes what it holds when it stops).
PREFECT_SERVER_SETTINGS: Mapping[str, str] = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "20",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
}


#: How ``mlflow server`` runs its app (see mlflow_server_spec): one gunicorn worker of 8 threads (requests run side
#: by side, as under uvicorn's thread pool); a request may take as long as it needs (an artifact upload through
#: the server): the worker's heartbeat does not wait for it. No bound on the request line: MLflow's UI asks for
#: metric histories with up to 100 run ids in the query string, past gunicorn's default 4094 bytes (a request
#: body, a batch of metrics, is not bounded either).
GUNICORN_OPTS = "--worker-class gthread --threads 8 --limit-request-line 0"

#: MLflow's usage telemetry off in every process sweepflow starts (its MLflow servers, Dask workers, flow
#: processes), as Prefect's analytics above: nobody asked for it to be sent, our services talk to loopback or
#: the user's own hosts only, and an MLflow server with it on fetches its UI's telemetry settings from the
#: internet when a browser opens the UI. Set MLFLOW_DISABLE_TELEMETRY=false yourself to keep it on.
MLFLOW_SETTINGS: Mapping[str, str] = {
    "MLFLOW_DISABLE_TELEMETRY": os.environ.get("MLFLOW_DISABLE_TELEMETRY", "true"),
}


def prefect_env(prefect_home: str) -> dict[str, str]:
    return {"PREFECT_HOME": prefect_home, **PREFECT_SERVER_SETTINGS}


#: The background Prefect server's loop services, slowed from every 5-20 s to every 60 s, for a server that
#: costs (almost) nothing while no run goes on (benchmarks/bench_idle_services.py). None is turned off: each
#: still does its work, a minute later at most. What they watch is rare here: ``sweepflow run`` calls its
#: flow directly (no deployment, no work pool, no schedule: the late-run, foreman and scheduler services find
#: nothing), pauses nothing, and a run cancelled from the UI is cleaned up a minute later. Scheduled
#: deployments (prefect.yaml's nightly-retrain) live on the stack, whose server keeps Prefect's defaults
#: (sweepflow.infra.services.stack). The task-run recorder and event persister, which write what the UI shows of a
#: run, keep their flush intervals (the recorder's batching, above, is every server's). Not settable here: the
#: docket worker behind these services polls its in-memory queue 4 times a second (``docket.Worker``'s
#: defaults, which Prefect does not expose).
LOCAL_PREFECT_SERVER_SETTINGS: Mapping[str, str] = {
    "PREFECT_SERVER_SERVICES_LATE_RUNS_LOOP_SECONDS": "60",
    "PREFECT_SERVER_SERVICES_PAUSE_EXPIRATIONS_LOOP_SECONDS": "60",
    "PREFECT_SERVER_SERVICES_CLEANUP_RECONCILER_LOOP_SECONDS": "60",
    "PREFECT_SERVER_SERVICES_CANCELLATION_CLEANUP_LOOP_SECONDS": "60",
    "PREFECT_SERVER_SERVICES_FOREMAN_LOOP_SECONDS": "60",
    "PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS": "60",
    "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "60",
    "PREFECT_SERVER_EVENTS_PROACTIVE_GRANULARITY": "PT60S",  # a duration (ISO 8601)
}

#: Dask settings of the background cluster (its scheduler, nannies and workers: a nanny hands its config to its
#: worker), for a cluster that costs (almost) nothing while idle. With Dask's defaults an idle cluster of two
#: workers used ~7 CPU-seconds a minute here (benchmarks/bench_idle_services.py), mostly on timers that run
#: whether or not there is work, in every process. The workers' and nannies' own timers (profiler off, health
#: check, memory and system monitors) are ddp_runtime's `TRAINING_WORKER_CONFIG`, which every training worker gets
#: from its preload; `local_dask_config` adds them (here they also quiet the scheduler's).
_LOCAL_ONLY_DASK_CONFIG: Mapping[str, Any] = {
    # The serving process's own client refreshes its view of the cluster (for a notebook widget) every 2 s.
    "distributed.client.scheduler-info-interval": "60s",
    # The scheduler keeps the last N of each of its event topics (each trial adds one to "scheduler",
    # "worker-get-client" and its run's client topic: ~1 KiB each) and of its transition log, for debugging
    # (Client.get_events, a task's story). 1000 by default: the scheduler's memory grew for the first ~1000
    # trials of a sweep (+9 MiB by trial 2000, benchmarks/bench_load.py); 200 makes it flat after ~200.
    "distributed.admin.low-level-log-length": 200,
    # Each process keeps its last N log records in memory (the dashboard's and Client.get_scheduler_logs'
    # view): 10,000 by default, which a long sweep fills; the full log is the service's log file.
    "distributed.admin.log-length": 1000,
}


def local_dask_config() -> dict[str, Any]:
    """The background cluster's Dask settings (above). A function: ddp_runtime is imported only when a cluster is
    at hand, not by every command that reads this module."""
    from ddp_runtime.worker_config import TRAINING_WORKER_CONFIG

    return {**TRAINING_WORKER_CONFIG, **_LOCAL_ONLY_DASK_CONFIG}


def server_env(state_dir: str) -> dict[str, str]:
    """Settings a client of this state dir's Prefect server shares with it."""
    return prefect_env(os.path.join(state_dir, "prefect"))


def prefect_server_spec(
    state_dir: str,
    *,
    name: str = PREFECT,
    host: str = "127.0.0.1",
    settings: Mapping[str, str] = LOCAL_PREFECT_SERVER_SETTINGS,
    port: int | None = None,
) -> services.ServiceSpec:
    """``prefect server start``, through ``sweepflow.infra.services.prefect_server`` (its SQLite page cache bounded).
    ``settings``: Prefect settings for it besides the shared ones (default: the background server's,
    ``LOCAL_PREFECT_SERVER_SETTINGS``; the stack passes none). ``port``: default, a free one (a restart passes
    the one it had: ``supervisor.previous_port``)."""
    port = port or services.free_port(host)
    api_url = f"http://{host}:{port}/api"
    os.makedirs(os.path.join(state_dir, "prefect"), exist_ok=True)
    return services.ServiceSpec(
        name=name,
        argv=[sys.executable, "-m", "sweepflow.infra.services.prefect_server", "--host", host, "--port", str(port)],
        health={"kind": "http", "url": f"{api_url}/health"},
        address=api_url,
        # The UI's API is where the page came from: Prefect's default is port 4200 whatever --port says (its UI
        # on another port showed "Something went wrong"), and a relative URL holds behind any host name.
        env={**server_env(state_dir), "PREFECT_UI_API_URL": "/api", **settings},
        # A server started by `prefect server start` (its page cache unbounded) is restarted once, not reused.
        code_key=f"sqlite_page_cache_kib={SQLITE_PAGE_CACHE_KIB}",
    )


def mlflow_app_args(app_name: str) -> list[str]:
    """The ``mlflow server`` arguments that make a server sweepflow's: ``app_name`` ("sweepflow" or
    "sweepflow-basic-auth", see mlflow_server_spec) under gunicorn. Gunicorn's threaded worker runs MLflow's
    Flask app directly; under uvicorn (MLflow's default) every request also crosses the FastAPI app and its WSGI
    bridge, which serves only MLflow's GenAI routes (AI gateway, OTLP trace ingestion, jobs, assistant): 15 % of
    the server's CPU per trial (benchmarks/RESULTS.md)."""
    return ["--gunicorn-opts", GUNICORN_OPTS, "--app-name", app_name]


def mlflow_server_spec(
    *,
    backend_store_uri: str | None,
    artifacts: str,
    proxy_artifacts: bool,
    name: str = MLFLOW,
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
    app_name: str = "sweepflow",
    port: int | None = None,
) -> services.ServiceSpec:
    """``mlflow server``. With ``proxy_artifacts`` clients upload through the server to ``artifacts`` (e.g. an
    s3:// destination only the server has credentials for); without, ``artifacts`` is the default artifact
    root that clients write to directly (a local directory here). ``app_name``: MLflow's app plugin to run,
    "sweepflow" (MLflow's server plus the route that shows a sweep report as a page of its own,
    sweepflow.tasks.reporting.report_page) or "sweepflow-basic-auth" (the same with MLflow's logins).
    ``backend_store_uri`` None: ``env`` holds it as ``MLFLOW_BACKEND_STORE_URI`` (a URL with a password must
    stay off argv, which every local user reads through ``ps``)."""
    if backend_store_uri is None and not (env or {}).get("MLFLOW_BACKEND_STORE_URI"):
        raise ValueError(
            "mlflow_server_spec: no backend store; pass backend_store_uri, or MLFLOW_BACKEND_STORE_URI in env"
        )
    port = port or services.free_port(host)
    artifact_args = (
        ["--serve-artifacts", "--artifacts-destination", artifacts]
        if proxy_artifacts
        else ["--no-serve-artifacts", "--default-artifact-root", artifacts]
    )
    url = f"http://{host}:{port}"
    return services.ServiceSpec(
        name=name,
        argv=[
            sys.executable,
            "-m",
            "sweepflow.infra.services.mlflow_server",  # `mlflow server`, a new SQLite store copied from a migrated one
            *(["--backend-store-uri", backend_store_uri] if backend_store_uri is not None else []),
            *artifact_args,
            "--host",
            host,
            "--port",
            str(port),
            "--workers",
            "1",
            *mlflow_app_args(app_name),
        ],
        health={"kind": "http", "url": f"{url}/health"},
        address=url,
        # Without this MLflow 3 also spawns a job runner and 7 consumer processes (~1.6 GB) we do not use.
        env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **MLFLOW_SETTINGS, **(env or {})},
        # A server started before it ran this app (no report route) or under uvicorn is restarted once, not reused.
        code_key=f"app={app_name};{GUNICORN_OPTS}",
    )


def local_dask_spec(
    state_dir: str,
    *,
    worker_preload: Sequence[str],
    n_workers: int | None = None,
    code_files: Sequence[str] = (),
) -> services.ServiceSpec:
    """The background LocalCluster. Its scheduler and workers keep the modules they imported (ours, and the
    training function's in ``code_files``), so it is keyed by those files and restarted when one changes.
    ``worker_preload``: modules its workers import when they start (Dask preloads; the caller's, e.g.
    ``sweepflow.tasks.WORKER_PRELOAD``), besides ddp_runtime's own."""
    ready = os.path.join(state_dir, "services", "dask.ready")
    argv = [sys.executable, "-m", "sweepflow.infra.services.local", "dask", "--ready-file", ready]
    if n_workers:
        argv += ["--n-workers", str(n_workers)]
    for module in worker_preload:
        argv += ["--preload", module]
    return services.ServiceSpec(
        name=DASK,
        argv=argv,
        health={},
        ready_file=ready,
        health_from_address=lambda address: {"kind": "tcp", "address": address},
        env=dict(MLFLOW_SETTINGS),  # the workers' MLflow clients (system metrics, evaluation, registration)
        code_key=services.code_fingerprint(extra_files=code_files, extra=[str(n_workers), *worker_preload]),
    )


def use_local_services(
    state_dir: str,
    *,
    prefect: bool,
    mlflow: bool,
    dask: bool,
    worker_preload: Sequence[str],
    n_workers: int | None = None,
    code_files: Sequence[str] = (),
    extra: Mapping[str, Callable[[], str]] | None = None,
    idle_stop_s: float = 0.0,
) -> dict[str, str]:
    """Start (or reuse), in parallel, the state dir's background services asked for, and point this process's
    Prefect client at the Prefect server (its settings go into ``os.environ``, read when prefect is imported).
    Returns their addresses by name ("prefect", "mlflow", "dask", and each of ``extra``'s). ``worker_preload``:
    see ``local_dask_spec`` (the one cluster is shared by every caller: pass the same). ``idle_stop_s``: stop
    them all once unused for that long (``sweepflow.infra.services.idle``; this process uses them while it lives);
    0: they stay up until ``sweepflow server stop``."""
    starts: dict[str, Callable[[], str]] = {}
    idle_stop = use_idle_stop(state_dir, idle_stop_s) if prefect or mlflow or dask or extra else None
    if idle_stop:
        starts[IDLE_STOP] = idle_stop
    if prefect:
        os.environ.update(server_env(state_dir))
        url = services.running(state_dir, PREFECT)
        if not url:  # its address is known before it is up, so the others can start alongside it
            spec = prefect_server_spec(state_dir, port=services.previous_port(state_dir, PREFECT, services.LOOPBACK))
            url = spec.address
            starts[PREFECT] = lambda: services.ensure(state_dir, spec)
        os.environ["PREFECT_API_URL"] = url
    if mlflow:
        starts[MLFLOW] = lambda: ensure_mlflow(state_dir)
    if dask:
        starts[DASK] = lambda: ensure_dask(
            state_dir, worker_preload=worker_preload, n_workers=n_workers, code_files=code_files
        )
    starts.update(extra or {})
    with ThreadPoolExecutor(max_workers=len(starts) or 1) as pool:
        futures = {name: pool.submit(start) for name, start in starts.items()}
        return {name: future.result() for name, future in futures.items()}


def use_idle_stop(state_dir: str, idle_stop_s: float) -> Callable[[], str] | None:
    """Call before the services are looked for: marks this process as using them (``idle.mark_used``) and
    returns what starts (or replaces) the watchdog that stops them after ``idle_stop_s`` unused, to run beside
    the other starts. With 0: stops a watchdog of an earlier setting, returns None."""
    if not idle_stop_s:
        services.stop(state_dir, IDLE_STOP)
        return None
    idle.mark_used(state_dir)
    others = [name for name in LOCAL_SERVICES if name != IDLE_STOP]
    return lambda: idle.ensure(state_dir, idle_s=idle_stop_s, stop=others)


def ensure_server(state_dir: str) -> str:
    """The API URL of this state dir's Prefect server, started in the background if needed."""
    port = services.previous_port(state_dir, PREFECT, services.LOOPBACK)
    return services.ensure(state_dir, prefect_server_spec(state_dir, port=port))


def ensure_mlflow(state_dir: str) -> str:
    """The URL of this state dir's MLflow server (SQLite + local artifacts under the state dir)."""
    spec = mlflow_server_spec(
        backend_store_uri=f"sqlite:///{os.path.join(state_dir, 'mlflow.db')}",
        artifacts=os.path.join(state_dir, "mlartifacts"),
        proxy_artifacts=False,
        # a restarted server keeps its address: a run that is using it reaches it again
        port=services.previous_port(state_dir, MLFLOW, services.LOOPBACK),
    )
    return services.ensure(state_dir, spec)


def ensure_dask(
    state_dir: str,
    *,
    worker_preload: Sequence[str],
    n_workers: int | None = None,
    code_files: Sequence[str] = (),
) -> str:
    """The scheduler address of this state dir's background LocalCluster, started (or restarted, when the code
    it runs or its ``worker_preload`` changed) if needed."""
    spec = local_dask_spec(
        state_dir, worker_preload=worker_preload, n_workers=n_workers, code_files=code_files
    )
    return services.ensure(state_dir, spec)


def status(state_dir: str) -> dict[str, str | None]:
    return {name: services.running(state_dir, name) for name in LOCAL_SERVICES}


def stop_server(state_dir: str) -> bool:
    """Stop this state dir's local services (the idle watchdog first, then the others side by side); True if
    any was recorded."""
    watchdog = services.stop(state_dir, IDLE_STOP)
    others = services.stop_side_by_side(state_dir, [name for name in LOCAL_SERVICES if name != IDLE_STOP])
    return watchdog or bool(others)


def _serve_dask(ready_file: str, n_workers: int | None, worker_preload: Sequence[str]) -> None:
    """Foreground body of the background Dask process: run a LocalCluster until SIGTERM."""
    import dask

    from ddp_runtime.cluster import local_cluster, scheduler_address

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with (
        dask.config.set(local_dask_config()),
        local_cluster(n_workers=n_workers, preload=list(worker_preload)) as client,
    ):
        with open(ready_file + ".tmp", "w") as f:
            f.write(scheduler_address(client))
        os.replace(ready_file + ".tmp", ready_file)
        stop.wait()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="run a local Dask cluster for sweepflow in the foreground")
    parser.add_argument("service", choices=["dask"])
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--n-workers", type=int, default=None)
    parser.add_argument("--preload", action="append", default=[], help="a module the workers import at start")
    args = parser.parse_args()
    _serve_dask(args.ready_file, args.n_workers, args.preload)
