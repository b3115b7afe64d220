"""``mlflow server`` as sweepflow runs it: MLflow's own command, in this process, a new SQLite database first
copied from a migrated one.

    python -m sweepflow.infra.services.mlflow_server [mlflow server's options]

``mlflow server`` on a SQLite file that does not exist yet runs all of MLflow's migrations (~60, 2.4 CPU-s here)
before it serves: every new state directory (`sweepflow run`'s first run) and every ``stack up`` paid them. Here
the first new database of each MLflow version is migrated by MLflow's own code and kept as that version's
template; later ones start as a copy (``sweepflow.infra.services.sqlite_templates``). MLflow's start-up then finds
every table and only checks the schema's revision. The template holds tables only: the server makes its
Default experiment itself, with its artifact location under the state directory it serves. A store on
PostgreSQL, or one that exists, is left alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from sweepflow.infra.services.compat import fork_mlflow_gunicorn
from sweepflow.infra.services.sqlite_templates import seed_database, sqlite_file


def backend_store_uri(args: Sequence[str]) -> str | None:
    """The ``--backend-store-uri`` of ``mlflow server``'s arguments, else ``MLFLOW_BACKEND_STORE_URI`` (how a
    URL with a password is given: off argv); None when neither is set (MLflow's own default store)."""
    for i, arg in enumerate(args):
        if arg == "--backend-store-uri" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--backend-store-uri="):
            return arg.split("=", 1)[1]
    return os.environ.get("MLFLOW_BACKEND_STORE_URI") or None


def mlflow_seed(store_uri: str | None) -> str:
    """``seed_database`` for an MLflow backend store (before the server starts): "copied", "migrated",
    "existing" or "not sqlite"."""
    path = sqlite_file(store_uri or "")
    if path is None:
        return "not sqlite"
    import mlflow

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def migrate() -> None:
        import sqlalchemy

        # What MLflow's store runs on a database without tables (mlflow.store.db.utils).
        from mlflow.store.db.utils import _initialize_tables

        engine = sqlalchemy.create_engine(store_uri)
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()

    return seed_database(store_uri, "mlflow", mlflow.__version__, migrate)


def use_sqlite_wal(path: str) -> None:
    """Put the SQLite database ``path`` in write-ahead-log mode, which the file keeps. MLflow opens SQLite in its
    default rollback-journal mode: every commit creates, syncs and deletes a journal file; with the log, a commit
    appends to it. The server's CPU per trial's writes (create, log_batch, end) fell 31-35 -> 27-30 ms, its
    latency 65-75 -> 54-55 ms, side by side. Only for a file the server alone opens on a local disk (the state
    dir's): WAL needs shared memory that a network file system does not give."""
    import sqlite3

    connection = sqlite3.connect(path, timeout=30)
    try:
        mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    finally:
        connection.close()
    if mode != "wal":
        raise SystemExit(
            f"could not put the MLflow database {path} in WAL mode (SQLite says {mode!r}): is it on a network "
            "file system? Keep the state directory on a local disk"
        )


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    store_uri = backend_store_uri(args)
    mlflow_seed(store_uri)  # before WAL: the copy, or MLflow's migration, makes the file
    path = sqlite_file(store_uri or "")
    if path is not None:
        use_sqlite_wal(path)
    fork_mlflow_gunicorn()  # its gunicorn starts with MLflow imported, not as a new Python importing it again
    from mlflow.cli import cli

    cli.main(args=["server", *args], prog_name="mlflow")


if __name__ == "__main__":
    main()
