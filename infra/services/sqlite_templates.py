"""A new server's SQLite database (Prefect's, MLflow's), copied from a migrated one instead of migrated from
nothing.

A server on a database file that does not exist yet runs all of its migrations first: ``prefect server start``
~100 of them (7 of the 25 s a fresh server took to answer here), ``mlflow server`` ~60 (2.4 CPU-s), on every new
state directory, every ``stack up`` and every temporary server. The migrated schema is the same for every
database of one version, so the first server of each version migrates its own file as before, and its copy is
kept in the user's cache (``$XDG_CACHE_HOME/sweepflow``, else ``~/.cache/sweepflow``) as
``<kind>-<version>.db``; later new databases start as a copy of it. The server's own start-up then finds the
schema current and goes on (its migration step still runs and checks). A database that exists is never
touched; PostgreSQL is not affected.

The copy is taken right after the migrations, before the server starts or writes anything of its own (Prefect's
events; MLflow's Default experiment, whose artifact location names the state directory). Prefect's also holds the
block types its server registers at start-up, which depend on the installation, not the state directory
(``sweepflow.infra.services.prefect_server``). Prefect's temporary server (``sweepflow run --no-server``), which
Prefect starts itself, gets a copy when a template exists (``copy_template``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from collections.abc import Callable

SQLITE_PREFIXES = ("sqlite+aiosqlite:///", "sqlite:///")


def sqlite_file(connection_url: str) -> str | None:
    """The database file of a SQLite connection URL; None for any other database or an in-memory one."""
    for prefix in SQLITE_PREFIXES:
        if connection_url.startswith(prefix):
            path = connection_url[len(prefix) :].split("?", 1)[0]
            return path if path and path != ":memory:" else None
    return None


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sweepflow")


def template_path(kind: str, version: str) -> str:
    """The cached migrated database of ``kind`` ("prefect", "mlflow") at ``version``."""
    return os.path.join(cache_dir(), f"{kind}-{version}.db")


def copy_database(source: str, destination: str) -> None:
    """A consistent copy of the SQLite database ``source`` (its write-ahead log included) at ``destination``,
    which appears whole or not at all."""
    os.makedirs(os.path.dirname(os.path.abspath(destination)), exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(destination)), suffix=".partial")
    os.close(fd)
    try:
        # Closed before the rename (``with`` on a connection only commits): closing checkpoints the copy's
        # write-ahead log into its file and removes the log, so nothing of it stays behind under the old name.
        with (
            contextlib.closing(sqlite3.connect(source)) as src,
            contextlib.closing(sqlite3.connect(partial)) as dst,
        ):
            src.backup(dst)
        os.replace(partial, destination)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def seed_database(connection_url: str, kind: str, version: str, migrate: Callable[[], None]) -> str:
    """Before the server starts: a new SQLite database at ``connection_url`` is a copy of this version's
    migrated template, or, without one, is migrated here (``migrate()``: the server's own migration code) and
    becomes the template. Returns what was done: "existing", "copied", "migrated", or "not sqlite"."""
    path = sqlite_file(connection_url)
    if path is None:
        return "not sqlite"
    if os.path.exists(path):
        return "existing"
    if copy_template(connection_url, kind, version):
        return "copied"
    migrate()
    copy_database(path, template_path(kind, version))
    return "migrated"


def copy_template(connection_url: str, kind: str, version: str) -> bool:
    """A new SQLite database at ``connection_url`` becomes a copy of this version's template, if there is one.
    True if it was copied; False (nothing done) for an existing database, another database, or no template."""
    path = sqlite_file(connection_url)
    if path is None or os.path.exists(path):
        return False
    template = template_path(kind, version)
    if not os.path.exists(template):
        return False
    copy_database(template, path)
    return True
