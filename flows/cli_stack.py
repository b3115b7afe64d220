"""The actions of ``sweepflow stack`` (``cmd_stack`` in ``flows/cli.py`` picks one): up, down, env and
status of the full stack on this machine (``sweepflow.infra.services.stack``), each printing what it did and
returning the command's exit status; and the secrets ``up`` reads from files."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sweepflow.flows.settings import Settings
    from sweepflow.infra.services.database import PostgresServer


def up(args: argparse.Namespace, settings: Settings, state_dir: str) -> int:
    """Start what is not running (and restart what is DOWN), then print where each service is."""
    from sweepflow.infra.services import stack
    from sweepflow.tasks import WORKER_PRELOAD

    try:
        exposure = stack.Exposure(
            host=args.host,
            prefect_auth_string=_read_secret_file(args.prefect_auth_file, "--prefect-auth-file"),
            mlflow_auth=_read_secret_file(args.mlflow_auth_file, "--mlflow-auth-file"),
            mlflow_allowed_hosts=args.mlflow_allowed_hosts,
            tls_ca_file=args.tls_ca_file,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            insecure=args.insecure,
        )
        exposure.check()
        database = _stack_database(args.database_url_file, settings.stack_database_url)
    except ValueError as exc:  # before anything starts
        print(f"sweepflow stack: {exc}", file=sys.stderr)
        return 2
    try:
        client_env = stack.up(
            state_dir,
            worker_preload=[WORKER_PRELOAD],
            workers=args.workers,
            exposure=exposure,
            database=database,
        )
    except ValueError as exc:  # the database: unreachable, refused the login, or cannot create ours
        print(f"sweepflow stack: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"sweepflow stack: {exc}", file=sys.stderr)
        print(f"stop what did start with: sweepflow stack down --state-dir {state_dir}", file=sys.stderr)
        return 1
    _print_started(state_dir, client_env, database)
    return 0


def _print_started(state_dir: str, env: dict[str, str], database: PostgresServer | None) -> None:
    """Each service's address, the UIs, the databases and where the clients' settings are."""
    from sweepflow.infra.services import stack

    for name, address in stack.status(state_dir).items():
        print(f"{name:16s} {address}")
    print(f"\nPrefect UI:  {env['PREFECT_API_URL'].removesuffix('/api')}")
    print(f"MLflow UI:   {env['MLFLOW_TRACKING_URI']}")
    print(f"Dask dashboard: {stack.dashboard_url(state_dir)}")
    if database is not None:
        from sweepflow.infra.services.database import MLFLOW_DATABASE, PREFECT_DATABASE

        print(f"Databases:   {PREFECT_DATABASE}, {MLFLOW_DATABASE} on {database.shown}")
    print(f"Settings:    source {os.path.join(state_dir, 'stack.env')}")


def down(state_dir: str) -> int:
    """Stop every process of every service."""
    from sweepflow.infra.services import stack

    try:
        stopped = stack.down(state_dir)
    except RuntimeError as exc:  # a process that survived SIGKILL: which one, and what to do
        print(f"sweepflow stack: {exc}", file=sys.stderr)
        return 1
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def env(state_dir: str) -> int:
    """Print stack.env, the clients' settings."""
    from sweepflow.infra.services import stack

    if not stack.read_env(state_dir):
        print(
            f"sweepflow stack: no stack under {state_dir}; run `sweepflow stack up` first",
            file=sys.stderr,
        )
        return 1
    with open(os.path.join(state_dir, "stack.env")) as f:
        print(f.read(), end="")
    return 0


def status(state_dir: str) -> int:
    """Each service's address, or why it is DOWN; exit 1 unless every one is up."""
    from sweepflow.infra.services import stack, supervisor

    states = {name: supervisor.describe(state_dir, name) for name in stack.service_names(state_dir)}
    if not states:
        print(f"no stack services recorded under {state_dir}; start them with `sweepflow stack up`")
    for name, (address, why) in states.items():
        print(f"{name:16s} {address or why}")
    if not all(address for address, _ in states.values()):
        print(f"`sweepflow stack up --state-dir {state_dir}` (same options as before) restarts what is DOWN")
    return 0 if states and all(address for address, _ in states.values()) else 1


def _stack_database(url_file: str | None, env_url: str | None) -> PostgresServer | None:
    """The stack's PostgreSQL server (``sweepflow.infra.services.database.PostgresServer``) from ``--database-url-file``
    or $SWEEPFLOW_STACK_DATABASE_URL (the file wins), or None: SQLite. ValueError if the URL is not one."""
    from sweepflow.infra.services.database import DATABASE_URL_ENV, PostgresServer

    # The services `up` starts inherit this process's environment: only the two servers that need the password
    # get it (through their own environment), not the Dask workers, the Prefect worker or its flow runs.
    os.environ.pop(DATABASE_URL_ENV, None)
    if url_file is not None:
        return PostgresServer.parse(
            _read_secret_file(url_file, "--database-url-file"), source=f"--database-url-file {url_file}"
        )
    return PostgresServer.parse(env_url) if env_url else None


def _read_secret_file(path: str | None, flag: str) -> str | None:
    """A secret's first line from a file (secrets never go on a command line: `ps` shows it to every user)."""
    if path is None:
        return None
    try:
        with open(path) as f:
            value = f.readline().strip()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: {exc.strerror}; give a readable file holding the secret") from None
    if not value:
        raise ValueError(f"{flag} {path} is empty; put the secret on its first line")
    return value
