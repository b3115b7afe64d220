"""A real PostgreSQL server for tests: Debian's ``postgresql`` binaries (``scripts/install-postgres.sh``), a fresh
cluster in a temporary directory, listening on 127.0.0.1 only at a free port (its unix socket inside that
directory, not /var/run/postgresql), with a password-authenticated role that may create databases (what
``sweepflow stack up`` needs of a server). Always stopped (``pg_ctl stop -m fast``) and removed.

PostgreSQL refuses to run as root: run as root (as CI is), the cluster belongs to the ``postgres`` user the
Debian package creates, and initdb/pg_ctl run through ``runuser``; run as anyone else, as that user.
No password is on a command line: initdb reads the admin's from a file (0600, deleted after), the role's is set
over the connection.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import quote

import pytest
from conftest import free_port

SKIP_ENV = "SWEEPFLOW_SKIP_POSTGRES_TESTS"
HOST = "127.0.0.1"
ROLE = "sweepflow"
ADMIN = "sweepflow_admin"
START_TIMEOUT_S = 60


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str  # the role the code under test uses: LOGIN, CREATEDB, not a superuser
    password: str = field(repr=False)
    admin_password: str = field(repr=False)  # the cluster's superuser (ADMIN), for the tests' own checks
    # Part of the password that every encoding of it (raw, percent-encoded) contains: what leak checks look for.
    password_token: str = field(repr=False, default="")
    data_dir: str = ""

    def postmaster_pid(self) -> int:
        """The server's main process (its first line of postmaster.pid): the root of its process tree."""
        with open(os.path.join(self.data_dir, "postmaster.pid")) as f:
            return int(f.readline())

    def restart(self) -> float:
        """Stop the server (``-m fast``: its sessions are cut) and start it again with the same options on the
        same port, as an operator's restart or a failover does; returns the seconds it was away."""
        prefix, _, _ = _as_owner()
        log = os.path.join(os.path.dirname(self.data_dir), "server.log")
        t0 = time.monotonic()
        _run(
            [*prefix, os.path.join(bin_dir(), "pg_ctl"), "-D", self.data_dir, "-l", log, "-m", "fast", "-w",
             "-t", str(START_TIMEOUT_S), "restart"],
            "pg_ctl restart",
            log,
        )  # fmt: skip
        return time.monotonic() - t0

    @property
    def url(self) -> str:
        """The server URL ``sweepflow stack up`` takes (``$SWEEPFLOW_STACK_DATABASE_URL``), password encoded."""
        return f"postgresql://{self.user}:{quote(self.password, safe='')}@{self.host}:{self.port}/"

    def connect(self, dbname: str = "postgres"):
        """A psycopg2 connection as the superuser (autocommit), e.g. to count what a service wrote."""
        import psycopg2

        connection = psycopg2.connect(
            host=self.host, port=self.port, user=ADMIN, password=self.admin_password, dbname=dbname,
            connect_timeout=10,
        )  # fmt: skip
        connection.autocommit = True
        return connection

    def count(self, dbname: str, query: str, args: tuple = ()) -> int:
        connection = self.connect(dbname)
        try:
            with connection.cursor() as cursor:
                cursor.execute(query, args)
                return int(cursor.fetchone()[0])
        finally:
            connection.close()


def bin_dir() -> str:
    """Where initdb and pg_ctl are: on PATH, else Debian's /usr/lib/postgresql/<version>/bin (not on PATH).
    Fails the test (a skip would read as green) without them, unless SWEEPFLOW_SKIP_POSTGRES_TESTS=1."""
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1")
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return os.path.dirname(os.path.realpath(on_path))
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: [int(x) for x in p.split("/")[4].split(".") if x.isdigit()],
    )
    if versions:
        return os.path.dirname(versions[-1])
    pytest.fail(
        "PostgreSQL's server binaries (initdb, pg_ctl) are not installed: this test runs the stack on a real "
        "PostgreSQL. Install them (`bash scripts/install-postgres.sh`, or Debian: `apt-get install -y "
        f"--no-install-recommends postgresql`) or set {SKIP_ENV}=1.",
        pytrace=False,
    )


def _as_owner() -> tuple[list[str], int | None, int | None]:
    """(command prefix, uid, gid) to run the server's commands as its owner: `postgres` when we are root."""
    if os.geteuid() != 0:
        return [], None, None
    try:
        owner = pwd.getpwnam("postgres")
    except KeyError:
        pytest.fail(
            "running as root, and there is no `postgres` user to run PostgreSQL as (it refuses root): install "
            "Debian's postgresql package, which creates it (`bash scripts/install-postgres.sh`)",
            pytrace=False,
        )
    return ["runuser", "-u", "postgres", "--"], owner.pw_uid, owner.pw_gid


def _run(argv: list[str], what: str, log: str | None = None) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        tail = ""
        if log and os.path.exists(log):
            with open(log, errors="replace") as f:
                tail = f.read()[-3000:]
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}\n{tail}")


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    """A running PostgreSQL on 127.0.0.1 (a free port) with role ``sweepflow`` (LOGIN CREATEDB, a password)."""
    bindir = bin_dir()
    prefix, uid, gid = _as_owner()
    # Not pytest's tmp_path: its parents are root's, mode 0700, and the server's user must reach its directory.
    root = tempfile.mkdtemp(prefix="sweepflow-pg-")
    data, sockets, log = os.path.join(root, "data"), os.path.join(root, "sockets"), os.path.join(root, "server.log")
    os.makedirs(sockets)
    token = secrets.token_hex(12)
    password = f"Pg{token}@:/%"  # characters a URL must encode: the stack must pass them on intact
    admin_password = secrets.token_urlsafe(24)
    pwfile = os.path.join(root, "admin-password")
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(admin_password + "\n")
    if uid is not None:
        for path in (root, sockets, pwfile):
            os.chown(path, uid, gid)
    started = False
    try:
        _run(
            [*prefix, os.path.join(bindir, "initdb"), "-D", data, "-U", ADMIN, f"--pwfile={pwfile}",
             "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "--no-locale", "--encoding=UTF8"],
            "initdb",
        )  # fmt: skip
        os.remove(pwfile)
        for attempt in range(3):  # a free port can be taken between free_port() and the server's bind
            port = free_port()
            options = " ".join(
                [
                    f"-c listen_addresses={HOST}",
                    f"-p {port}",
                    f"-c unix_socket_directories={sockets}",
                    # A throwaway cluster: durability buys nothing here, and fsyncs cost on a busy machine.
                    "-c fsync=off -c synchronous_commit=off -c full_page_writes=off",
                ]
            )
            try:
                _run(
                    [*prefix, os.path.join(bindir, "pg_ctl"), "-D", data, "-l", log, "-w",
                     "-t", str(START_TIMEOUT_S), "-o", options, "start"],
                    "pg_ctl start",
                    log,
                )  # fmt: skip
                started = True
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                time.sleep(0.5)
        server = Postgres(HOST, port, ROLE, password, admin_password, token, data)
        connection = server.connect()
        try:
            with connection.cursor() as cursor:
                # Not logged: the server logs no statements by default (log_statement=none).
                cursor.execute(f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD %s", (password,))
        finally:
            connection.close()
        yield server
    finally:
        try:
            if started:
                stop = [*prefix, os.path.join(bindir, "pg_ctl"), "-D", data, "-m", "fast", "-w", "stop"]
                _run(stop, "pg_ctl stop", log)
        finally:
            shutil.rmtree(root)
