"""Every place the services package (``sweepflow.infra.services``) relies on another library's internals, or on
behaviour it does not document: Dask's HTTP routes, Prefect's server, CPython. (The tasks' and flows' own, for
MLflow and Prefect's client side, are in ``sweepflow.tasks.compat``; ddp_runtime's, for torch and Dask, in
``ddp_runtime._compat``.)

Each reliance is one function here, saying what it works around, the version it was written against and what
to do when it breaks; ``tests/repo/test_compat.py`` has a test per function that fails when the library changes
what we rely on. Upgrading Dask: run ``pytest tests/repo/test_compat.py`` first.

The service supervisor and the warm launcher import this module: it imports nothing but the standard library
(and that inside the functions).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# ------------------------------------------------------------------------------------------- Dask (HTTP routes)


def serve_dask_worker_names(scheduler: Any, path: str) -> None:
    """Add ``path`` to the Dask scheduler's HTTP server: ``{"workers": [name, ...]}``, its workers' names.

    Works around: Dask's own ``/json/identity.json`` (``Scheduler.identity()``) lists the workers by name, but
    answers HTTP 500 whenever a worker's last heartbeat carried fine-grained task metrics: each worker's
    ``metrics["digests_total_since_heartbeat"]`` is keyed by tuples, which JSON cannot encode. During a sweep
    that is often, and the stack's probe of each `dask worker` service read it: `sweepflow stack up` took every
    healthy worker for hung and restarted them all, killing their trials (found by tests/e2e/test_chaos.py).
    Relies on the scheduler's tornado application (``scheduler.http_application``, undocumented) and Dask's
    ``RequestHandler`` (``dask_server``: the scheduler). Written for distributed 2026.8. If it breaks: register
    the handler through the ``distributed.scheduler.http.routes`` setting instead (a module with ``routes``).
    """
    from distributed.http.utils import RequestHandler

    class WorkerNames(RequestHandler):
        def get(self) -> None:
            self.write({"workers": sorted(str(worker.name) for worker in self.server.workers.values())})

    scheduler.http_application.add_handlers(r".*$", [(path, WorkerNames, {"dask_server": scheduler})])


# ------------------------------------------------------------------------------------------ Prefect (server)


def bound_prefect_sqlite_page_cache(kib: int) -> None:
    """Make the Prefect server of this process keep at most ``kib`` KiB of SQLite page cache per database
    connection, instead of Prefect's 20,000 pages (~78 MiB at SQLite's 4-KiB pages).

    Works around: Prefect's ``AioSqliteConfiguration.setup_sqlite`` (the engine's "connect" listener) sets
    ``PRAGMA cache_size = 20000`` on every pooled connection, not configurable. Each cache fills as the
    database grows (117 MB after 4,000 trials), towards a bound of 78 MiB per connection: the server's memory
    grew all through a long sweep (+5.9 % from trial 500 to 4,000, benchmarks/bench_load.py; +4.1 % bounded,
    SQLite's own allocator then at 8-9 MiB throughout). Wrapped here so our PRAGMA runs right after Prefect's.
    Does nothing to a server on PostgreSQL.
    Written for Prefect 3.9. If it breaks (the method renamed or no longer the listener): find where Prefect
    sets the PRAGMA now and wrap that, or drop this if Prefect makes the cache size a setting.
    """
    from prefect.server.database.configurations import AioSqliteConfiguration

    prefect_setup = AioSqliteConfiguration.setup_sqlite
    # Bounded already (called twice): wrap Prefect's own, not our wrapper.
    prefect_setup = getattr(prefect_setup, "__wrapped__", prefect_setup)

    def setup_sqlite(self: Any, conn: Any, record: Any) -> None:
        prefect_setup(self, conn, record)
        cursor = conn.cursor()
        cursor.execute(f"PRAGMA cache_size = -{int(kib)};")  # negative: KiB, whatever the page size
        cursor.close()

    setup_sqlite.__wrapped__ = prefect_setup  # type: ignore[attr-defined]
    AioSqliteConfiguration.setup_sqlite = setup_sqlite  # type: ignore[method-assign]


def prefect_block_types_key() -> str:
    """What decides which block types a Prefect server registers in its database at start-up: Prefect's version
    and the Prefect collections installed beside it (the distributions behind the ``prefect.collections`` entry
    points, with their versions), as one short string.

    Relies on: the start-up registration (``create_app``'s ``add_block_types``) registering the block classes
    Prefect imports, those of the collections it loads from that entry-point group, and the collections' blocks
    data file Prefect ships (fixed per version). A block class a user defines in their own module is registered
    by their ``prefect block register``, not by a server's start-up. Written for Prefect 3.9.
    """
    import hashlib
    from importlib.metadata import entry_points, version

    collections = sorted(
        {f"{ep.dist.name}=={ep.dist.version}" for ep in entry_points(group="prefect.collections") if ep.dist}
    )
    key = version("prefect")
    if collections:
        key += "-" + hashlib.sha256("\n".join(collections).encode()).hexdigest()[:12]
    return key


def register_prefect_block_types() -> None:
    """Register, in the database of this process's Prefect settings, the block types a Prefect server
    registers at start-up, as its start-up would (the collections loaded first). Run on a new, migrated
    database before its server starts, which may then skip its own registration (a new server answered after
    8.3–8.5 CPU-s here instead of 10.1–11.1: ``sweepflow.infra.services.prefect_server``).

    Relies on (internal): ``prefect.server.models.block_registration.run_block_auto_registration(session=)``,
    which the server's start-up calls, and ``prefect.plugins.load_prefect_collections``, which its start-up
    calls first. Written for Prefect 3.9. If it breaks: call what ``create_app``'s ``add_block_types`` calls
    now; if that cannot be done, stop skipping the server's registration (``prefect_server.main``).
    """
    import asyncio

    import prefect.plugins
    from prefect.server.database import provide_database_interface
    from prefect.server.models.block_registration import run_block_auto_registration

    prefect.plugins.load_prefect_collections()

    async def register() -> None:
        db = provide_database_interface()
        async with await db.session() as session:
            await run_block_auto_registration(session=session)

    asyncio.run(register())


def retry_database_connection_errors() -> None:
    """Make the Prefect server of this process answer 503 (which Prefect's clients retry), not 500, to a
    request that failed because its database refused or dropped the connection.

    Works around: the server's catch-all handler (``custom_internal_exception_handler``) answers 503 for the
    errors ``is_client_retryable_exception`` names (SQLAlchemy's DBAPIError, asyncpg's CannotConnectNowError,
    ...), but opening a new asyncpg connection to a PostgreSQL that is restarting raises the socket's own
    ``ConnectionRefusedError`` (an OSError SQLAlchemy does not wrap), which fell through to 500: a trial's
    ``create_link_artifact`` during a database restart failed its trial, and the sweep with it
    (benchmarks/bench_chaos.py). Socket errors (``ConnectionError``, ``TimeoutError``) are outages that heal;
    anything else stays a 500, said at once.
    Written for Prefect 3.9. If it breaks (the function renamed, or no longer looked up at call time): find
    the handler's predicate now, or drop this if Prefect counts socket errors as retryable itself.
    """
    import prefect.server.api.server as server

    prefect_check = getattr(
        server.is_client_retryable_exception, "__wrapped__", server.is_client_retryable_exception
    )

    def is_client_retryable_exception(exc: Exception) -> bool:
        return isinstance(exc, ConnectionError | TimeoutError) or prefect_check(exc)

    is_client_retryable_exception.__wrapped__ = prefect_check  # type: ignore[attr-defined]
    server.is_client_retryable_exception = is_client_retryable_exception

    # Some routes' dependencies run outside the app's exception handlers (uvicorn logged "Exception in ASGI
    # application" for a worker's poll during the restart, answered 500): the same errors get 503 there too.
    prefect_create_app = getattr(server.create_app, "__wrapped__", server.create_app)

    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = prefect_create_app(*args, **kwargs)
        if not getattr(app.state, "sweepflow_outage_answer", False):
            app.add_middleware(OutageAnswer)
            app.state.sweepflow_outage_answer = True
        return app

    create_app.__wrapped__ = prefect_create_app  # type: ignore[attr-defined]
    server.create_app = create_app


class OutageAnswer:
    """ASGI middleware: a request whose handling raised ``ConnectionError``/``TimeoutError`` before its answer
    began is answered 503 (``Service Unavailable``, as Prefect's own handler words it), not uvicorn's 500."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except (ConnectionError, TimeoutError):
            if started:
                raise
            body = b'{"exception_message": "Service Unavailable"}'
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})


# ------------------------------------------------------------------------------------------- MLflow (server)


def fork_mlflow_gunicorn() -> None:
    """Make ``mlflow server`` (under gunicorn, in this process) fork its gunicorn master from this process
    instead of starting it as a new Python process.

    Works around: MLflow's server command imports MLflow's server and opens its stores, then starts
    ``python -m gunicorn ... APP``, whose worker imports all of it again: 5.6 CPU-s and 229 MiB here, on every
    start. Forked, the master and its worker start with it imported, their pages shared with this process's.
    In the fork, every SQLAlchemy engine's pool is dropped without closing its connections (SQLAlchemy's
    recipe for forked processes) and MLflow's cached stores are forgotten, so the worker opens its own.

    Relies on ``mlflow.server._run_server`` starting the server through the module's ``_exec_cmd(cmd,
    extra_env=..., capture_output=False, synchronous=False)`` with ``cmd == [python, "-m", "gunicorn", *args]``,
    using only the result's ``pid``, ``poll()``, ``send_signal()`` and ``wait()``, and on
    ``mlflow.server.handlers``' ``_tracking_store`` / ``_model_registry_store`` caches. Written for MLflow
    3.17. If it breaks: any other call goes to MLflow's own ``_exec_cmd``, so the server still starts (as a new
    process, slower); match the new call here.
    """
    import mlflow.server as server

    original = server._exec_cmd

    def exec_cmd(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        forkable = (
            not args
            and set(kwargs) <= {"extra_env", "capture_output", "synchronous"}
            and kwargs.get("capture_output") is False
            and kwargs.get("synchronous") is False
            and list(cmd[1:3]) == ["-m", "gunicorn"]
        )
        if not forkable:
            return original(cmd, *args, **kwargs)
        return _ForkedServer.start(["gunicorn", *cmd[3:]], kwargs.get("extra_env") or {})

    server._exec_cmd = exec_cmd


class _ForkedServer:
    """A forked child running gunicorn, with the part of ``subprocess.Popen`` MLflow's command uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def start(cls, argv: list[str], env: Mapping[str, str]) -> _ForkedServer:
        import os
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return cls(pid)
        code = 1
        try:  # the child: never returns into MLflow's command
            _forget_database_connections()
            os.environ.update(env)
            sys.argv = argv
            from gunicorn.app.wsgiapp import run

            run()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - said on stderr (the server's log), then the child exits 1
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def poll(self) -> int | None:
        import os

        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        import os

        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        import os

        if self.returncode is None:
            os.kill(self.pid, signum)


def _forget_database_connections() -> None:
    """In a forked child: the parent's SQLAlchemy pools dropped, their connections left to the parent, and
    MLflow's server stores forgotten (each worker opens its own)."""
    import gc

    import mlflow.server.handlers as handlers
    from sqlalchemy.engine import Engine

    for engine in [o for o in gc.get_objects() if isinstance(o, Engine)]:
        engine.dispose(close=False)
    handlers._tracking_store = None
    handlers._model_registry_store = None


# ----------------------------------------------------------------------------------------------------- CPython


def run_atexit_handlers() -> None:
    """Run the ``atexit`` handlers now, as a normal interpreter exit would (log and event flushes).

    Works around: a forked child that ends with ``os._exit`` (so that it never returns into its parent's code)
    skips them. ``atexit._run_exitfuncs`` is private CPython API (stable since Python 3.0). If it goes: keep our
    own list of flush callbacks, or end the child with ``sys.exit`` after closing the inherited sockets.
    """
    import atexit

    atexit._run_exitfuncs()


__all__ = [
    "bound_prefect_sqlite_page_cache",
    "fork_mlflow_gunicorn",
    "run_atexit_handlers",
    "serve_dask_worker_names",
]
