"""A tracking server that answers with an error of its own code is not an outage: the write fails at once with
the server's message, and a sweep stops instead of training trials whose results cannot be recorded.

The server here is sweepflow's MLflow app (under gunicorn, as `sweepflow run` starts it) whose finish route
raises: a ``sitecustomize`` on the server's PYTHONPATH replaces the route's last step, as a broken database
schema or a bug would. Before, MLflow's client retried its 500s as an outage (~4 minutes per request), then
sweepflow's own retries (2 more), and the run died saying the server was unreachable.
"""

from __future__ import annotations

import time
import uuid

import pytest
from mlflow.tracking import MlflowClient
from mlflow_server import run_mlflow_server
from test_pipeline import _config

from sweepflow.flows.pipeline import training_pipeline
from sweepflow.flows.settings import resolve_settings
from sweepflow.infra.services.local import mlflow_app_args
from sweepflow.tasks.tracking.runs import RunTracker, TrackingServerError
from sweepflow.tasks.tracking.writers import RunWriter

pytestmark = pytest.mark.mlflow_server

SERVER_MESSAGE = "no such column: runs.lifecycle_stage (a schema this server cannot write)"
BROKEN_FINISH = f'''
import sweepflow.tasks.tracking.finish_route as finish_route

def _end_run(store, run_id, status, end_time):
    raise RuntimeError({SERVER_MESSAGE!r})

finish_route._end_run = _end_run
'''


@pytest.fixture(scope="module")
def broken_server(tmp_path_factory: pytest.TempPathFactory):
    """sweepflow's MLflow server whose finish route raises (every run's end is a 500)."""
    state = tmp_path_factory.mktemp("broken-mlflow")
    site = state / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BROKEN_FINISH)
    with run_mlflow_server(
        str(state / "server"), env={"PYTHONPATH": str(site)}, extra_args=tuple(mlflow_app_args("sweepflow"))
    ) as url:
        yield url


def test_a_server_error_fails_the_write_at_once_with_the_servers_message(broken_server):
    tracker = RunTracker(broken_server, f"broken-{uuid.uuid4().hex[:8]}", retry_s=120)
    run_id, _ = tracker.create_run("trial")
    writer = RunWriter(tracker, run_id)
    writer.log({"val_loss": 0.5}, step=1)
    started = time.monotonic()
    writer.finish("FINISHED")
    with pytest.raises(TrackingServerError) as raised:
        writer.join()
    took = time.monotonic() - started
    message = str(raised.value)
    assert took < 10, f"a server error was retried for {took:.0f} s: {message}"
    assert f"RuntimeError: {SERVER_MESSAGE}" in message and "HTTP 500" in message, message
    assert "\n" not in message and "unreachable" not in message
    assert tracker.stats["retries"] == 0
    # The server is up: the next call works (nothing was "given up" on it).
    assert tracker.client.get_run(run_id).info.status == "RUNNING"


def test_a_sweep_whose_server_fails_stops_in_seconds_saying_why(broken_server, prefect_harness, cluster, tmp_path):
    """Six one-epoch trials, one at a time: the first trial's end fails, no other trial starts, and the run
    fails with the server's sentence."""
    cfg = resolve_settings(
        _config(
            tmp_path,
            cluster,
            broken_server,
            sweep={
                "search_space": {"quality": {"type": "grid", "values": [1, 2, 3, 4, 5, 6]}},
                "num_samples": 1,
                "max_concurrent_trials": 1,
            },
            training={
                "train_fn": "pipeline_helpers:scripted_quality",
                "epochs": 1,
                "model_fn": "sweepflow.tasks.training.builtin:model_fn",
            },
            evaluation={"evaluate_fn": "sweepflow.tasks.training.builtin:evaluate_fn"},
            scheduler={"type": "fifo"},
            resources={"ranks_per_trial": 1},
            mlflow={"experiment_name": f"broken-{uuid.uuid4().hex[:8]}"},
        )
    )
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        training_pipeline(config=cfg)
    took = time.monotonic() - started
    message = str(raised.value)
    print(f"failed after {took:.1f} s: {message}")
    assert SERVER_MESSAGE in message and "HTTP 500" in message, message
    assert took < 90, f"the run took {took:.0f} s to fail"
    client = MlflowClient(broken_server)
    experiment = client.get_experiment_by_name(cfg.mlflow.experiment_name)
    trials = client.search_runs([experiment.experiment_id], "tags.`sweepflow.trial_id` != ''")
    assert 1 <= len(trials) < 6, f"{len(trials)} trials started after the server's first error"
