"""A real ``mlflow server`` subprocess for tests: SQLite backend, free loopback port, always stopped.

Tests talk to a real server rather than a ``file:``/``sqlite:`` store because that is what the flows use in
production: the REST client, the model registry, alias resolution (``models:/NAME@champion``) and artifact
URIs all behave differently through the server, and those differences are what the tests must catch.

Two artifact modes, because they give clients different artifact URIs:

* **proxied** (default): ``--artifacts-destination DIR`` — clients see ``mlflow-artifacts:/...`` URIs and
  upload/download through the server; only the server needs storage credentials.
* **direct**: ``--no-serve-artifacts --default-artifact-root DIR_OR_S3`` — clients get the real ``file://``
  or ``s3://`` URI and read/write storage themselves (so they need the credentials too, e.g.
  ``MLFLOW_S3_ENDPOINT_URL`` and ``AWS_*`` in their own environment).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from sweepflow.infra.services.local import mlflow_app_args

__all__ = ["MlflowServerError", "mlflow_server", "run_mlflow_server", "sqlite_store"]

#: A fresh SQLite DB takes ~9 s to migrate and start on a 2-core machine; leave room for a loaded CI box.
STARTUP_TIMEOUT_S = 90.0
#: Time given to the server to exit after SIGTERM before its process group is killed.
STOP_TIMEOUT_S = 10.0
#: Start attempts: the free port is picked before the server binds it, so another process can take it.
START_ATTEMPTS = 3
LOG_TAIL_CHARS = 4000


_TEMPLATE_LOCK = threading.Lock()
_template_db: Path | None = None


def sqlite_store(directory: str | os.PathLike[str]) -> str:
    """A migrated, empty MLflow SQLite store at ``directory/mlflow.db``; returns its tracking URI.

    A new store runs MLflow's ~60 schema migrations (5-8 s on a 2-core machine). They run once per test
    session, into a template that each caller copies: the copy is the same file a fresh store would be.
    """
    global _template_db
    with _TEMPLATE_LOCK:
        if _template_db is None:
            from mlflow.tracking import MlflowClient

            template_dir = Path(tempfile.mkdtemp(prefix="sweepflow-mlflow-template-"))
            atexit.register(shutil.rmtree, template_dir, ignore_errors=True)
            MlflowClient(f"sqlite:///{template_dir / 'mlflow.db'}").search_experiments()  # creates + migrates
            _template_db = template_dir / "mlflow.db"
    target = Path(directory).resolve()
    target.mkdir(parents=True, exist_ok=True)
    db = target / "mlflow.db"
    if not db.exists():
        shutil.copyfile(_template_db, db)
    return f"sqlite:///{db}"


class MlflowServerError(RuntimeError):
    """The MLflow server did not come up; the message carries the tail of its log."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mlflow_command() -> list[str]:
    """The venv's ``mlflow`` next to the running interpreter, so the server matches the client's version.

    Falls back to ``python -m mlflow`` when the console script is not installed there (e.g. a system
    interpreter with mlflow in user site-packages).
    """
    script = Path(sys.executable).with_name("mlflow")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "mlflow"]


def _log_tail(log_path: Path) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except FileNotFoundError:
        return "<no log written>"
    return text[-LOG_TAIL_CHARS:]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (uvicorn/gunicorn workers included), then SIGKILL it if needed."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait(timeout=STOP_TIMEOUT_S)


def _start(cmd: list[str], env: Mapping[str, str], log_path: Path, url: str) -> subprocess.Popen[bytes]:
    """Start one server and wait for ``/health``; stop it and raise if it exits or does not answer in time."""
    with open(log_path, "ab") as log:
        log.write(f"\n$ {' '.join(cmd)}\n".encode())
        log.flush()
        # Own session = own process group, so stopping reaches the worker processes the server forks.
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,
        )
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise MlflowServerError(
                f"mlflow server exited with code {proc.returncode} before answering {url}/health. "
                f"Log {log_path} ends with:\n{_log_tail(log_path)}"
            )
        if _healthy(url):
            return proc
        time.sleep(0.25)
    _stop(proc)
    raise MlflowServerError(
        f"mlflow server did not answer {url}/health within {STARTUP_TIMEOUT_S:.0f} s (a slow machine? raise "
        f"STARTUP_TIMEOUT_S in {__file__}). Log {log_path} ends with:\n{_log_tail(log_path)}"
    )


def basic_auth_env(
    state: os.PathLike[str], *, admin: str, password: str, default_permission: str
) -> dict[str, str]:
    """The environment of an ``mlflow server`` running MLflow's basic-auth app (``--app-name basic-auth`` or
    ours, ``sweepflow-basic-auth``): its config file and user database in ``state``, ``admin`` as the admin."""
    config = Path(state) / "basic_auth.ini"
    config.write_text(
        f"[mlflow]\ndefault_permission = {default_permission}\n"
        f"database_uri = sqlite:///{Path(state) / 'auth.db'}\n"
        f"admin_username = {admin}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(config),
        "MLFLOW_AUTH_ADMIN_USERNAME": admin,
        "MLFLOW_AUTH_ADMIN_PASSWORD": password,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
    }


@contextmanager
def run_mlflow_server(
    state_dir: str,
    *,
    artifacts_destination: str | None = None,
    default_artifact_root: str | None = None,
    env: dict | None = None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[str]:
    """Run a real ``mlflow server`` on 127.0.0.1 for the duration of the block; yield its tracking URI.

    Args:
        state_dir: Directory for the SQLite DB (``mlflow.db``), the server log (``mlflow-server.log``) and,
            in proxied mode, the default artifact store (``artifacts/``). Created if missing.
        artifacts_destination: Proxied mode (the default): where the server stores artifacts it proxies
            (a directory or ``s3://bucket/prefix``). Defaults to ``<state_dir>/artifacts``.
        default_artifact_root: Direct mode: ``--no-serve-artifacts`` with this artifact root (a directory,
            ``file://`` URI or ``s3://...``); clients read and write it themselves.
        env: Extra environment for the server process only (e.g. ``MLFLOW_S3_ENDPOINT_URL``, ``AWS_*``).
        extra_args: More ``mlflow server`` arguments (e.g. ``("--app-name", "basic-auth")``).

    The server runs with ``--workers 1`` and ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`` (otherwise MLflow 3
    spawns a job runner and consumers, ~1.6 GB); it is stopped (SIGTERM, then SIGKILL, whole process group)
    however the block exits.
    """
    if artifacts_destination is not None and default_artifact_root is not None:
        raise ValueError(
            "Pass either artifacts_destination (proxied artifacts) or default_artifact_root (clients access "
            "storage directly), not both: the server cannot do both for new experiments."
        )
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    log_path = state / "mlflow-server.log"
    sqlite_store(state)  # migrated once per session, not by every server's start-up

    base = [*_mlflow_command(), "server", "--backend-store-uri", f"sqlite:///{state / 'mlflow.db'}"]
    if default_artifact_root is not None:
        base += ["--no-serve-artifacts", "--default-artifact-root", default_artifact_root]
    else:
        destination = artifacts_destination or str(state / "artifacts")
        if "://" not in destination:
            Path(destination).mkdir(parents=True, exist_ok=True)
        base += ["--serve-artifacts", "--artifacts-destination", destination]

    server_env = {**os.environ, **(env or {}), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}

    proc: subprocess.Popen[bytes] | None = None
    errors: list[str] = []
    for _ in range(START_ATTEMPTS):
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [*base, "--host", "127.0.0.1", "--port", str(port), "--workers", "1", *extra_args]
        try:
            proc = _start(cmd, server_env, log_path, url)
            break
        except MlflowServerError as exc:
            errors.append(str(exc))
            # Only a lost race for the port is worth another try; anything else would fail the same way.
            if "address already in use" not in str(exc).lower():
                raise
    if proc is None:
        raise MlflowServerError(
            f"mlflow server could not bind a free port in {START_ATTEMPTS} attempts:\n" + "\n".join(errors)
        )
    try:
        yield url
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Tracking URI of a session-wide MLflow server in direct artifact mode (local ``file://`` root).

    Direct mode so that tests see the real artifact URIs clients will get when artifacts live in storage the
    workers can reach themselves; each test should use its own experiment / registered model names.
    """
    state = tmp_path_factory.mktemp("mlflow-server")
    artifact_root = state / "artifact-root"
    artifact_root.mkdir()
    # sweepflow's app under gunicorn, as every server sweepflow starts: it serves sweep reports as pages of their
    # own, and a run's end in one request.
    with run_mlflow_server(
        str(state),
        default_artifact_root=artifact_root.as_uri(),
        extra_args=tuple(mlflow_app_args("sweepflow")),
    ) as uri:
        yield uri
