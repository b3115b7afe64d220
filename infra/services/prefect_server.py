"""``prefect server start`` as sweepflow runs it: Prefect's own command, in this process, with its SQLite page
cache bounded.

    python -m sweepflow.infra.services.prefect_server [prefect server start's options]

Prefect gives every connection to its SQLite database a page cache of up to ~78 MiB (not a setting; see
``sweepflow.infra.services.compat.bound_prefect_sqlite_page_cache``), which fills as the database grows: the
background server's memory grew all through a long sweep. Here each connection keeps at most
``SQLITE_PAGE_CACHE_KIB``; the database file stays in the operating system's file cache, so a page read again
costs a system call, not a disk read (the server's CPU per trial, benchmarks/bench_load.py: unchanged within
the machine's noise). A server on PostgreSQL (the stack's ``--database-url-file``) is not affected.

A new SQLite database is not migrated from nothing each time: see ``sweepflow.infra.services.sqlite_templates``. Its
template also holds the block types a server registers at start-up (registered once, when the template is made;
``prefect_block_types_key`` names the template after what decides them), so a server on a new database skips
that registration: a new server answered after 8.3–8.5 CPU-seconds here instead of 10.1–11.1. A server on an
existing database registers them as Prefect always does (it skips them itself when nothing changed).
A database that refuses connections for a moment (PostgreSQL restarting) is answered 503, which Prefect's clients
retry, not 500: ``sweepflow.infra.services.compat.retry_database_connection_errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Sequence

from sweepflow.infra.services.compat import (
    bound_prefect_sqlite_page_cache,
    prefect_block_types_key,
    register_prefect_block_types,
    retry_database_connection_errors,
)
from sweepflow.infra.services.sqlite_templates import copy_template, seed_database

#: Page cache per SQLite connection, in KiB: SQLite's own default is 2,000 KiB.
SQLITE_PAGE_CACHE_KIB = 2048


def prefect_template_version() -> str:
    """The name under which this installation's Prefect template is kept: the block types it holds depend on
    Prefect's version and the collections installed (``prefect_block_types_key``)."""
    return f"{prefect_block_types_key()}-blocks"


def _database_url() -> str:
    """The database URL of this process's Prefect settings (the one its server will use)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    return url.get_secret_value() if url is not None else ""


def prefect_seed() -> str:
    """``seed_database`` for this process's Prefect settings (before the server starts): "copied" or "migrated"
    (a new SQLite database, its schema migrated and its block types registered), "existing" or "not sqlite"."""
    url = _database_url()

    def migrate() -> None:
        from prefect.server.database import provide_database_interface

        asyncio.run(provide_database_interface().create_db())
        register_prefect_block_types()

    return seed_database(url, "prefect", prefect_template_version(), migrate)


def copy_prefect_template() -> bool:
    """For a Prefect server this process does not start itself (Prefect's temporary server): its new SQLite
    database becomes a copy of this installation's template, if there is one (a local server made it). True
    if it was copied: the database then holds its block types already (``skip_block_registration``)."""
    url = _database_url()
    return copy_template(url, "prefect", prefect_template_version())


def skip_block_registration() -> contextlib.AbstractContextManager[object]:
    """Prefect's settings, for the block: a server started inside it does not register block types (its new
    database, a copy of the template, holds them already). A server in a subprocess started inside it gets the
    setting too (Prefect hands its settings to the servers it starts)."""
    from prefect.settings import PREFECT_API_BLOCKS_REGISTER_ON_START, temporary_settings

    return temporary_settings({PREFECT_API_BLOCKS_REGISTER_ON_START: False})


def main(argv: Sequence[str] | None = None) -> None:
    bound_prefect_sqlite_page_cache(SQLITE_PAGE_CACHE_KIB)
    retry_database_connection_errors()  # a restarting database is an outage its clients wait out, not a 500
    seeded = prefect_seed()  # a new SQLite database starts as a copy of a migrated one (sqlite_templates)
    from prefect.cli import app

    sys.argv = ["prefect", "server", "start", *(sys.argv[1:] if argv is None else argv)]
    with skip_block_registration() if seeded in ("copied", "migrated") else contextlib.nullcontext():
        sys.exit(app())


if __name__ == "__main__":
    main()
