"""Shared fixtures: real Dask LocalClusters with worker processes, free loopback ports, an S3 endpoint."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS_DIR)

# Training functions defined in test modules are pickled by reference: the Dask worker processes the tests
# start must be able to import them, as a user's workers import the user's package. The project itself is
# imported as installed (``sweepflow.*``, ``ddp_runtime``), never from the checkout's root.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH")) if p)
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[dict]:
    """A moto S3 server on 127.0.0.1 (a free port), with s3fs storage options to reach it."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port())
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": url}}
    try:
        yield {"url": url, "storage_options": options}
    finally:
        server.stop()


@pytest.fixture(scope="session")
def prefect_harness():
    """A real (temporary) Prefect API for the session: flow and task runs are recorded and queryable."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


from mlflow_server import mlflow_server  # noqa: E402,F401 - session fixture: a real `mlflow server`
