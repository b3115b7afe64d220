"""Shared fixtures: real Dask LocalClusters with worker processes, free loopback ports, an S3 endpoint."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from unittest import mock

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS_DIR)
SUPPORT_DIR = os.path.join(TESTS_DIR, "support")

# The tests mirror the product's folders (tests/ddp_runtime/, tests/tasks/sweep/, ...; tests/e2e/ for whole runs),
# helpers and stand-in servers sit in tests/support/. No folder is a package: pytest imports a test module by its
# file name (the names are unique), with its folder on sys.path. Training functions defined in test modules and
# helpers are pickled by reference, so the Dask worker processes and subprocesses the tests start must import
# them by the same names, as a user's workers import the user's package: every such folder goes on PYTHONPATH.
# The project itself is imported as installed (``sweepflow.*``, ``ddp_runtime``), never from the checkout's root.
TEST_DIRS = [SUPPORT_DIR] + sorted(
    folder
    for folder, _, files in os.walk(TESTS_DIR)
    if folder != SUPPORT_DIR
    and not folder.startswith(SUPPORT_DIR + os.sep)
    and any(name.startswith("test_") and name.endswith(".py") for name in files)
)
os.environ["PYTHONPATH"] = os.pathsep.join([*TEST_DIRS, *filter(None, [os.environ.get("PYTHONPATH")])])
for folder in reversed(TEST_DIRS):
    if folder not in sys.path:
        sys.path.insert(0, folder)

# The clusters the tests start run with the background cluster's Dask settings (`sweepflow run` starts its local
# cluster with them): no 100-Hz profiler in every worker, slower dashboard timers. They live beside the tests on
# the same 2 cores. A nanny hands the settings of the moment to the worker process it starts.
import dask  # noqa: E402

from sweepflow.infra.services.local import local_dask_config  # noqa: E402

dask.config.set(local_dask_config())


#: Fixtures that start something -> the markers of every test using them (directly or through another fixture).
#: The markers say what a test starts (see pyproject's [tool.pytest.ini_options]); `make test-fast` deselects
#: them. Tests that start something without such a fixture carry the marker as a decorator.
FIXTURE_MARKERS: dict[str, tuple[str, ...]] = {
    "s3_endpoint": ("s3",),  # below: a moto S3 server
    "s3": ("s3",),  # test_datasets.py's own moto S3 server
    "prefect_harness": ("prefect",),  # below: prefect_test_harness
    "mlflow_server": ("mlflow_server",),  # tests/support/mlflow_server.py
    "_shared_cluster": ("dask",),  # below: the session's LocalCluster with worker processes
    "cluster": ("dask",),  # below, or a test module's own (test_faults_*: they kill workers)
    "gpu3": ("dask",),  # test_ddp_runtime.py
    # test_stack_hygiene.py: the stack on a PostgreSQL server (the `postgres` fixture, asked for inside it)
    "stack": ("stack", "s3", "mlflow_server", "prefect", "dask", "subprocess", "postgres"),
    "postgres": ("postgres",),  # below: a PostgreSQL server (tests/support/postgres_server.py)
    "browser": ("browser",),  # below: one headless Chromium for the module (tests/support/browser.py)
}


#: The modules that take longest (`make test`'s slowest list, summed per module), longest first. `make test` hands
#: whole modules (and classes) to its two workers in collection order (--dist loadscope --no-loadscope-reorder:
#: xdist's default reorder would sort them by their number of tests, which put test_resume.py, 2 tests and nearly
#: 3 minutes, among the last): starting the longest first keeps one worker from running a long module alone at
#: the end while the other idles. Within a module the order is unchanged.
LONGEST_FIRST = (
    "test_stack_hygiene.py",
    "test_faults_ranks.py",
    "test_multihost.py",
    "test_chaos.py",
    "test_resume.py",
    "test_cli.py",
    "test_own_project.py",
    "test_tune.py",
    "test_tune_search_algorithms.py",
    "test_ddp_runtime.py",
    "test_faults_services.py",
    "test_sgd_pytorch.py",
    "test_compare_ui.py",
    "test_preflight.py",
    "test_registry.py",
    "test_report_page.py",
    "test_cold_start.py",
    "test_secrets.py",
    "test_tune_pbt.py",
    "test_server_errors.py",
    "test_runtime_install.py",
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            for marker in FIXTURE_MARKERS.get(fixture, ()):
                item.add_marker(marker)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a module's own order stays


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless Chromium for the module's pages (``tests/support/browser.py``): each page a full load, the browser's
    process and caches shared; stopped and its profile removed after the module."""
    from browser import Browser

    with Browser(str(tmp_path_factory.mktemp("browser") / "profile")) as opened:
        yield opened


@pytest.fixture(scope="module")
def postgres():
    """A real PostgreSQL server on 127.0.0.1 (a free port) for the module, with a password-authenticated role
    (``tests/support/postgres_server.py``); stopped and removed after the module."""
    from postgres_server import postgres_server

    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[dict]:
    """A moto S3 server on 127.0.0.1 (a free port), with s3fs storage options to reach it."""
    from moto.server import ThreadedMotoServer

    # moto serves with werkzeug, which logs every request at INFO to whatever handles the root logger: tests that
    # read the CLI's stderr must see only the CLI.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": url}}
    try:
        yield {"url": url, "storage_options": options}
    finally:
        server.stop()


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory):
    """A real (temporary) Prefect API for the session: flow and task runs are recorded and queryable."""
    from prefect.settings import (
        PREFECT_API_BLOCKS_REGISTER_ON_START,
        PREFECT_LOCAL_STORAGE_PATH,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    from sweepflow.infra.services import sqlite_templates
    from sweepflow.infra.services.local import LOCAL_PREFECT_SERVER_SETTINGS, PREFECT_SERVER_SETTINGS
    from sweepflow.infra.services.prefect_server import prefect_template_version

    settings = {
        PREFECT_LOCAL_STORAGE_PATH: tmp_path_factory.mktemp("prefect-results"),  # not ~/.prefect/storage
        PREFECT_SERVER_ANALYTICS_ENABLED: False,
    }
    if os.path.exists(sqlite_templates.template_path("prefect", prefect_template_version())):
        # Its database is a copy of the template (below), whose block types are registered already.
        settings[PREFECT_API_BLOCKS_REGISTER_ON_START] = False
    with temporary_settings(settings):
        # The server runs with the background server's settings (`sweepflow server start`'s: quiet loop services,
        # the task-run recorder's batching): it lives as long as the session, beside the tests, on the same 2
        # cores. It takes them from the environment it starts with; no other process of the session gets them.
        harness = prefect_test_harness(server_startup_timeout=120)
        with (
            _environ({**PREFECT_SERVER_SETTINGS, **LOCAL_PREFECT_SERVER_SETTINGS}),
            mock.patch("prefect.testing.utilities.mkdtemp", _seeded_harness_dir),
        ):
            harness.__enter__()
        try:
            yield
        finally:
            harness.__exit__(None, None, None)


def _seeded_harness_dir() -> str:
    """The harness's temporary directory, its database already migrated when this Prefect version's template
    exists (``sweepflow.infra.services.sqlite_templates``; any new local server makes it): the harness's server then
    skips ~100 migrations. Without the template, or should the harness name its file otherwise, the server
    migrates its own as before."""
    from sweepflow.infra.services import sqlite_templates
    from sweepflow.infra.services.prefect_server import prefect_template_version

    directory = tempfile.mkdtemp()
    template = sqlite_templates.template_path("prefect", prefect_template_version())
    if os.path.exists(template):
        sqlite_templates.copy_database(template, os.path.join(directory, "prefect-test.db"))
    return directory


@contextlib.contextmanager
def _environ(updates: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``updates`` (variables already set keep their values) for the block."""
    added = {k: v for k, v in updates.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


from mlflow_server import mlflow_server  # noqa: E402,F401 - session fixture: a real `mlflow server`

#: The shared cluster's size: two 1-thread worker processes, room for a 2-rank group or two 1-rank trials.
SHARED_WORKERS = 2


@pytest.fixture(scope="session")
def _shared_cluster():
    """One Dask LocalCluster with worker processes for every test that only uses it (each worker imports torch
    once for the whole session). Tests that reshape a cluster start their own."""
    from ddp_runtime.cluster import local_cluster

    with local_cluster(n_workers=SHARED_WORKERS) as client:
        yield client


def whole(client, n_workers: int):
    """``client``'s cluster once it is whole: a test that failed a group had that group's workers restarted by
    their nannies, so wait until they are back and nothing is still reserved. Polls conditions (no sleeps as
    synchronisation), with bounds far above a busy machine's restart time."""
    from ddp_runtime import _gang as gang

    client.wait_for_workers(n_workers, timeout=180)
    deadline = time.monotonic() + 60  # a reservation ends when its last rank task returns
    while (held := client.run_on_scheduler(gang.reservations)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not held, f"a previous test left groups reserved on the cluster: {held}"
    return client


@pytest.fixture
def cluster(_shared_cluster):
    """The session's cluster, whole (see ``whole``)."""
    return whole(_shared_cluster, SHARED_WORKERS)


@pytest.fixture
def services(monkeypatch, prefect_harness, mlflow_server, cluster, tmp_path):  # noqa: F811 - the fixture above
    """A Tune experiment's services from the environment, as on a user's cluster: the Prefect harness, the
    session's MLflow server and the session's ``cluster``."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler.address)
    monkeypatch.setenv("SWEEPFLOW_HOME", str(tmp_path / "home"))
    from prefect.settings import PREFECT_API_URL

    # For subprocesses too: a driver without it would start (and leave running) a Prefect server of its own.
    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())
    return {"mlflow": mlflow_server, "dask": cluster.scheduler.address}


@pytest.fixture(autouse=True)
def _prefect_console_on_a_live_stream() -> Iterator[None]:
    """Prefect (re)configures its console handler with the ``sys.stderr`` of the moment: during a test using
    ``capsys`` that is the test's capture, closed when the test ends, and every later in-process flow run would
    fail logging to it (a RecursionError out of the logging error path). Put such handlers back on the real
    stderr after each test, whatever order the tests run in."""
    yield
    if "prefect" not in sys.modules:
        return
    import logging

    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in list(logging.root.manager.loggerDict))]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, PrefectConsoleHandler) and getattr(handler.stream, "closed", False):
                with handler.lock:  # not setStream(): it flushes the closed stream first
                    handler.stream = sys.__stderr__
                    handler.console.file = sys.__stderr__


def _leftovers(basetemp: str) -> list:
    """Processes still running that a test started and did not end: their command line, working directory or
    environment (SWEEPFLOW_HOME, PREFECT_HOME, state dirs) points into this session's temporary directory."""
    import psutil

    mine = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    inside = basetemp.rstrip(os.sep) + os.sep  # not a sibling session's /tmp/pytest-of-root/pytest-30
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "cwd", "environ"]):
        if process.info["pid"] in mine:
            continue
        info = process.info
        texts = [*(info["cmdline"] or []), info["cwd"] or "", *(info["environ"] or {}).values()]
        if any(inside in text or text == basetemp for text in texts):
            found.append(process)
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Once, in the controlling process: end what tests left running (by pid: they are ours, under our
    temporary directory) and say so, so that a leak is seen and never outlives the run into the next one."""
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: the controller checks once, at the end
        return
    import psutil

    basetemp = str(session.config._tmp_path_factory.getbasetemp())
    # What is on its way out is not a leak: e.g. an xdist worker's multiprocessing fork server, which exits once
    # the worker has (it tears torch down for a moment after).
    _, left = psutil.wait_procs(_leftovers(basetemp), timeout=5)
    if not left:
        return
    lines = []
    for process in left:
        try:
            lines.append(f"  pid {process.pid}: {' '.join(process.cmdline())[:200]}")
            process.terminate()
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(left, timeout=10)
    for process in alive:
        process.kill()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("!", "tests left processes running (ended now); a test does not clean up")
        reporter.write_line("\n".join(lines))
