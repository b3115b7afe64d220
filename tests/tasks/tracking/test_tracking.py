"""The per-run background writer against a real MLflow server: order, batching, end status, errors surfaced."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
import uuid

import pytest
from mlflow_server import sqlite_store

from sweepflow.tasks.tracking.params import flatten
from sweepflow.tasks.tracking.runs import RunTracker, direct_storage_uri, metric_batch
from sweepflow.tasks.tracking.writers import RunWriter


def test_run_writer_writes_everything_in_order_and_ends_the_run(mlflow_server):
    tracker = RunTracker(mlflow_server, f"writer-{uuid.uuid4().hex[:8]}")
    run_id, artifact_uri = tracker.create_run("trial", tags={"sweepflow.trial_id": "t0"})
    assert tracker.client.get_run(run_id).info.artifact_uri == artifact_uri
    writer = RunWriter(tracker, run_id)
    writer.log_params({"lr": 0.01, "model": {"l1": 64}})
    for epoch in range(1, 6):
        writer.log({"val_loss": 1.0 / epoch, "epoch": epoch}, step=epoch)
    writer.set_tags({"sweepflow.status": "COMPLETED"})
    writer.finish("KILLED")
    writer.join()

    run = tracker.client.get_run(run_id)
    assert run.info.status == "KILLED" and run.info.end_time is not None
    assert run.data.params == {"lr": "0.01", "model.l1": "64"}
    assert run.data.tags["sweepflow.status"] == "COMPLETED"
    history = tracker.client.get_metric_history(run_id, "val_loss")
    assert [(m.step, round(m.value, 4)) for m in history] == [(e, round(1.0 / e, 4)) for e in range(1, 6)]


def test_config_keys_mlflow_would_refuse_are_written_under_names_it_takes(mlflow_server):
    """A trial's config keys are the user's ("refs.CNN module (87 KB)", "lr@stage2", a 300-character key):
    MLflow refuses such a param name, failing the whole batch (the sweep ended with "some trial results did not
    reach MLflow"); they are written with ``_`` for what a name may not hold, at most 250 characters, and two
    keys that come out the same both kept."""
    tracker = RunTracker(mlflow_server, f"names-{uuid.uuid4().hex[:8]}")
    run_id, _ = tracker.create_run("trial")
    writer = RunWriter(tracker, run_id)
    long_key = "k" * 300
    writer.log_params(
        {"refs": {"CNN module (87 KB)": "ref-1"}, "lr@stage2": 0.1, "lr#stage2": 0.2, long_key: 1}
    )
    writer.finish("FINISHED")
    writer.join()
    params = tracker.client.get_run(run_id).data.params
    assert params == {
        "refs.CNN module _87 KB_": "ref-1",
        "lr_stage2": "0.1",
        "lr_stage2_2": "0.2",
        "k" * 250: "1",
    }
    assert flatten("", {"a": {"b(c)": 1}, "ok-name_1.x/y:z w": 2}) == {"a.b_c_": 1, "ok-name_1.x/y:z w": 2}


def test_run_writer_raises_a_failed_background_write_on_join(mlflow_server):
    tracker = RunTracker(mlflow_server, f"writer-{uuid.uuid4().hex[:8]}")
    writer = RunWriter(tracker, uuid.uuid4().hex)  # no such run: every write fails on the server
    writer.log({"val_loss": 1.0}, step=1)
    writer.finish("FINISHED")
    with pytest.raises(RuntimeError, match="writing MLflow run"):
        writer.join()


def test_proxied_artifact_uris_map_onto_the_servers_destination():
    uri = "mlflow-artifacts:/3/0123abcd/artifacts"
    assert direct_storage_uri(uri) is None  # unknown destination: only the server can write there
    assert direct_storage_uri(uri, "s3://bucket/mlflow/") == "s3://bucket/mlflow/3/0123abcd/artifacts"
    assert (
        direct_storage_uri("mlflow-artifacts://host:5000/3/r/artifacts", "s3://b/m")
        == "s3://b/m/3/r/artifacts"
    )
    assert direct_storage_uri("file:///tmp/a%20b/artifacts") == "/tmp/a b/artifacts"
    assert direct_storage_uri("s3://bucket/x/artifacts", "s3://other") == "s3://bucket/x/artifacts"


def _wait_for_status(tracker, run_id, status, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tracker.client.get_run(run_id).info.status == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} never reached {status}")


def test_a_writer_sets_the_status_logs_and_ends_the_run_in_order(mlflow_server):
    tracker = RunTracker(mlflow_server, f"writer-{uuid.uuid4().hex[:8]}")
    run_id, _ = tracker.create_run("trial")
    writer = RunWriter(tracker, run_id)
    writer.set_status("SCHEDULED")
    _wait_for_status(tracker, run_id, "SCHEDULED")
    writer.set_status("RUNNING")
    writer.log({"val_loss": 0.5}, step=1)
    writer.finish("FINISHED")
    writer.join()
    run = tracker.client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics == {"val_loss": 0.5}


def test_a_runs_writes_linger_and_go_out_together_and_its_end_cuts_the_linger_short(mlflow_server):
    """Every request costs the tracking server a transaction: a short trial's params, reports, system-metric
    samples (with the time they were taken) and outcome, queued within the linger, go out together at its end,
    which does not wait for the linger."""
    tracker = RunTracker(mlflow_server, f"writer-{uuid.uuid4().hex[:8]}")
    run_id, _ = tracker.create_run("trial")
    writer = RunWriter(tracker, run_id, linger_s=60.0)
    writer.log_params({"lr": 0.01})
    writer.log({"val_loss": 0.5}, step=1)
    writer.log({"system/cpu_utilization_percentage": 42.0}, step=0, timestamp_ms=1_000_000)
    time.sleep(1.0)
    assert not tracker.client.get_run(run_id).data.metrics  # lingering
    writer.log({"val_loss": 0.4}, step=2)
    started = time.monotonic()
    writer.finish("FINISHED")
    writer.join()
    assert time.monotonic() - started < 30  # not the 60-s linger
    run = tracker.client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"lr": "0.01"}
    assert list(run.data.metrics)[0] == "val_loss"  # in the order queued: MLflow's compare view opens on it
    assert [m.step for m in tracker.client.get_metric_history(run_id, "val_loss")] == [1, 2]
    (sample,) = tracker.client.get_metric_history(run_id, "system/cpu_utilization_percentage")
    assert (sample.value, sample.step, sample.timestamp) == (42.0, 0, 1_000_000)


def test_public_params_remove_credentials_and_storage_options():
    from sweepflow.tasks.tracking.params import public_params

    params = public_params(
        {
            "mlflow.tracking_uri": "https://alice:s3cr3t@mlflow.example.com",
            "data.source": "s3://bucket/data",
            "dask.scheduler_address": "tls://bob:tok@scheduler:8786",
            "data.storage_options.key": "AKIA",
            "data.storage_options.client_kwargs.endpoint_url": "http://127.0.0.1:9000",
            "sweep.num_samples": 8,
        }
    )
    assert params == {
        "mlflow.tracking_uri": "https://***@mlflow.example.com",
        "data.source": "s3://bucket/data",
        "dask.scheduler_address": "tls://***@scheduler:8786",
        "sweep.num_samples": 8,
    }
    assert "s3cr3t" not in str(params) and "tok" not in str(params) and "AKIA" not in str(params)


def test_run_writers_let_go_of_ended_writers_and_still_raise_their_errors(mlflow_server):
    """A sweep's writers: one that ended is dropped when the next is added (a long sweep would hold them all),
    and a failed one's error still reaches the sweep's join."""
    from sweepflow.tasks.tracking.writers import RunWriters

    tracker = RunTracker(mlflow_server, f"writers-{uuid.uuid4().hex[:8]}")
    writers = RunWriters()
    for i in range(3):
        run_id, _ = tracker.create_run(f"trial-{i}")
        writer = RunWriter(tracker, run_id, linger_s=0.01)
        writers.add(writer)
        writer.log({"val_loss": 1.0}, step=1)
        writer.finish("FINISHED")
        writer.join()
    assert len(writers) == 1  # the two before ended: let go
    broken = RunWriter(tracker, uuid.uuid4().hex, linger_s=0.01)  # no such run: its writes fail
    writers.add(broken)
    broken.log({"val_loss": 1.0}, step=1)
    broken.finish("FINISHED")
    with pytest.raises(RuntimeError):
        broken.join()
    run_id, _ = tracker.create_run("trial-after")
    last = RunWriter(tracker, run_id, linger_s=0.01)
    writers.add(last)  # lets go of the broken one, keeps its error
    assert len(writers) == 1
    last.finish("FINISHED")
    with pytest.raises(RuntimeError, match="some trial results did not reach MLflow"):
        writers.join()
    assert tracker.client.get_run(run_id).info.status == "FINISHED"


def test_a_runs_last_writes_and_its_end_go_in_one_request_to_sweepflows_server(mlflow_server, monkeypatch):
    """sweepflow's MLflow app takes what the writer still holds and the run's end together (log-batch and
    update were two requests, two transactions): nothing else is sent, and everything lands, NaN included."""
    tracker = RunTracker(mlflow_server, f"writer-{uuid.uuid4().hex[:8]}")
    run_id, _ = tracker.create_run("trial")
    writer = RunWriter(tracker, run_id, linger_s=60.0)
    writer.log_params({"lr": 0.01})
    writer.log({"val_loss": 0.5, "diverged": float("nan")}, step=1)
    writer.set_tags({"sweepflow.outcome": "stopped early"})
    other_requests: list[str] = []
    monkeypatch.setattr(tracker.client, "log_batch", lambda *a, **k: other_requests.append("log-batch"))
    monkeypatch.setattr(tracker, "_update_run_info", lambda *a, **k: other_requests.append("update"))
    writer.finish("KILLED")
    writer.join()
    assert other_requests == [] and tracker._has_finish_route()
    run = tracker.client.get_run(run_id)
    assert run.info.status == "KILLED" and run.info.end_time >= run.info.start_time
    assert run.data.params == {"lr": "0.01"} and run.data.tags["sweepflow.outcome"] == "stopped early"
    assert (
        run.data.metrics["val_loss"] == 0.5 and run.data.metrics["diverged"] != run.data.metrics["diverged"]
    )


def test_the_finish_route_refuses_what_update_would(mlflow_server):
    """A status that is not an end, a missing end time, a run that does not exist: MLflow's error answers."""
    import requests

    from sweepflow.tasks.tracking.finish_route import FINISH_ROUTE

    tracker = RunTracker(mlflow_server, f"writer-{uuid.uuid4().hex[:8]}")
    run_id, _ = tracker.create_run("trial")
    url = mlflow_server.rstrip("/") + FINISH_ROUTE
    for body in (
        {"run_id": run_id, "status": "RUNNING", "end_time": 1},
        {"run_id": run_id, "status": "FINISHED"},
        {"status": "FINISHED", "end_time": 1},
    ):
        response = requests.post(url, json=body, timeout=30)
        assert response.status_code == 400 and response.json()["error_code"] == "INVALID_PARAMETER_VALUE", (
            body
        )
    missing = requests.post(
        url, json={"run_id": uuid.uuid4().hex, "status": "FINISHED", "end_time": 1}, timeout=30
    )
    assert missing.status_code == 404, missing.text
    assert tracker.client.get_run(run_id).info.status == "RUNNING"


def test_without_the_route_the_end_is_a_batch_then_an_update(tmp_path):
    """A store without sweepflow's server (here SQLite; a stock ``mlflow server`` alike) gets the two calls."""
    tracker = RunTracker(sqlite_store(tmp_path), "writer")
    run_id, _ = tracker.create_run("trial")
    writer = RunWriter(tracker, run_id)
    writer.log({"val_loss": 0.5}, step=1)
    writer.finish("FINISHED")
    writer.join()
    assert not tracker._has_finish_route()
    run = tracker.client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics == {"val_loss": 0.5}


def test_the_server_answers_the_uis_bulk_metric_history_for_a_hundred_runs(mlflow_server):
    """MLflow's UI charts a metric of up to 100 runs with one GET whose query string lists their ids: with a
    system metric's name the request line is longer than gunicorn's default bound (4094 bytes), which sweepflow's
    server (gunicorn) lifts."""
    key = "system/cpu_utilization_percentage"
    tracker = RunTracker(mlflow_server, f"bulk-{uuid.uuid4().hex[:8]}")
    run_ids = [tracker.create_run(f"trial_{i:04d}")[0] for i in range(100)]
    for i, run_id in enumerate(run_ids):
        tracker.finish(run_id, "FINISHED", metrics=metric_batch({key: i}, step=1, timestamp_ms=1))
    path = "/ajax-api/2.0/mlflow/metrics/get-history-bulk?" + urllib.parse.urlencode(
        [("metric_key", key), *[("run_id", r) for r in run_ids]]
    )
    assert len(f"GET {path} HTTP/1.1") > 4094
    with urllib.request.urlopen(mlflow_server + path, timeout=60) as response:
        metrics = json.load(response)["metrics"]
    assert sorted((m["run_id"], m["value"]) for m in metrics) == sorted(
        (run_id, float(i)) for i, run_id in enumerate(run_ids)
    )


def test_a_sweeps_pareto_front_goes_on_its_parent_run_through_the_tracker(mlflow_server):
    """record_sweep's Pareto front: the artifact pareto_front.json and the tag sweepflow.pareto_front, written by
    the RunTracker (its retrying calls), as Tune's multi-objective experiments read them."""
    from sweepflow.tasks.recording import PARETO_FRONT_FILE, record_pareto_front
    from sweepflow.tasks.sweep.results import TrialResult, TrialStatus

    def ended(index: int, loss: float, acc: float, status: str = "COMPLETED") -> TrialResult:
        return TrialResult(
            trial_id=f"t{index}",
            index=index,
            name=f"t{index}",
            config={"lr": index / 10},
            status=TrialStatus(status),
            run_id=f"run{index}",
            last={"loss": loss, "acc": acc},
        )

    tracker = RunTracker(mlflow_server, f"pareto-{uuid.uuid4().hex[:8]}")
    parent = tracker.start_run("parent")
    trials = [ended(0, 1.0, 0.5), ended(1, 2.0, 0.9), ended(2, 2.0, 0.4), ended(3, 0.1, 1.0, "FAILED")]
    front = record_pareto_front(trials, tracker, parent, (("loss", "min"), ("acc", "max")))
    assert [t.trial_id for t in front] == ["t0", "t1"]
    assert tracker.client.get_run(parent).data.tags["sweepflow.pareto_front"] == "t0,t1"
    with open(tracker.client.download_artifacts(parent, PARETO_FRONT_FILE)) as f:
        data = json.load(f)
    assert data == {
        "objectives": [{"metric": "loss", "mode": "min"}, {"metric": "acc", "mode": "max"}],
        "trials": [
            {
                "trial_id": "t0",
                "mlflow_run_id": "run0",
                "config": {"lr": 0.0},
                "values": {"loss": 1.0, "acc": 0.5},
            },
            {
                "trial_id": "t1",
                "mlflow_run_id": "run1",
                "config": {"lr": 0.1},
                "values": {"loss": 2.0, "acc": 0.9},
            },
        ],
    }
    record_pareto_front(trials[3:], tracker, parent, (("loss", "min"), ("acc", "max")))  # only a failed trial
    assert tracker.client.get_run(parent).data.tags["sweepflow.pareto_front"] == "none"
