"""The stack's PostgreSQL settings without a server: the URL's parsing and its errors (never the password), the
URLs the two servers get (through their environment, never argv), and the settings keys that make `stack up`
restart the servers when the database changes. The stack on a real PostgreSQL: tests/infra/services/test_stack_hygiene.py."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from sweepflow.flows.cli import main
from sweepflow.infra.services.database import MLFLOW_DATABASE, PREFECT_DATABASE, PostgresServer
from sweepflow.infra.services.local import mlflow_server_spec
from sweepflow.infra.services.stack import _key

PASSWORD = "s3cr3t@:/%x"
URL = "postgresql://sweep:s3cr3t%40%3A%2F%25x@db.example:6543/"


def test_a_server_url_gives_each_service_its_own_database_with_the_password_intact():
    server = PostgresServer.parse(URL)
    assert (server.host, server.port, server.user, server.password, server.database) == (
        "db.example", 6543, "sweep", PASSWORD, "postgres",
    )  # fmt: skip
    assert PASSWORD not in repr(server) and PASSWORD not in server.shown
    assert server.shown == "postgresql://sweep@db.example:6543/"
    prefect = make_url(server.prefect_env()["PREFECT_API_DATABASE_CONNECTION_URL"])
    mlflow = make_url(server.mlflow_env()["MLFLOW_BACKEND_STORE_URI"])
    assert (prefect.drivername, prefect.database, prefect.password) == (
        "postgresql+asyncpg",
        PREFECT_DATABASE,
        PASSWORD,
    )
    assert (mlflow.drivername, mlflow.database, mlflow.password) == (
        "postgresql+psycopg2",
        MLFLOW_DATABASE,
        PASSWORD,
    )
    assert (
        PostgresServer.parse("postgres://u@h/admin_db").database == "admin_db"
    )  # libpq's short scheme; port 5432
    assert PostgresServer.parse("postgresql+psycopg2://u:p@h").port == 5432


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://sweep:s3cr3t@h/", "is not a PostgreSQL server URL"),
        ("postgresql://sweep:s3cr3t@h:notaport/", "is not a PostgreSQL server URL"),
        ("postgresql://:s3cr3t@h/", "names no user"),
        ("postgresql://sweep:s3cr3t@h/?sslmode=require", "connection parameters after '?' are not supported"),
    ],
)
def test_a_url_that_is_not_a_server_is_refused_without_showing_the_password(url, says):
    with pytest.raises(ValueError, match="SWEEPFLOW_STACK_DATABASE_URL") as refused:
        PostgresServer.parse(url)
    assert says in str(refused.value) and "s3cr3t" not in str(refused.value)


def test_stack_up_refuses_a_bad_url_with_exit_2_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWEEPFLOW_STACK_DATABASE_URL", "mysql://sweep:s3cr3t@h/")
    assert main(["stack", "up", "--state-dir", str(tmp_path / "state")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweepflow stack: SWEEPFLOW_STACK_DATABASE_URL is not a PostgreSQL server URL")
    assert "s3cr3t" not in err and not (tmp_path / "state").exists()
    url_file = tmp_path / "db-url"
    url_file.write_text("postgresql://:s3cr3t@h/\n")
    assert (
        main(["stack", "up", "--state-dir", str(tmp_path / "state"), "--database-url-file", str(url_file)])
        == 2
    )
    assert f"--database-url-file {url_file} names no user" in capsys.readouterr().err


def test_mlflow_gets_its_backend_store_from_its_environment_not_argv():
    server = PostgresServer.parse(URL)
    spec = mlflow_server_spec(
        backend_store_uri=None, artifacts="s3://b/mlflow", proxy_artifacts=True, env=server.mlflow_env()
    )
    assert "--backend-store-uri" not in spec.argv and not any("s3cr3t" in arg for arg in spec.argv)
    assert make_url(spec.env["MLFLOW_BACKEND_STORE_URI"]).password == PASSWORD
    with pytest.raises(ValueError, match="no backend store"):
        mlflow_server_spec(backend_store_uri=None, artifacts="a", proxy_artifacts=False)


def test_the_servers_settings_key_changes_with_the_database_url():
    one, other = PostgresServer.parse(URL), PostgresServer.parse(URL.replace("6543", "6544"))
    rotated = PostgresServer.parse(URL.replace("s3cr3t", "n3w"))
    keys = {_key("k", host="h", database=s.key()) for s in (one, other, rotated)}
    assert len(keys) == 3
