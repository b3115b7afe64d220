"""The sweep report as a page of its own: served by the MLflow tracking server, opened in a tab of its own.

MLflow serves every artifact as a download (``Content-Disposition: attachment``, on ``/get-artifact`` and on
``/api/2.0/mlflow-artifacts/artifacts/...`` alike: HTML from its own origin could script its UI), and its UI
shows an HTML artifact in an ``<iframe sandbox="allow-scripts">`` three clicks deep, where no link can open.
So sweepflow's MLflow servers (``sweepflow run``/``server``, ``stack up``, infra/k8s) run MLflow's app with one
more route, through MLflow's own plugin hook (``mlflow server --app-name sweepflow``, entry point
``mlflow.app``)::

    GET <server>/sweepflow/report?run_id=<run>&path=report/sweep_report.html

It reads the artifact through MLflow's own ``/get-artifact`` handler (so proxied and direct artifact stores,
``--static-prefix`` and basic-auth permissions behave as there) and serves it inline, under a Content Security
Policy that makes that safe: ``sandbox`` gives the page an opaque origin (its script can reach neither MLflow's
cookies nor its API as the user), ``default-src 'none'`` lets it fetch nothing, ``allow-popups-to-escape-sandbox``
lets its ``target="_blank"`` links open ordinary tabs. Only HTML files under ``report/`` are served this way.

A tracking server without the route (a stock ``mlflow server``) keeps the link into MLflow's artifact viewer:
``report_page_url`` asks the server first (``GET /sweepflow/report-server``).
"""

from __future__ import annotations

import os
import posixpath
from typing import Any
from urllib.parse import urlencode

from sweepflow.tasks.compat import database_outages_answered_503
from sweepflow.tasks.tracking.finish_route import FINISH_ROUTE, finish_run_handler
from sweepflow.tasks.tracking.server_auth import denies, server_error_answer
from sweepflow.tasks.tracking.server_routes import APP_NAME, PING_ROUTE, server_routes
from sweepflow.tasks.tracking.sqlite_statistics import start_statistics_keeper

__all__ = [
    "APP_NAME",
    "AUTH_APP_NAME",
    "PING_ROUTE",
    "REPORT_CSP",
    "REPORT_PATH",
    "REPORT_ROUTE",
    "create_app",
    "create_app_with_basic_auth",
    "report_page_url",
]

AUTH_APP_NAME = "sweepflow-basic-auth"  # APP_NAME on top of MLflow's basic-auth app
REPORT_ROUTE = "/sweepflow/report"
REPORT_DIR = "report/"
REPORT_PATH = "report/sweep_report.html"  # the sweep report, as the parent run's artifact
# The page runs as an opaque origin and fetches nothing; its links may open (unsandboxed) tabs.
REPORT_CSP = (
    "sandbox allow-scripts allow-popups allow-popups-to-escape-sandbox; default-src 'none'; "
    "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
)


# --------------------------------------------------------------------------------------------------
# Client side: the page's address
# --------------------------------------------------------------------------------------------------


def page_url(server: str, run_id: str, path: str) -> str:
    """The report route's address of artifact ``path`` of run ``run_id`` on ``server`` (no credentials)."""
    return f"{server.rstrip('/')}{REPORT_ROUTE}?{urlencode({'run_id': run_id, 'path': path})}"


def report_page_url(tracking_uri: str, ui: str | None, run_id: str, path: str) -> str | None:
    """The page's address when the tracking server at ``tracking_uri`` serves report pages; None when it does
    not (a stock ``mlflow server``, a store without a server) or cannot be asked. ``ui``: the server's address
    for a browser (the tracking URI without credentials)."""
    if not ui or not tracking_uri.startswith(("http://", "https://")):
        return None
    return page_url(ui, run_id, path) if _serves_report_pages(tracking_uri) else None


def _serves_report_pages(tracking_uri: str) -> bool:
    # The report is logged either way; without the route its link goes to MLflow's artifact viewer.
    routes = server_routes(tracking_uri, purpose="serves report pages (if not: its artifact view is linked)")
    return bool(routes) and routes.get("report_route") == REPORT_ROUTE


# --------------------------------------------------------------------------------------------------
# Server side: the route, as an MLflow app plugin (entry points "mlflow.app" in pyproject.toml)
# --------------------------------------------------------------------------------------------------


def _servable(path: str) -> bool:
    """Only the reports' HTML: the route must not become a way to show any artifact as a page."""
    normal = posixpath.normpath(path)
    return (
        normal == path and normal.startswith(REPORT_DIR) and normal.endswith(".html") and ".." not in normal
    )


def _serve_report() -> Any:
    from flask import Response, request
    from mlflow.server.handlers import get_artifact_handler

    path = request.args.get("path", "")
    if not request.args.get("run_id") or not _servable(path):
        return Response(
            f"{REPORT_ROUTE} serves HTML reports under {REPORT_DIR!r}: ?run_id=<run>&path={REPORT_DIR}<file>.html",
            status=404,
            mimetype="text/plain",
        )
    denied = denies("validate_can_read_run_artifact")  # as /get-artifact checks
    if denied is not None:
        return denied
    response = get_artifact_handler()  # MLflow's own: the run's artifact store, proxied or not
    # 200, or 304 to a browser that asks whether its copy is current: the headers below go on both, since the
    # browser merges a 304's headers into its copy (with MLflow's `attachment` it downloads the page it showed).
    if response.status_code not in (200, 304):  # e.g. no such run or file: MLflow's JSON error, as it is
        return response
    response.headers["Content-Type"] = "text/html; charset=utf-8"
    response.headers["Content-Disposition"] = "inline"
    response.headers["Content-Security-Policy"] = REPORT_CSP
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def _ping() -> Any:
    from flask import jsonify

    return jsonify({"report_route": REPORT_ROUTE, "finish_route": FINISH_ROUTE})


def _add_routes(app: Any) -> None:
    from mlflow.server.handlers import _add_static_prefix
    from werkzeug.exceptions import InternalServerError

    if any(rule.rule == _add_static_prefix(REPORT_ROUTE) for rule in app.url_map.iter_rules()):
        return  # one app per process, but a factory may be called twice (tests)
    app.add_url_rule(_add_static_prefix(REPORT_ROUTE), "sweepflow_report", _serve_report, methods=["GET"])
    app.add_url_rule(_add_static_prefix(PING_ROUTE), "sweepflow_report_server", _ping, methods=["GET"])
    app.add_url_rule(
        _add_static_prefix(FINISH_ROUTE), "sweepflow_finish_run", finish_run_handler, methods=["POST"]
    )
    # An exception escaping any API route: MLflow's JSON error naming it, not Flask's anonymous HTML page.
    app.register_error_handler(InternalServerError, server_error_answer)
    _keep_sqlite_statistics()


def _keep_sqlite_statistics() -> None:
    """In a server's process: a database that drops connections answered 503 (compat), and on SQLite its
    planner statistics kept fresh as runs grow (tracking/sqlite_statistics.py)."""
    from mlflow.server.constants import BACKEND_STORE_URI_ENV_VAR
    from mlflow.server.handlers import _get_tracking_store

    if os.environ.get(BACKEND_STORE_URI_ENV_VAR):  # a server process (`mlflow server` sets it), not an import
        database_outages_answered_503()
        start_statistics_keeper(_get_tracking_store())


def _served(app: Any) -> Any:
    """What the server runs: under uvicorn (MLflow 3's default) the FastAPI app around the Flask one, as MLflow's
    own basic-auth app does; under gunicorn/waitress the Flask app."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME

    if _MLFLOW_SGI_NAME.get() == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app


def create_app(app: Any = None) -> Any:
    """``mlflow server --app-name sweepflow``: MLflow's tracking server with the report route."""
    from mlflow.server import app as mlflow_app

    app = mlflow_app if app is None else app
    _add_routes(app)
    return _served(app)


def create_app_with_basic_auth(app: Any = None) -> Any:
    """``mlflow server --app-name sweepflow-basic-auth``: MLflow's basic-auth app with the report route (which
    reads a run's report for the users who may read its artifacts)."""
    from mlflow.server import app as mlflow_app
    from mlflow.server.auth import create_app as basic_auth_app

    app = mlflow_app if app is None else app
    _add_routes(app)
    return basic_auth_app(app)
