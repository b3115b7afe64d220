"""The sweep report as a page of its own (sweepflow.tasks.reporting.report_page): MLflow serves every artifact as a
download, so sweepflow's MLflow app (``mlflow server --app-name sweepflow``) adds a route that serves a run's
report inline, sandboxed by its Content Security Policy. Checked against a real server: the headers, the paths it
refuses, basic-auth permissions, and the page as headless Chromium renders it from there (its script runs under
the policy and draws the plots)."""

from __future__ import annotations

import http.server
import json
import os
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from http_stub import serving
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from mlflow_server import basic_auth_env, run_mlflow_server

from sweepflow.infra.services.local import mlflow_app_args
from sweepflow.tasks.reporting.report_page import (
    PING_ROUTE,
    REPORT_CSP,
    REPORT_PATH,
    REPORT_ROUTE,
    _servable,
    page_url,
    report_page_url,
)
from sweepflow.tasks.reporting.sweep_report import write_sweep_report
from sweepflow.tasks.sweep.results import SweepResult, TrialResult, TrialStatus

SPACE = {
    "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
    "batch_size": {"type": "choice", "values": [32, 64]},
}


def _sweep() -> SweepResult:
    trials = tuple(
        TrialResult.from_history(
            [{"training_iteration": e, "val_loss": 2.0 - 0.2 * e - 0.1 * i} for e in range(1, 2 + i % 3)],
            metric="val_loss",
            mode="min",
            trial_id=f"trial_{i:04d}",
            index=i,
            name=f"train_{i}",
            config={"lr": 10.0 ** -(1 + i % 4), "batch_size": [32, 64][i % 2]},
            status=TrialStatus.COMPLETED if i % 3 == 2 else TrialStatus.STOPPED,
        )
        for i in range(5)
    )
    return SweepResult(trials=trials, metric="val_loss", mode="min")


def _get(
    url: str, auth: tuple[str, str] | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    if auth:
        import base64

        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def _log_report(client: MlflowClient, tmp_path, experiment: str) -> str:
    run = client.create_run(client.create_experiment(experiment)).info.run_id
    out = tmp_path / "report"
    write_sweep_report(_sweep(), out_dir=str(out), search_space=SPACE, title="served report")
    client.log_artifacts(run, str(out), "report")
    return run


# --------------------------------------------------------------------------------------------------
# Without a server
# --------------------------------------------------------------------------------------------------


def test_only_html_reports_are_servable() -> None:
    assert _servable("report/sweep_report.html")
    for path in (
        "report/../model/MLmodel",
        "model/MLmodel",
        "report/pbt.png",
        "/report/x.html",
        "report//x.html",
    ):
        assert not _servable(path), path
    url = page_url("http://127.0.0.1:5000/", "abc", REPORT_PATH)
    assert url == f"http://127.0.0.1:5000{REPORT_ROUTE}?run_id=abc&path=report%2Fsweep_report.html"


@pytest.fixture
def stock_server() -> Iterator[str]:
    """A server without the route: every path is a 404 (as a stock ``mlflow server`` answers PING_ROUTE)."""

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    with serving(NotFound) as url:
        yield url


def test_no_page_without_a_server_that_serves_it(stock_server: str) -> None:
    assert report_page_url("sqlite:///mlflow.db", None, "abc", REPORT_PATH) is None  # no server: no URL
    assert report_page_url(stock_server, stock_server, "abc", REPORT_PATH) is None  # a stock server
    closed = stock_server.rsplit(":", 1)[0] + ":9"  # the discard port: nothing listens on loopback
    assert report_page_url(closed, closed, "abc", REPORT_PATH) is None  # cannot be asked: the viewer's link


# --------------------------------------------------------------------------------------------------
# sweepflow's MLflow app
# --------------------------------------------------------------------------------------------------


@pytest.mark.browser
def test_the_server_serves_the_report_as_a_page(mlflow_server: str, browser, tmp_path) -> None:
    client = MlflowClient(mlflow_server)
    run = _log_report(client, tmp_path, "report-page")
    url = report_page_url(mlflow_server, mlflow_server, run, REPORT_PATH)
    assert url == page_url(mlflow_server, run, REPORT_PATH)

    status, headers, body = _get(url)
    assert status == 200 and body.startswith(b"<!DOCTYPE html>")
    assert (
        headers["content-type"] == "text/html; charset=utf-8" and headers["content-disposition"] == "inline"
    )
    assert headers["content-security-policy"] == REPORT_CSP and headers["x-content-type-options"] == "nosniff"
    # Opened again, the browser asks whether its copy is current: the answer ("not modified") carries the page's
    # headers, not the artifact endpoint's `attachment`, which the browser would merge into its copy and download
    # the page instead of showing it (found by opening the report twice in one Chromium).
    status, again, _ = _get(url, headers={"If-None-Match": headers["etag"]})
    assert status == 304 and again["content-disposition"] == "inline" and again["content-security-policy"] == REPORT_CSP
    # Why the route exists: MLflow's own artifact endpoint makes the browser download the page.
    status, headers, _ = _get(f"{mlflow_server}/get-artifact?path={REPORT_PATH}&run_uuid={run}")
    assert status == 200 and headers["content-disposition"].startswith("attachment")

    client.log_text(run, "<script>alert(1)</script>", "model/evil.html")
    for path in ("model/evil.html", "report/../model/evil.html"):
        assert _get(page_url(mlflow_server, run, path))[0] == 404, path
    assert _get(page_url(mlflow_server, "0" * 32, REPORT_PATH))[0] == 404  # no such run
    assert json.loads(_get(f"{mlflow_server}{PING_ROUTE}")[2]) == {
        "report_route": "/sweepflow/report",
        "finish_route": "/ajax-api/2.0/sweepflow/runs/finish",
    }

    # A browser renders it, and the page's script runs under the sandbox the policy sets.
    dom = browser.rendered_dom(url, wait_ms=5000)
    assert 'data-rendered="true"' in dom and '<div class="plot" id="plot-curves"><svg' in dom


@pytest.mark.mlflow_server
def test_basic_auth_reads_the_report_as_it_reads_artifacts(tmp_path, monkeypatch) -> None:
    """``--app-name sweepflow-basic-auth`` (``stack up --mlflow-auth-file``): logins as MLflow's basic-auth app,
    and the report only for the users who may read the run."""
    admin, password = "admin1", "pw-" + secrets.token_hex(8)
    env = basic_auth_env(tmp_path, admin=admin, password=password, default_permission="NO_PERMISSIONS")
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    with run_mlflow_server(
        str(tmp_path / "server"),
        default_artifact_root=artifacts.as_uri(),
        env=env,
        extra_args=tuple(mlflow_app_args("sweepflow-basic-auth")),  # as the stack's
    ) as uri:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", admin)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
        run = _log_report(MlflowClient(uri), tmp_path, "auth-report")
        url = report_page_url(uri, uri, run, REPORT_PATH)  # asked with the client's credentials
        assert url == page_url(uri, run, REPORT_PATH)
        assert _get(url)[0] == 401  # no login
        assert _get(url, (admin, password))[0] == 200
        from mlflow.server.auth.client import AuthServiceClient

        AuthServiceClient(uri).create_user("reader", "pw-reader-123456")
        assert _get(url, ("reader", "pw-reader-123456"))[0] == 403  # logged in, but no permission on the run
        assert os.environ["MLFLOW_TRACKING_USERNAME"] == admin

        # The route that ends a run with its last writes asks for what MLflow's update asks for.
        import requests

        from sweepflow.tasks.tracking.finish_route import FINISH_ROUTE
        from sweepflow.tasks.tracking.runs import RunTracker

        finish = {"run_id": run, "status": "FINISHED", "end_time": 1, "tags": [{"key": "k", "value": "v"}]}
        for auth, code in ((None, 401), (("reader", "pw-reader-123456"), 403)):
            assert requests.post(uri + FINISH_ROUTE, json=finish, auth=auth, timeout=30).status_code == code
        client = MlflowClient(uri)
        assert client.get_run(run).info.status == "RUNNING" and "k" not in client.get_run(run).data.tags
        tracker = RunTracker(uri, "auth-report")  # the admin's credentials, from the environment
        tracker.finish(run, "FINISHED", metrics=[Metric("m", 1.0, 1, 0)])
        assert tracker._has_finish_route()
        ended = client.get_run(run)
        assert ended.info.status == "FINISHED" and ended.data.metrics == {"m": 1.0}
