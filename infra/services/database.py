"""The stack's PostgreSQL: one server for both the Prefect server's database and MLflow's backend store.

``sweepflow stack up`` runs both on SQLite under the state dir by default. Given a PostgreSQL *server* URL
(``$SWEEPFLOW_STACK_DATABASE_URL`` or ``--database-url-file FILE``: ``postgresql://USER:PASSWORD@HOST:PORT/``)
it uses one database per service on it, ``sweepflow_prefect`` and ``sweepflow_mlflow``, created when missing
(the role needs CREATEDB for that; otherwise create them beforehand). Two databases, not one: Prefect and MLflow
each keep their schema version in an ``alembic_version`` table of the same name, so they cannot share one.

The password never goes on a command line (every local user reads argv through ``ps``), into a log, a service
record or a message: the servers get their URLs through their environment (``PREFECT_API_DATABASE_CONNECTION_URL``,
``MLFLOW_BACKEND_STORE_URI``, which ``mlflow server``'s ``--backend-store-uri`` reads), ``shown`` is what is
printed, and libpq's errors are passed on with the password blanked out.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import unquote, urlsplit

DATABASE_URL_ENV = "SWEEPFLOW_STACK_DATABASE_URL"
PREFECT_DATABASE = "sweepflow_prefect"
MLFLOW_DATABASE = "sweepflow_mlflow"
#: Bounds the check at `up`: a firewalled host would otherwise hang the command for libpq's default (forever).
CONNECT_TIMEOUT_S = 10
_SCHEMES = ("postgresql", "postgres")


@dataclasses.dataclass(frozen=True)
class PostgresServer:
    """Where the stack's databases live. ``database``: the one ``up`` connects to to check for and create the
    services' databases (the URL's path; default ``postgres``, which every server has)."""

    host: str
    port: int
    user: str
    password: str | None = dataclasses.field(default=None, repr=False)
    database: str = "postgres"

    @classmethod
    def parse(cls, url: str, *, source: str = DATABASE_URL_ENV) -> PostgresServer:
        """The server named by ``url``; ValueError (naming ``source``, never the password) if it is not one."""
        try:
            parts = urlsplit(url.strip())
            scheme = parts.scheme.partition("+")[0].lower()  # postgresql+psycopg2:// names the same server
            port = parts.port or 5432
        except ValueError:  # a port that is not a number
            parts, scheme, port = None, "", 0
        example = "postgresql://USER:PASSWORD@HOST:PORT/"
        if parts is None or scheme not in _SCHEMES or not parts.hostname:
            raise ValueError(f"{source} is not a PostgreSQL server URL; give one like {example}")
        if not parts.username:
            raise ValueError(f"{source} names no user; give one like {example}")
        if parts.query or parts.fragment:
            raise ValueError(
                f"{source}: connection parameters after '?' are not supported (the Prefect server's driver, "
                f"asyncpg, does not read libpq's); give a plain URL like {example}"
            )
        return cls(
            host=parts.hostname,
            port=port,
            user=unquote(parts.username),
            password=unquote(parts.password) if parts.password is not None else None,
            database=unquote(parts.path.strip("/")) or "postgres",
        )

    @property
    def shown(self) -> str:
        """The server as printed: no password."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql://{self.user}@{host}:{self.port}/"

    def url(self, driver: str, database: str) -> str:
        """A SQLAlchemy URL with the password (percent-encoded): for a server's environment, nowhere else."""
        from sqlalchemy.engine import URL

        return URL.create(
            f"postgresql+{driver}",
            username=self.user,
            password=self.password,
            host=self.host,
            port=self.port,
            database=database,
        ).render_as_string(hide_password=False)

    def prefect_env(self) -> dict[str, str]:
        """The Prefect server's database (asyncpg: Prefect's PostgreSQL driver, a dependency of prefect)."""
        return {"PREFECT_API_DATABASE_CONNECTION_URL": self.url("asyncpg", PREFECT_DATABASE)}

    def mlflow_env(self) -> dict[str, str]:
        """MLflow's backend store (psycopg2, from the ``stack`` extra), through ``--backend-store-uri``'s
        environment variable instead of argv."""
        return {"MLFLOW_BACKEND_STORE_URI": self.url("psycopg2", MLFLOW_DATABASE)}

    def key(self) -> dict[str, Any]:
        """What goes into the services' settings keys (``stack._key``, an HMAC: the password may go in it)."""
        return dataclasses.asdict(self)


def _blanked(text: str, password: str | None) -> str:
    """libpq's message as one line, with the password blanked out should it ever quote it."""
    line = " ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return line.replace(password, "***") if password else line


def prepare(
    server: PostgresServer, databases: tuple[str, ...] = (PREFECT_DATABASE, MLFLOW_DATABASE)
) -> list[str]:
    """Check that the server answers and the role logs in, and create the missing ``databases``; returns the
    ones created. ValueError with one sentence (what failed, how to fix it; never the password) otherwise."""
    try:
        import psycopg2
    except ImportError:
        raise ValueError(
            f"{DATABASE_URL_ENV} needs psycopg2 (MLflow's PostgreSQL driver), which is not installed: run "
            "`bash scripts/install.sh stack` (or `.venv/bin/python -m pip install psycopg2-binary`)"
        ) from None
    try:
        connection = psycopg2.connect(
            host=server.host,
            port=server.port,
            user=server.user,
            password=server.password,
            dbname=server.database,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name="sweepflow stack up",
        )
    except psycopg2.Error as exc:
        raise ValueError(
            f"cannot connect to the stack's PostgreSQL {server.shown}{server.database} "
            f"({_blanked(str(exc), server.password)}); check the host, port, user and password in "
            f"{DATABASE_URL_ENV} (or --database-url-file) and that the server accepts connections from here"
        ) from None
    created = []
    try:
        connection.autocommit = True  # CREATE DATABASE cannot run inside a transaction
        with connection.cursor() as cursor:
            cursor.execute("SELECT datname FROM pg_database WHERE datname = ANY(%s)", (list(databases),))
            present = {row[0] for row in cursor.fetchall()}
            for name in databases:
                if name in present:
                    continue
                try:
                    cursor.execute(f'CREATE DATABASE "{name}"')  # our constant names: nothing to quote
                except psycopg2.Error as exc:
                    raise ValueError(
                        f"the stack's PostgreSQL {server.shown} has no database {name} and user {server.user} "
                        f"cannot create it ({_blanked(str(exc), server.password)}); create it "
                        f"(CREATE DATABASE {name} OWNER {server.user}) or grant the user CREATEDB"
                    ) from None
                created.append(name)
    finally:
        connection.close()
    return created
