"""``prefect server start`` as sweepflow runs it: Prefect's own command, in this process, with its SQLite page
cache bounded.

    python -m sweepflow.services.prefect_server [prefect server start's options]

Prefect gives every connection to its SQLite database a page cache of up to ~78 MiB (not a setting; see
``sweepflow.services.compat.bound_prefect_sqlite_page_cache``), which fills as the database grows: the
background server's memory grew all through a long sweep. Here each connection keeps at most
``SQLITE_PAGE_CACHE_KIB``; the database file stays in the operating system's file cache, so a page read again
costs a system call, not a disk read (the server's CPU per trial, benchmarks/bench_load.py: unchanged within
the machine's noise). A server on PostgreSQL (the stack's ``--database-url-file``) is not affected.

A new SQLite database is not migrated from nothing each time: see ``sweepflow.services.sqlite_templates``.
A database that refuses connections for a moment (PostgreSQL restarting) is answered 503, which Prefect's clients
retry, not 500: ``sweepflow.services.compat.retry_database_connection_errors``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from sweepflow.services.compat import bound_prefect_sqlite_page_cache, retry_database_connection_errors
from sweepflow.services.sqlite_templates import seed_database

#: Page cache per SQLite connection, in KiB: SQLite's own default is 2,000 KiB.
SQLITE_PAGE_CACHE_KIB = 2048


def prefect_seed() -> str:
    """``seed_database`` for this process's Prefect settings (before the server starts)."""
    import prefect
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    url = url.get_secret_value() if url is not None else ""

    def migrate() -> None:
        from prefect.server.database import provide_database_interface

        asyncio.run(provide_database_interface().create_db())

    return seed_database(url, "prefect", prefect.__version__, migrate)


def main(argv: Sequence[str] | None = None) -> None:
    bound_prefect_sqlite_page_cache(SQLITE_PAGE_CACHE_KIB)
    retry_database_connection_errors()  # a restarting database is an outage its clients wait out, not a 500
    prefect_seed()  # a new SQLite database starts as a copy of a migrated one (sqlite_templates)
    from prefect.cli import app

    sys.argv = ["prefect", "server", "start", *(sys.argv[1:] if argv is None else argv)]
    sys.exit(app())


if __name__ == "__main__":
    main()
