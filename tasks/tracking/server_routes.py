"""Which of sweepflow's routes an MLflow tracking server has: asked once, with the client's credentials.

sweepflow's MLflow servers run MLflow's app with routes of its own (``mlflow server --app-name sweepflow``: the
app plugin in ``sweepflow.tasks.reporting.report_page``): the sweep report as a page, and a run's end with its
last writes in one request (``sweepflow.tasks.tracking.finish_route``). A client asks ``GET <server>/sweepflow/
report-server`` which ones it has; a stock ``mlflow server`` answers 404, and the client does without them.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

APP_NAME = "sweepflow"  # `mlflow server --app-name sweepflow`: MLflow's app plus sweepflow's routes
PING_ROUTE = "/sweepflow/report-server"  # answers {"report_route": ..., "finish_route": ...}
PING_TIMEOUT_S = 10


def server_routes(tracking_uri: str, *, purpose: str) -> dict[str, Any] | None:
    """sweepflow's routes on the tracking server at ``tracking_uri`` (``{"report_route": ..., "finish_route":
    ...}``, see ``report_page._ping``): empty when it has none (a stock ``mlflow server``), None when it cannot be asked now.
    ``purpose``: what the caller wanted to know, for the log line when it has none."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request
    from requests import RequestException

    try:
        response = http_request(
            get_default_host_creds(tracking_uri),
            PING_ROUTE,
            "GET",
            max_retries=0,
            timeout=PING_TIMEOUT_S,
            raise_on_status=False,
        )
    except (MlflowException, RequestException) as exc:
        # Not at the top: the MLflow server imports this module, and the datasets package imports torch.
        from sweepflow.tasks.datasets.uris import redact

        logger.warning("could not ask %s whether it %s (%s)", redact(tracking_uri), purpose, redact(str(exc)))
        return None
    if response.status_code != 200:
        logger.info(
            "the tracking server has no sweepflow routes (%s %s: not started with `--app-name %s`); asked whether "
            "it %s",
            PING_ROUTE,
            response.status_code,
            APP_NAME,
            purpose,
        )
        return {}
    try:
        routes = response.json()
    except ValueError:  # a proxy's HTML error page, say
        return {}
    return routes if isinstance(routes, dict) else {}
