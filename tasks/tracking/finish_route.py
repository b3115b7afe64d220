"""A run's last writes and its end in one request: a route of sweepflow's MLflow servers.

A trial's MLflow run ends with what its writer holds (the last reports, system metrics, the outcome's tags) and
then its status and end time: with MLflow's REST API that is a ``log-batch`` and an ``update`` request, each a
round trip for the flow and a request and a database transaction for the tracking server. On a sweep of short
trials those requests are a good part of the control plane's CPU per trial (benchmarks/bench_load.py), so
sweepflow's MLflow servers (the app plugin in ``sweepflow.tasks.reporting.report_page``) take both in one::

    POST <server>/ajax-api/2.0/sweepflow/runs/finish
    {"run_id": ..., "metrics": [...], "params": [...], "tags": [...], "status": "FINISHED", "end_time": <ms>}

The batch is LogBatch's JSON (and MLflow's store validates it as for ``log-batch``), written first; then the
status and end time, as ``update``. Under MLflow's basic-auth app the user needs the permission ``update`` on the
run asks for. A server without the route (a stock ``mlflow server``) is asked once whether it has it
(``GET /sweepflow/report-server`` lists it) and gets the two requests.
"""

from __future__ import annotations

import json
from typing import Any

from sweepflow.tasks.tracking.server_auth import denies

FINISH_ROUTE = "/ajax-api/2.0/sweepflow/runs/finish"
FINISHING = ("FINISHED", "FAILED", "KILLED")


# ----------------------------------------------------------------------------------------- client side
def finish_payload(run_id: str, metrics: list, params: list, tags: list, status: str, end_time: int) -> dict:
    """The request's body: ``metrics``/``params``/``tags`` are MLflow entities, serialized as MLflow's own
    client does for ``log-batch`` (NaN and infinities included)."""
    from mlflow.protos.service_pb2 import LogBatch
    from mlflow.utils.proto_json_utils import message_to_json

    batch = LogBatch(
        run_id=run_id,
        metrics=[m.to_proto() for m in metrics],
        params=[p.to_proto() for p in params],
        tags=[t.to_proto() for t in tags],
    )
    return {**json.loads(message_to_json(batch)), "status": status, "end_time": int(end_time)}


def send_finish(tracking_uri: str, payload: dict) -> None:
    """One request, with MLflow's credentials, TLS settings and retries of passing failures; raises MLflow's
    exception for an error answer (as its client would for ``log-batch``)."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    response = http_request(get_default_host_creds(tracking_uri), FINISH_ROUTE, "POST", json=payload)
    verify_rest_response(response, FINISH_ROUTE)


# ----------------------------------------------------------------------------------------- server side
def finish_run_handler() -> Any:
    """The route's Flask view (registered by the app plugin)."""
    from flask import jsonify, request
    from mlflow.entities import Metric, Param, RunStatus, RunTag
    from mlflow.exceptions import MlflowException
    from mlflow.protos.service_pb2 import LogBatch
    from mlflow.server.handlers import _get_tracking_store, catch_mlflow_exception
    from mlflow.utils.proto_json_utils import parse_dict
    from mlflow.utils.validation import _validate_batch_log_api_req

    @catch_mlflow_exception
    def finish() -> Any:
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("run_id"), str) or not body["run_id"]:
            raise MlflowException.invalid_parameter_value(
                f"{FINISH_ROUTE} takes a JSON object with run_id, metrics, params, tags, status, end_time"
            )
        status, end_time = body.pop("status", None), body.pop("end_time", None)
        if status not in FINISHING or not isinstance(end_time, int) or isinstance(end_time, bool):
            raise MlflowException.invalid_parameter_value(
                f"{FINISH_ROUTE}: status must be one of {', '.join(FINISHING)} and end_time an integer (ms), "
                f"got {status!r} and {end_time!r}"
            )
        denied = denies("validate_can_update_run")  # as `update` and `log-batch` check
        if denied is not None:
            return denied
        _validate_batch_log_api_req(request.get_data(as_text=True))  # log-batch's size limit
        batch = LogBatch()
        parse_dict(body, batch)
        metrics = [Metric.from_proto(m) for m in batch.metrics]
        params = [Param.from_proto(p) for p in batch.params]
        tags = [RunTag.from_proto(t) for t in batch.tags]
        store = _get_tracking_store()
        if metrics or params or tags:
            store.log_batch(run_id=batch.run_id, metrics=metrics, params=params, tags=tags)
        _end_run(store, batch.run_id, RunStatus.from_string(status), end_time)
        return jsonify({})

    return finish()


def _end_run(store: Any, run_id: str, status: int, end_time: int) -> None:
    """``store.update_run_info(run_id, status, end_time, None)`` without what it returns: on MLflow's SQL store
    that builds the whole run (its params, tags and latest metrics, three more queries), a tenth of this route's
    CPU, for an answer nobody reads here. The same checks and writes as ``SqlAlchemyStore.update_run_info``
    (MLflow 3.17; ``_get_run`` and ``_check_run_is_active`` are its own helpers). If they break: call
    ``store.update_run_info`` (correct, slower)."""
    from mlflow.entities import RunStatus
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    if not isinstance(store, SqlAlchemyStore):
        store.update_run_info(run_id, status, end_time, None)
        return
    with store.ManagedSessionMaker(read_only=False) as session:
        run = store._get_run(run_uuid=run_id, session=session)
        store._check_run_is_active(run)
        run.status = RunStatus.to_string(status)
        run.end_time = end_time
        session.add(run)
