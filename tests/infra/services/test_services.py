"""The background-service supervisor (sweepflow.infra.services.supervisor) with a real process: reuse, and replacement when the
code it runs changed."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

from sweepflow.infra.services import exposure
from sweepflow.infra.services import supervisor as services


def _http_service(port: int, code_key: str) -> services.ServiceSpec:
    return services.ServiceSpec(
        name="web",
        argv=[sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        health={"kind": "tcp", "address": f"127.0.0.1:{port}"},
        address=f"127.0.0.1:{port}",
        code_key=code_key,
    )


def test_a_service_is_reused_while_its_code_key_matches_and_replaced_when_it_changes(tmp_path):
    state = str(tmp_path)
    port = services.free_port()
    try:
        services.ensure(state, _http_service(port, "v1"))
        first = services.read_record(state, "web")
        services.ensure(state, _http_service(port, "v1"))
        assert services.read_record(state, "web")["pid"] == first["pid"]  # reused
        services.ensure(state, _http_service(port, "v2"))
        second = services.read_record(state, "web")
        assert second["pid"] != first["pid"] and second["code_key"] == "v2"
        try:
            os.kill(first["pid"], 0)
            raise AssertionError("the outdated service is still running")
        except ProcessLookupError:
            pass
    finally:
        services.stop(state, "web")


def test_a_service_runs_in_its_state_directory_not_the_directory_of_the_command_that_started_it(tmp_path):
    """A service outlives the command that started it: were it to keep that command's working directory, a
    script's temporary directory deleted after it would fail every later trial on the local Dask workers."""
    state, caller = tmp_path / "state", tmp_path / "caller"
    caller.mkdir()
    port = services.free_port()
    here = os.getcwd()
    os.chdir(caller)
    try:
        services.ensure(str(state), _http_service(port, "v1"))
        pid = services.read_record(str(state), "web")["pid"]
        assert os.readlink(f"/proc/{pid}/cwd") == str(state)
    finally:
        os.chdir(here)
        services.stop(str(state), "web")


def test_the_code_fingerprint_follows_a_training_modules_file(tmp_path):
    module = tmp_path / "my_train.py"
    module.write_text("def train(config):\n    pass\n")
    before = services.code_fingerprint(extra_files=[str(module)])
    assert services.code_fingerprint(extra_files=[str(module)]) == before
    module.write_text("def train(config):\n    return 1\n")
    os.utime(module, ns=(1, 1))  # a different mtime and size, as an edit gives
    assert services.code_fingerprint(extra_files=[str(module)]) != before


def test_the_stack_keeps_its_s3_secret_off_the_command_line_and_is_found_after_sourcing_stack_env(tmp_path):
    from sweepflow.flows.settings import Settings
    from sweepflow.infra.services import stack

    spec = stack.s3_spec(str(tmp_path), "KEYID", "SECRETVALUE")
    assert not any("SECRETVALUE" in arg for arg in spec.argv)  # argv is readable by every user through `ps`
    assert spec.env["RCLONE_AUTH_KEY"] == '"KEYID,SECRETVALUE"'
    # stack.env sets SWEEPFLOW_HOME=<stack>/home and SWEEPFLOW_STACK_DIR=<stack>: `infra/stack down` after
    # `source stack.env` must find the stack itself, not <stack>/home/stack.
    settings = Settings.from_env(
        {"SWEEPFLOW_HOME": str(tmp_path / "home"), "SWEEPFLOW_STACK_DIR": str(tmp_path)}
    )
    assert stack.default_state_dir(settings.home, settings.stack_dir) == str(tmp_path)
    assert stack.default_state_dir(str(tmp_path / "h")) == str(tmp_path / "h" / "stack")


def _exposed(tmp_path, **overrides):
    from sweepflow.infra.services import stack

    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here")
    fields = {
        "host": "198.51.100.7",
        "prefect_auth_string": "admin:S3CRET-AUTH",
        "mlflow_auth": "mladmin:ML-S3CRET",
        "tls_ca_file": str(ca),
        "tls_cert": str(ca),
        "tls_key": str(ca),
    }
    return stack.Exposure(**{**fields, **overrides})


def test_the_stack_binds_loopback_by_default_and_its_internal_endpoints_always(tmp_path, monkeypatch):
    from sweepflow.infra.services import stack

    monkeypatch.setattr(services, "free_port", lambda host="127.0.0.1": 4242)  # 198.51.100.7 is not ours

    scheduler = stack.dask_scheduler_spec()
    assert scheduler.argv[scheduler.argv.index("--host") + 1] == "127.0.0.1"
    assert scheduler.address.startswith("tcp://127.0.0.1:")
    exposed = _exposed(tmp_path)
    scheduler = stack.dask_scheduler_spec(exposed, secret="k")
    assert scheduler.argv[scheduler.argv.index("--host") + 1] == "198.51.100.7"
    assert scheduler.address.startswith("tls://198.51.100.7:")
    assert {"--tls-ca-file", "--tls-cert", "--tls-key"} <= set(scheduler.argv)
    # Its HTTP server (dashboard, health, JSON: no authentication) stays on loopback.
    assert scheduler.argv[scheduler.argv.index("--dashboard-address") + 1].startswith("127.0.0.1:")
    env = {"SWEEPFLOW_HOME": str(tmp_path)}
    worker = stack.dask_worker_spec(
        0,
        scheduler.address,
        "http://127.0.0.1:1/x",
        env,
        None,
        exposed,
        worker_preload=["my.preload"],
        secret="k",
    )
    # The caller's preload (the services import no tasks: the flows hand them sweepflow.tasks.WORKER_PRELOAD).
    assert [a for i, a in enumerate(worker.argv) if worker.argv[i - 1] == "--preload"] == [
        "ddp_runtime._preload",
        "my.preload",
    ]
    assert worker.argv[worker.argv.index("--host") + 1] == "198.51.100.7"
    assert worker.argv[worker.argv.index("--dashboard-address") + 1] == "127.0.0.1:0"
    assert "--tls-key" in worker.argv
    prefect_worker = stack.prefect_worker_spec(env, str(tmp_path))
    assert prefect_worker.env["PREFECT_WORKER_WEBSERVER_HOST"] == "127.0.0.1"
    s3 = stack.s3_spec(str(tmp_path), "K", "S", "198.51.100.7")
    assert s3.argv[s3.argv.index("--addr") + 1].startswith("198.51.100.7:")
    client = stack.dask_client_env(exposed)
    assert client["DASK_DISTRIBUTED__COMM__TLS__CA_FILE"] == str(tmp_path / "ca.pem")


def test_exposing_the_stack_is_refused_before_anything_starts_without_auth_and_tls(tmp_path, monkeypatch):
    import pytest

    from sweepflow.infra.services import stack

    stack.Exposure().check()  # loopback: nothing needed
    with pytest.raises(ValueError, match="cannot listen there"):
        _exposed(tmp_path).check()  # 198.51.100.7 (TEST-NET-2) is no address of this machine
    monkeypatch.setattr(services, "free_port", lambda host="127.0.0.1": 4242)
    monkeypatch.setattr(exposure, "installed", lambda module: False)
    with pytest.raises(ValueError, match=r"mlflow\[auth\]"):
        _exposed(tmp_path).check()  # MLflow's basic-auth app without Flask-WTF
    monkeypatch.setattr(exposure, "installed", lambda module: True)
    _exposed(tmp_path).check()  # complete: accepted
    with pytest.raises(ValueError, match="--prefect-auth-file"):
        _exposed(tmp_path, prefect_auth_string=None).check()
    with pytest.raises(ValueError, match="--mlflow-auth-file"):
        _exposed(tmp_path, mlflow_auth=None).check()
    with pytest.raises(ValueError, match="Dask TLS"):
        _exposed(tmp_path, tls_ca_file=None, tls_cert=None, tls_key=None).check()
    none = {"prefect_auth_string": None, "mlflow_auth": None, "tls_ca_file": None, "tls_cert": None}
    _exposed(tmp_path, **none, tls_key=None, insecure=True).check()
    with pytest.raises(ValueError, match="together"):
        _exposed(tmp_path, tls_key=None).check()
    with pytest.raises(ValueError, match="no such file"):
        _exposed(tmp_path, tls_cert=str(tmp_path / "missing.pem")).check()
    with pytest.raises(ValueError, match="wildcard"):
        _exposed(tmp_path, host="0.0.0.0").check()
    with pytest.raises(ValueError, match="USER:PASSWORD"):
        _exposed(tmp_path, prefect_auth_string="nocolon").check()
    # `sweepflow stack up` says so and exits 2, before starting anything.
    from sweepflow.flows.cli import main

    state = tmp_path / "never"
    assert main(["stack", "up", "--state-dir", str(state), "--host", "198.51.100.7"]) == 2
    assert not state.exists()


def test_the_auth_secrets_go_to_environments_never_to_a_command_line_or_log(tmp_path, monkeypatch):
    """`up` with Prefect's auth string and MLflow's admin, its services replaced by recorders: the servers' env
    has them, stack.env (mode 0600) has the clients' settings, no argv, record key or other file has them."""
    from sweepflow.infra.services import stack

    started: list[services.ServiceSpec] = []

    def fake_ensure(state_dir, spec):
        started.append(spec)
        return spec.address or f"http://127.0.0.1:1/{spec.name}"

    monkeypatch.setattr(services, "ensure", fake_ensure)
    monkeypatch.setattr(services, "free_port", lambda host="127.0.0.1": 4242)
    monkeypatch.setattr(stack, "_ensure_bucket", lambda env: None)
    monkeypatch.setattr(exposure, "installed", lambda module: True)
    monkeypatch.setattr(stack, "scheduler_http", lambda state_dir, path: f"http://127.0.0.1:1{path}")
    env = stack.up(str(tmp_path), worker_preload=[], workers=1, exposure=_exposed(tmp_path))
    by_name = {spec.name: spec for spec in started}
    assert by_name["prefect-server"].env["PREFECT_SERVER_API_AUTH_STRING"] == "admin:S3CRET-AUTH"
    assert by_name["prefect-worker"].env["PREFECT_API_AUTH_STRING"] == "admin:S3CRET-AUTH"
    assert env["PREFECT_API_AUTH_STRING"] == "admin:S3CRET-AUTH"
    assert stack.read_env(str(tmp_path))["PREFECT_API_AUTH_STRING"] == "admin:S3CRET-AUTH"
    assert os.stat(tmp_path / "stack.env").st_mode & 0o077 == 0
    mlflow = by_name["mlflow"]
    # MLflow's basic-auth app, with sweepflow's report route (tasks/reporting/report_page.py) on top
    assert mlflow.argv[mlflow.argv.index("--app-name") + 1] == "sweepflow-basic-auth"
    assert mlflow.env["MLFLOW_AUTH_ADMIN_PASSWORD"] == "ML-S3CRET"
    with open(mlflow.env["MLFLOW_AUTH_CONFIG_PATH"]) as f:
        assert "mlflow-auth.db" in f.read()
    assert (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"]) == ("mladmin", "ML-S3CRET")
    for secret in ("S3CRET-AUTH", "ML-S3CRET"):
        for spec in started:
            assert not any(secret in arg for arg in spec.argv), spec.name
            assert secret not in str(spec.code_key)
        for root, _, files in os.walk(tmp_path):
            for name in files:
                if name != "stack.env":
                    with open(os.path.join(root, name), "rb") as f:
                        assert secret.encode() not in f.read(), name


def test_the_local_dask_cluster_preloads_what_its_caller_names_and_is_keyed_by_it(tmp_path):
    from sweepflow.infra.services.local import local_dask_spec

    spec = local_dask_spec(str(tmp_path), worker_preload=["my.preload", "other.preload"], n_workers=2)
    assert [a for i, a in enumerate(spec.argv) if spec.argv[i - 1] == "--preload"] == [
        "my.preload",
        "other.preload",
    ]
    same = local_dask_spec(str(tmp_path), worker_preload=["my.preload", "other.preload"], n_workers=2)
    other = local_dask_spec(str(tmp_path), worker_preload=["my.preload"], n_workers=2)
    assert same.code_key == spec.code_key  # reused by a caller that preloads the same
    assert other.code_key != spec.code_key  # restarted for one that preloads something else


def test_a_new_server_database_is_migrated_once_per_kind_and_version_then_copied(tmp_path, monkeypatch):
    """``sqlite_templates.seed_database``: the first new SQLite database of a server's version is migrated (by the
    function given) and kept as that kind and version's template; later new ones are copies of it (schema and rows,
    write-ahead log included); an existing database and a PostgreSQL URL are left alone."""
    import sqlite3

    from sweepflow.infra.services import sqlite_templates

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    migrations: list[str] = []

    def migrate_to(path: str):
        def migrate() -> None:
            migrations.append(path)
            with sqlite3.connect(path) as db:
                db.execute("PRAGMA journal_mode=WAL")  # as Prefect's; the copy must carry the log's pages
                db.execute("CREATE TABLE alembic_version (version_num TEXT)")
                db.execute("INSERT INTO alembic_version VALUES ('head')")

        return migrate

    first, second = str(tmp_path / "a" / "prefect.db"), str(tmp_path / "b" / "prefect.db")
    os.makedirs(os.path.dirname(first)), os.makedirs(os.path.dirname(second))
    url = "sqlite+aiosqlite:///{}".format
    assert sqlite_templates.seed_database(url(first), "prefect", "3.9.1", migrate_to(first)) == "migrated"
    assert sqlite_templates.seed_database(url(second), "prefect", "3.9.1", migrate_to(second)) == "copied"
    assert migrations == [first]
    with sqlite3.connect(second) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [("head",)]
    assert os.listdir(tmp_path / "cache" / "sweepflow") == ["prefect-3.9.1.db"]  # no partial copy left
    assert sqlite_templates.seed_database(url(second), "prefect", "3.9.1", migrate_to(second)) == "existing"
    # Another version has its own template: its first database is migrated again.
    third = str(tmp_path / "b" / "other.db")
    assert sqlite_templates.seed_database(url(third), "prefect", "3.10.0", migrate_to(third)) == "migrated"
    assert migrations == [first, third]
    # Another kind, same version: its own template.
    fourth = str(tmp_path / "b" / "mlflow.db")
    assert (
        sqlite_templates.seed_database(f"sqlite:///{fourth}", "mlflow", "3.9.1", migrate_to(fourth))
        == "migrated"
    )
    assert migrations == [first, third, fourth]
    postgres, memory = "postgresql+asyncpg://u@h/db", "sqlite+aiosqlite:///:memory:"
    assert sqlite_templates.seed_database(postgres, "prefect", "3.9.1", migrate_to(third)) == "not sqlite"
    assert sqlite_templates.seed_database(memory, "prefect", "3.9.1", migrate_to(third)) == "not sqlite"


def test_a_new_mlflow_store_is_the_migrated_template_and_mlflow_opens_it_without_migrating(
    tmp_path, monkeypatch
):
    """``sweepflow.infra.services.mlflow_server``: the first new SQLite store of an MLflow version is migrated by MLflow's
    own code; the next is a copy, which MLflow's store opens without migrating, making its Default experiment
    under its own artifact root. Fails if MLflow renames the migration function the template is made with."""
    import mlflow.store.db.utils as mlflow_db
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from sweepflow.infra.services.mlflow_server import backend_store_uri, mlflow_seed, use_sqlite_wal

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first, second = f"sqlite:///{tmp_path}/a/mlflow.db", f"sqlite:///{tmp_path}/b/mlflow.db"
    assert mlflow_seed(first) == "migrated"
    assert mlflow_seed(second) == "copied"
    assert mlflow_seed(second) == "existing"

    def no_migration(engine):
        raise AssertionError("MLflow migrated a database copied from the template")

    monkeypatch.setattr(mlflow_db, "_initialize_tables", no_migration)
    use_sqlite_wal(str(tmp_path / "b" / "mlflow.db"))
    store = SqlAlchemyStore(second, str(tmp_path / "b" / "artifacts"))
    try:
        (default,) = store.search_experiments()
        assert default.name == "Default" and default.artifact_location.startswith(str(tmp_path / "b"))
    finally:
        store.engine.dispose()

    assert backend_store_uri(["--host", "h", "--backend-store-uri", first, "--port", "1"]) == first
    assert backend_store_uri(["--backend-store-uri=sqlite:///x.db"]) == "sqlite:///x.db"
    monkeypatch.setenv("MLFLOW_BACKEND_STORE_URI", "postgresql://u@h/db")  # a password stays off argv
    assert (
        backend_store_uri([]) == "postgresql://u@h/db" and mlflow_seed(backend_store_uri([])) == "not sqlite"
    )


# A "worker" service: an HTTP server that also starts one piece of work (a child in its session, marked with
# WORK_ENV as a Prefect worker's flow runs carry PREFECT__FLOW_RUN_ID) and writes the work's pid to a file.
WORKER = """
import os, subprocess, sys, http.server
work = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={**os.environ, "WORK_ID": "1"})
open(sys.argv[2], "w").write(str(work.pid))
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def _worker_service(port: int, pid_file: str) -> services.ServiceSpec:
    return services.ServiceSpec(
        name="worker",
        argv=[sys.executable, "-c", WORKER, str(port), pid_file],
        health={"kind": "tcp", "address": f"127.0.0.1:{port}"},
        address=f"http://127.0.0.1:{port}",
        spare_env="WORK_ID",
    )


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_dead_service_is_replaced_on_its_port_its_work_lives_on_and_stop_still_ends_it(tmp_path):
    state, pid_file = str(tmp_path), str(tmp_path / "work.pid")
    port = services.free_port()
    try:
        services.ensure(state, _worker_service(port, pid_file))
        first = services.read_record(state, "worker")
        work = int(open(pid_file).read())
        os.kill(first["pid"], signal.SIGKILL)  # the worker dies; its work (same session) does not
        time.sleep(0.5)
        # Restarted as `stack up` does: on the port it had, though connections it left may be in TIME_WAIT.
        again = services.previous_port(state, "worker", "127.0.0.1")
        assert again == port
        services.ensure(state, _worker_service(again, pid_file))
        second = services.read_record(state, "worker")
        assert second["pid"] != first["pid"] and second["address"] == first["address"]
        assert _running(work), "replacing a dead service must not end the work it had started"
        assert [a["service_id"] for a in second["adopted"]] == [first["service_id"]]
        new_work = int(open(pid_file).read())
    finally:
        services.stop(state, "worker")
    deadline = time.monotonic() + 20
    while (_running(work) or _running(new_work)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(work) and not _running(new_work), "stop must end the adopted work too"


def test_without_a_record_or_on_another_host_a_restart_takes_a_free_port(tmp_path):
    assert services.previous_port(str(tmp_path), "nothing", "127.0.0.1") > 0
    port = services.free_port()
    spec = _http_service(port, "v1")
    try:
        services.ensure(str(tmp_path), spec)
        assert services.previous_port(str(tmp_path), "web", "127.0.0.1") == port
        assert services.previous_port(str(tmp_path), "web", "127.0.0.2") != port
    finally:
        services.stop(str(tmp_path), "web")
