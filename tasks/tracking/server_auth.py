"""The server side of sweepflow's MLflow routes: MLflow's basic-auth app when it runs, and server errors as JSON.

Two things every route sweepflow adds to an MLflow server needs:

- **Whether MLflow's basic-auth app runs in this server**, to check the user's permission as MLflow's own routes
  do. The app lives in ``mlflow.server.auth``, which needs Flask-WTF (``mlflow[auth]``, only in the ``stack``
  extra): importing it on a server that does not run it fails with ImportError on a runtime install. The app is
  running exactly when ``mlflow --app-name basic-auth`` (or ``sweepflow-basic-auth``) has imported and initialised
  that module, so it is looked up among the loaded modules and never imported here.
- **A server error the client can read**: an exception escaping a route is answered by Flask with an HTML "500
  Internal Server Error" page that names nothing. On the API paths, sweepflow's servers answer it as MLflow
  answers its own errors, JSON ``{"error_code": "INTERNAL_ERROR", "message": "<type>: <text>"}`` (URIs' passwords
  redacted), and log the traceback; the client then fails the write with that sentence at once instead of
  waiting for a server that is up (``sweepflow.tasks.tracking.runs``). An exception that is a lost database
  connection (PostgreSQL restarting) is answered 503 ``TEMPORARILY_UNAVAILABLE`` instead, which clients retry.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

AUTH_MODULE = "mlflow.server.auth"
API_PREFIXES = ("/api/", "/ajax-api/")


def basic_auth_app() -> ModuleType | None:
    """MLflow's basic-auth module when its app runs in this server (it has initialised), else None."""
    auth = sys.modules.get(AUTH_MODULE)
    if auth is None or not getattr(auth, "_auth_initialized", False):
        return None
    return auth


def denies(may: str) -> Any:
    """Under MLflow's basic-auth app: its 403 answer unless the user is an admin or ``auth.<may>()`` allows
    (``validate_can_update_run``, ``validate_can_read_run_artifact``...: the validators MLflow's own routes use;
    its before-request hook has authenticated the user, but has no validator for sweepflow's routes). None
    when the user may, or when the app does not run."""
    auth = basic_auth_app()
    if auth is None:
        return None
    if auth.sender_is_admin() or getattr(auth, may)():
        return None
    return auth.make_forbidden_response()


def server_error_answer(error: Any) -> Any:
    """Flask's handler for an unhandled exception (``InternalServerError``) on an API path: MLflow's JSON error
    with the exception's type and message; other paths (the UI) keep Flask's page."""
    from flask import jsonify, request

    from sweepflow.tasks.compat import lost_database_connection
    from sweepflow.tasks.datasets.uris import redact

    original = getattr(error, "original_exception", None)
    if original is None or not request.path.startswith(API_PREFIXES):
        return error
    message = redact(f"{type(original).__name__}: {original}")[:2000]
    if lost_database_connection(original):
        # The database went away under the request (PostgreSQL restarting): an outage the client retries, as
        # MLflow's store answers it when the error reaches its own handler (``compat.database_outages_answered_503``).
        # Here it escaped that handler: the store's rollback, on the same dead connection, raised past it.
        log.warning("%s %s: the database connection was lost (503): %s", request.method, request.path, message[:300])
        response = jsonify({"error_code": "TEMPORARILY_UNAVAILABLE", "message": message})
        response.status_code = 503
        return response
    log.error("%s %s failed", request.method, request.path, exc_info=original)
    response = jsonify({"error_code": "INTERNAL_ERROR", "message": message})
    response.status_code = 500
    return response
