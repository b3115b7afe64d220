"""Service outages mid-sweep, injected for real (issue 12, faults 2, 3, 4 and 7).

* 2 — the MLflow tracking server unreachable for seconds while trials report (a ``FaultProxy`` in front of the
  session's real ``mlflow server``): no trial fails, nothing is lost or written twice; and a server that stays
  down fails the sweep within ``SWEEPFLOW_MLFLOW_RETRY_S``, naming the server, with the parent run resumable.
* 3 — the S3 endpoint (moto behind a ``FaultProxy``) unreachable while a checkpoint is written: the write is
  retried and the trial completes; an endpoint that stays down fails the trial naming the endpoint, and the
  half-written checkpoint never becomes the latest.
* 4 — a real Prefect server (``prefect server start``, own PREFECT_HOME) restarted on the same port while a
  ``sweepflow run`` subprocess sweeps.
* 7 — two pipelines at once on one Dask cluster and one MLflow server.

The training functions below run on the Dask workers, which import this module by name (tests/ is on their
PYTHONPATH, see conftest.py): its top level imports only what a worker has anyway.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from mlflow_server import sqlite_store
from prefect_records import FINAL_STATE_TYPES, recorded

import ddp_runtime as train

OUTAGE_S = 6.0  # longer than the first few backoff steps, short enough for a quick test
PER_EPOCH_METRICS = ("epoch", "train_loss", "val_loss", "val_accuracy", "training_iteration")
SECRET = "fault-secret-Qw8Zr4"  # a credential that must not reach any message


# --------------------------------------------------------------------------------- training functions (workers)


def paced_classifier(config: dict[str, Any]) -> None:
    """The default trainer (digits), each report ``config["pace_s"]`` later: trials that last long enough for
    an outage to fall inside them."""
    from sweepflow.tasks.training.loop import train_image_classifier

    report = train.report

    def paced(metrics: dict[str, Any], checkpoint: train.Checkpoint | None = None) -> None:
        time.sleep(float(config.get("pace_s", 0.0)))
        report(metrics, checkpoint=checkpoint)

    # The loop calls ddp_runtime.report by attribute; one rank per worker process, so the swap is ours alone.
    train.report = paced
    try:
        train_image_classifier(config)
    finally:
        train.report = report


def two_file_checkpoints(config: dict[str, Any]) -> None:
    """``epochs`` reports, each with a checkpoint of two files (a.bin, then b.bin): a write cut between them
    leaves a half-written checkpoint."""
    for epoch in range(1, config["epochs"] + 1):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "a.bin").write_bytes(b"a" * 2048 + bytes([epoch]))
            Path(d, "b.bin").write_bytes(b"b" * 2048 + bytes([epoch]))
            train.report({"epoch": epoch, "loss": 1.0 / epoch}, checkpoint=train.Checkpoint.from_directory(d))


# ----------------------------------------------------------------------------------------------------- helpers


def _proxy_to(url: str):
    from faultproxy import FaultProxy

    parts = urlsplit(url)
    return FaultProxy(parts.hostname, parts.port)


def _pipeline_config(
    tmp_path: Path,
    cluster,
    tracking_uri: str,
    *,
    experiment: str,
    l1: list[int],
    epochs: int,
    pace_s: float,
    model: str | None = None,
):
    """A small sweep of the paced default trainer: one 1-rank trial per ``l1`` value, FIFO, ``epochs`` each."""
    from sweepflow.flows.config import PipelineConfig

    return PipelineConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "dask": {"scheduler_address": cluster.scheduler.address},
            "mlflow": {
                "tracking_uri": tracking_uri,
                "experiment_name": experiment,
                "registered_model_name": model or f"{experiment}-model",
            },
            "sweep": {
                "search_space": {
                    "l1": {"type": "grid", "values": l1},
                    "l2": 8,
                    "lr": 0.01,
                    "batch_size": 64,
                },
                "num_samples": 1,
            },
            "training": {
                "train_fn": "test_faults_services:paced_classifier",
                "model_fn": "sweepflow.tasks.training.builtin:model_fn",
                "epochs": epochs,
                "base_config": {"optimizer": "adam", "pace_s": pace_s},
            },
            "scheduler": {"type": "fifo"},
            "resources": {"ranks_per_trial": 1},
            "evaluation": {"evaluate_fn": "sweepflow.tasks.training.builtin:evaluate_fn"},
        }
    )


def _assert_children_exact(client, parent_run_id: str, *, l1: list[int], epochs: int) -> list:
    """The parent's child runs are exactly one per trial of its grid, each complete and written once: params
    present, FINISHED, and every metric holding exactly one value per step (the per-epoch ones at 1..epochs)."""
    parent = client.get_run(parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'"
    )
    assert sorted(int(c.data.params["l1"]) for c in children) == sorted(l1), (
        "one child run per trial, no more"
    )
    assert len({c.data.tags["sweepflow.trial_id"] for c in children}) == len(l1)
    for child in children:
        run_id = child.info.run_id
        assert {"l1", "l2", "lr", "batch_size", "num_ranks", "gpus_per_rank"} <= set(child.data.params)
        assert child.info.status == "FINISHED" and child.data.tags["sweepflow.status"] == "COMPLETED", run_id
        assert child.info.end_time is not None
        assert set(PER_EPOCH_METRICS) <= set(child.data.metrics)
        for key in child.data.metrics:
            steps = collections.Counter(m.step for m in client.get_metric_history(run_id, key))
            doubled = {step: n for step, n in steps.items() if n != 1}
            assert not doubled, f"run {run_id} metric {key!r}: steps written more than once: {doubled}"
            if key in PER_EPOCH_METRICS:
                assert sorted(steps) == list(range(1, epochs + 1)), (
                    f"run {run_id} metric {key!r}: {sorted(steps)}"
                )
    return children


# ----------------------------------------------------------------------------------- 2: MLflow server outages


def test_a_write_whose_answer_was_lost_is_read_back_not_written_twice(mlflow_server, monkeypatch):
    """The ambiguous failures, one at a time: the server creates the run (then a batch of metrics and params)
    but its answer is cut, and the connection stays cut for a second. The retry finds the run by its creation
    id instead of creating a second one, and reads the batch back instead of re-sending it (MLflow's own
    retries off, so RunTracker's are the only ones)."""
    from mlflow.tracking import MlflowClient

    from sweepflow.tasks.tracking.runs import RunTracker
    from sweepflow.tasks.tracking.writers import RunWriter

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    experiment = f"faults-ambiguous-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    with _proxy_to(mlflow_server) as proxy:
        tracker = RunTracker(proxy.url, experiment)
        proxy.outage_on(b"/runs/create", 1.0, after_reply=True)
        run_id, _ = tracker.create_run("trial", tags={"sweepflow.trial_id": "t0"})
        assert proxy.triggered and tracker.stats["found_created"] == 1

        writer = RunWriter(tracker, run_id, linger_s=0.05)
        writer.log_params({"lr": 0.01, "l1": 8})
        for step in range(1, 3):
            writer.log({"loss": 1.0 / step}, step=step)
        time.sleep(0.5)  # those went out: the next batch is the one whose answer is lost
        proxy.outage_on(b"marker_metric", 1.0, after_reply=True)
        writer.log({"loss": 1.0 / 3, "marker_metric": 3.0}, step=3)
        writer.log_params({"late_param": "x"})
        time.sleep(0.5)
        # The last writes go with the run's end, in one request (sweepflow's route): its answer is lost too.
        proxy.outage_on(b"last_metric", 1.0, after_reply=True)
        for step in range(4, 6):
            writer.log({"loss": 1.0 / step}, step=step)
        writer.log({"last_metric": 1.0}, step=5)
        writer.finish("FINISHED")
        writer.join()
    wall = time.monotonic() - started

    # The lost-answer batches (2 metrics + 1 param, then 3 metrics with the run's end) were found written:
    # nothing of them was sent again.
    assert tracker._has_finish_route()
    assert tracker.stats["already_logged"] >= 6, tracker.stats
    client = MlflowClient(mlflow_server)
    runs = client.search_runs([tracker.experiment_id], run_view_type=3)
    assert [r.info.run_id for r in runs] == [run_id], "one run, not one per attempt"
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.01", "l1": "8", "late_param": "x"}
    history = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5]
    assert [m.step for m in client.get_metric_history(run_id, "marker_metric")] == [3]
    assert [m.step for m in client.get_metric_history(run_id, "last_metric")] == [5]
    print(f"ambiguous writes: {dict(tracker.stats)}, proxy {proxy.stats}, wall {wall:.1f} s")


def test_mlflow_outage_mid_sweep_loses_and_duplicates_nothing(
    prefect_harness, mlflow_server, cluster, tmp_path, monkeypatch
):
    """The tracking server is cut (open connections reset, new ones reset) for OUTAGE_S from the first trial
    report on, while two trials train and a third waits to open its run. MLflow's own HTTP retries are turned
    off, so only RunTracker's retries bridge the outage: every write of that time is retried, a batch whose
    answer was lost is read back and only its missing part re-sent, a run creation that may have landed is
    looked up by its creation id. Afterwards: no trial failed, one child run per trial, nothing missing or
    doubled."""
    from mlflow.tracking import MlflowClient

    from sweepflow.flows.pipeline import training_pipeline

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    l1, epochs = [8, 16, 32], 3
    experiment = f"faults-mlflow-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    with _proxy_to(mlflow_server) as proxy:
        # The body of a trial's metric batch: the first report of the sweep starts the outage.
        proxy.outage_on(b"training_iteration", OUTAGE_S)
        cfg = _pipeline_config(
            tmp_path, cluster, proxy.url, experiment=experiment, l1=l1, epochs=epochs, pace_s=0.7
        )
        summary = training_pipeline(config=cfg)
    wall = time.monotonic() - started

    assert proxy.triggered, "the outage never started: no trial report went through the proxy"
    assert proxy.stats.failed >= 2, f"the outage cut nothing but its trigger: {proxy.stats}"
    assert summary["failed_trials"] == [] and len(summary["trials"]) == len(l1)
    client = MlflowClient(mlflow_server)  # straight to the server, not through the proxy
    children = _assert_children_exact(client, summary["parent_run_id"], l1=l1, epochs=epochs)
    # No orphan either: the experiment holds the parent and its children only (a doubled run creation would
    # show here even without its parent tag).
    everything = client.search_runs([summary["experiment_id"]], run_view_type=3)
    assert len(everything) == 1 + len(children)
    assert client.get_run(summary["parent_run_id"]).info.status == "FINISHED"
    print(f"mlflow outage: {proxy.stats}, wall {wall:.1f} s")


def test_mlflow_down_past_the_bound_fails_the_sweep_naming_the_server(
    prefect_harness, mlflow_server, cluster, tmp_path, monkeypatch
):
    """The tracking server goes away at the first trial report and does not come back. With
    SWEEPFLOW_MLFLOW_RETRY_S=3 the pipeline fails within seconds (not a hang) with an error naming the server
    and the setting to raise; no credential is in it; the parent run stays RUNNING, i.e. resumable."""
    from mlflow.tracking import MlflowClient

    from sweepflow.flows.pipeline import training_pipeline
    from sweepflow.tasks.tracking.runs import RETRY_ENV

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv(RETRY_ENV, "3")
    # Basic auth for the tracking server (this one ignores it): the password must appear in no message.
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "fault-user")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    experiment = f"faults-mlflow-down-{uuid.uuid4().hex[:6]}"
    with _proxy_to(mlflow_server) as proxy:
        proxy.outage_on(b"training_iteration", None)
        cfg = _pipeline_config(
            tmp_path, cluster, proxy.url, experiment=experiment, l1=[8, 16, 32], epochs=3, pace_s=0.3
        )
        started = time.monotonic()
        with pytest.raises(RuntimeError) as failure:
            training_pipeline(config=cfg)
        failed_after = time.monotonic() - started
        assert proxy.triggered

    message = str(failure.value)
    everything = "".join(traceback.format_exception(failure.value))
    assert proxy.url in message and "tracking server" in message and RETRY_ENV in message, message
    assert SECRET not in everything
    assert failed_after < 180, f"the sweep took {failed_after:.0f} s to give up on a 3 s bound"
    client = MlflowClient(mlflow_server)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    parents = client.search_runs([experiment_id], filter_string="attributes.run_name LIKE 'pipeline-%'")
    assert len(parents) == 1 and parents[0].info.status == "RUNNING", [p.info.status for p in parents]
    print(f"mlflow down: failed after {failed_after:.1f} s: {message[:300]}")


# ---------------------------------------------------------------------------------------- 3: S3 outages


def _set_env(env: dict[str, str | None]) -> None:
    """On a worker: set (or, for None, remove) environment variables. A module function, pickled by name: a
    bound ``os.environ.update`` would be pickled with a copy of this process's environment."""
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextmanager
def _worker_env(client, monkeypatch, **env: str) -> Iterator[None]:
    """``env`` in the Dask workers (running ones now; ones a nanny restarts inherit it from this process)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    client.run(_set_env, env)
    try:
        yield
    finally:
        client.run(_set_env, dict.fromkeys(env))


@pytest.fixture
def s3_through_proxy(s3_endpoint):
    """A fresh bucket on the session's moto server, and storage options that reach it through a FaultProxy."""
    import s3fs

    bucket = f"faults-{uuid.uuid4().hex[:8]}"
    direct = {"key": "AKIAFAULTS", "secret": SECRET, "client_kwargs": {"endpoint_url": s3_endpoint["url"]}}
    s3fs.S3FileSystem(**direct).mkdir(bucket)
    with _proxy_to(s3_endpoint["url"]) as proxy:
        via_proxy = {**direct, "client_kwargs": {"endpoint_url": proxy.url}}
        yield {"bucket": bucket, "proxy": proxy, "direct": direct, "options": via_proxy}


def _fit_two_file_checkpoints(cluster, s3: dict, name: str, epochs: int):
    from ddp_runtime.torch import TorchTrainer

    return TorchTrainer(
        two_file_checkpoints,
        train_loop_config={"epochs": epochs},
        scaling_config=train.ScalingConfig(num_workers=1),
        run_config=train.RunConfig(
            name=name, storage_path=f"s3://{s3['bucket']}/runs", storage_options=s3["options"]
        ),
        client=cluster,
    )


def test_s3_outage_while_a_checkpoint_is_written_is_waited_out(s3_through_proxy, cluster, monkeypatch):
    """The S3 endpoint is cut (connections refused) for OUTAGE_S from the moment checkpoint 1's second file
    is uploaded: its first file is in S3, the rest is not. botocore's own retries are off (AWS_MAX_ATTEMPTS=1;
    s3fs retries only throttling and dropped reads, never a refused connection), so only RunStorage.persist's
    retries can bridge the outage. The trial completes with every checkpoint whole and committed."""
    from ddp_runtime.checkpoint import STORAGE_RETRY_ENV, RunStorage

    s3 = s3_through_proxy
    proxy = s3["proxy"]
    proxy.outage_on(b"checkpoint_000001/b.bin", OUTAGE_S, mode="refuse")
    started = time.monotonic()
    with _worker_env(cluster, monkeypatch, AWS_MAX_ATTEMPTS="1", **{STORAGE_RETRY_ENV: "60"}):
        result = _fit_two_file_checkpoints(cluster, s3, "waited-out", epochs=3).fit()
    wall = time.monotonic() - started

    assert proxy.triggered and result.error is None
    assert [m["epoch"] for m in result.metrics_history] == [1, 2, 3]
    assert wall >= OUTAGE_S  # the write really waited for the endpoint
    storage = RunStorage(f"s3://{s3['bucket']}/runs", "waited-out", s3["direct"])
    committed = storage.list_committed()
    assert [c.index for c in committed] == [0, 1, 2]
    with committed[1].checkpoint.as_directory() as d:
        assert Path(d, "a.bin").read_bytes()[-1] == 2 and Path(d, "b.bin").read_bytes()[-1] == 2
    print(f"s3 outage: {proxy.stats}, fit {wall:.1f} s")


def test_s3_down_past_the_bound_fails_the_trial_and_never_commits_the_partial_checkpoint(
    s3_through_proxy, cluster, monkeypatch
):
    """The S3 endpoint goes away for good half-way through checkpoint 1 (after its first file). With
    DDP_RUNTIME_STORAGE_RETRY_S=2 the trial fails within seconds naming the endpoint and the setting (no
    credential in the message); checkpoint 1's first file is in S3 but the checkpoint is not committed:
    list_committed's latest is checkpoint 0."""
    from ddp_runtime.checkpoint import STORAGE_RETRY_ENV, RunStorage

    s3 = s3_through_proxy
    proxy = s3["proxy"]
    proxy.outage_on(b"checkpoint_000001/b.bin", None)
    started = time.monotonic()
    with _worker_env(cluster, monkeypatch, AWS_MAX_ATTEMPTS="1", **{STORAGE_RETRY_ENV: "2"}):
        with pytest.raises(train.TrainingFailedError) as failure:
            _fit_two_file_checkpoints(cluster, s3, "stays-down", epochs=3).fit()
    failed_after = time.monotonic() - started
    proxy.restore()

    error = failure.value.result.error
    text = f"{failure.value}\n{error}\n{getattr(error, 'traceback', '')}"
    assert (
        "StorageUnavailableError" in text and proxy.url in str(error) and STORAGE_RETRY_ENV in str(error)
    ), text
    assert SECRET not in text and "AKIAFAULTS" not in text
    assert failed_after < 60
    storage = RunStorage(f"s3://{s3['bucket']}/runs", "stays-down", s3["direct"])
    assert [c.index for c in storage.list_committed()] == [0]
    leftover = {p.rsplit("/", 1)[-1] for p in storage.fs.ls(f"{storage.root}/checkpoint_000001")}
    assert leftover == {"a.bin"}, "the partial write is there, uncommitted"
    print(f"s3 down: failed after {failed_after:.1f} s: {str(error)[:300]}")


# ---------------------------------------------------------------------------------- 4: Prefect server restart


class _PrefectServer:
    """A real ``prefect server start`` on 127.0.0.1:<port>, its SQLite database under ``home``; restartable on
    the same port with the same database."""

    def __init__(self, home: Path, port: int) -> None:
        from sweepflow.infra.services.local import prefect_env

        self.home, self.port = home, port
        self.url = f"http://127.0.0.1:{port}/api"
        self.log = home / "server.log"
        home.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, **prefect_env(str(home)), "PREFECT_UI_ENABLED": "false"}
        self.env.pop("PREFECT_API_URL", None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 180.0) -> float:
        started = time.monotonic()
        prefect = str(Path(sys.executable).with_name("prefect"))
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # its own process group: stop() reaches what it forks
            )
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self.proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.3)  # not up yet
        self.stop()
        raise RuntimeError(
            f"prefect server did not answer {self.url}/health in {timeout:.0f} s; see {self.log}"
        )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)


def _prefect_records(api_url: str) -> list[dict[str, Any]]:
    """Every flow run on the server: its state, its task runs' (name, state) and its logs' (time, message)."""
    import asyncio

    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId

    async def read() -> list[dict[str, Any]]:
        async with PrefectClient(api=api_url) as client:
            out = []
            for fr in await client.read_flow_runs():
                task_runs = await client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id]))
                )
                logs = await client.read_logs(
                    log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fr.id]))
                )
                out.append(
                    {
                        "state": fr.state_type.value if fr.state_type else None,
                        "tasks": sorted(
                            (tr.name, tr.state_type.value if tr.state_type else None) for tr in task_runs
                        ),
                        "logs": [(log.timestamp.timestamp(), log.message) for log in logs],
                    }
                )
            return out

    return asyncio.run(read())


def _sweepflow_run_argv(tmp_path: Path, cluster, *, l1: list[int], epochs: int, pace_s: float) -> list[str]:
    """``sweepflow run`` in this process's venv: the flow in that process, MLflow on SQLite, this cluster."""
    sets = {
        "state_dir": str(tmp_path / "state"),
        "dask.scheduler_address": cluster.scheduler.address,
        "mlflow.tracking_uri": sqlite_store(tmp_path),
        "mlflow.experiment_name": "faults-prefect",
        "sweep.search_space": f"{{l1: {{type: grid, values: {l1}}}, l2: 8, lr: 0.01, batch_size: 64}}",
        "sweep.num_samples": "1",
        "training.train_fn": "test_faults_services:paced_classifier",
        "training.model_fn": "sweepflow.tasks.training.builtin:model_fn",
        "evaluation.evaluate_fn": "sweepflow.tasks.training.builtin:evaluate_fn",
        "training.epochs": str(epochs),
        "training.base_config": f"{{optimizer: adam, pace_s: {pace_s}}}",
        "scheduler": "{type: fifo}",
        "resources.ranks_per_trial": "1",
    }
    argv = [str(Path(sys.executable).with_name("sweepflow")), "run", "--no-server", "--in-process"]
    argv += ["--summary-json", str(tmp_path / "summary.json")]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    return argv


@pytest.mark.prefect  # `prefect server start`, and a `sweepflow run` subprocess
@pytest.mark.subprocess
def test_prefect_server_restart_mid_sweep_completes_the_run(cluster, tmp_path):
    """A real Prefect server restarted mid-sweep: the run completes, and the server has all of it.

    A ``sweepflow run --no-server --in-process`` subprocess (PREFECT_API_URL = the server) sweeps 4 paced
    trials, 2 at a time. When the flow logs that the sweep starts, the server is stopped (SIGTERM) and started
    again on the same port with the same SQLite database; that takes 7-20 s (more on a loaded machine), during
    which trial task runs start and finish and the flow logs progress.

    Observed with prefect 3.8.8, and asserted: the flow run and the sweep complete (exit 0, no failed trial),
    and the restarted server records the flow run and every task run (download, the 4 trials, evaluate,
    register) as COMPLETED, and holds the flow's log lines emitted while it was down. Nothing in sweepflow
    needed fixing for this: Prefect's HTTP client retries a refused connection once it has connected before
    (PREFECT_CLIENT_MAX_RETRIES=5, backoff 2^n s: about a minute), which covers flow-run state changes and the
    log worker's batches (sent late, not lost). Task-run states travel as events over a websocket: the flow
    process warns "Unable to connect to 'ws://.../api/events/in' ... event data (including task run data) may
    be lost" and "Service 'EventsWorker' failed to process item Event(... 'prefect.task-run.Pending' /
    'Running')": a task run's intermediate state events sent during the downtime are lost (its state history
    on the server misses them), but its next event carries its whole state, so every task run still ends
    COMPLETED on the server. Not tested: a server down for longer than the client's retries (about a minute).
    """
    from conftest import free_port

    server = _PrefectServer(tmp_path / "prefect-server", free_port())
    first_start_s = server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "SWEEPFLOW_"))}
    env.update(
        PREFECT_API_URL=server.url,
        PREFECT_HOME=str(tmp_path / "client-prefect-home"),
        SWEEPFLOW_HOME=str(tmp_path / "home"),
    )
    l1 = [8, 16, 24, 32]
    lines: list[str] = []
    sweep_started = threading.Event()
    proc = subprocess.Popen(
        _sweepflow_run_argv(tmp_path, cluster, l1=l1, epochs=3, pace_s=1.0),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def read_output() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "sweep:" in line:  # the flow's "sweep: N trials ..." line: trials are being submitted
                sweep_started.set()
        sweep_started.set()  # the output ended: a run that stopped before its sweep is not waited for

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        sweep_started.wait(300)
        assert any("sweep:" in line for line in lines), "the sweep never started:\n" + "".join(lines[-60:])
        down_from = time.time()
        server.stop()
        restart_s = server.start()
        down_until = time.time()
        code = proc.wait(timeout=600)
        reader.join(timeout=30)
        records = recorded(  # the server records task-run states in batches, within a second
            lambda: _prefect_records(server.url),
            lambda runs: all(state in FINAL_STATE_TYPES for run in runs for _, state in run["tasks"]),
            "every task run of the flow run in a final state",
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        server.stop()
    output = "".join(lines)
    (tmp_path / "sweepflow-run.log").write_text(output)  # kept by pytest for a look after the fact
    assert code == 0, output[-5000:]

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed_trials"] == [] and len(summary["trials"]) == len(l1)
    # The restart really fell inside the sweep: trials started or ended while the server was down.
    during = [
        t["trial_id"]
        for t in summary["trials"]
        if down_from <= t["started_at"] <= down_until or down_from <= t["ended_at"] <= down_until
    ]
    assert during, f"no trial started or ended during the restart ({down_from:.0f}-{down_until:.0f})"

    assert len(records) == 1, records
    run = records[0]
    assert run["state"] == "COMPLETED"
    names = [name for name, _ in run["tasks"]]
    assert sum(n.startswith("trial_") for n in names) == len(l1)
    assert any(n.startswith("download-dataset") for n in names)
    assert any(n.startswith("evaluate-best-trial") for n in names)
    assert any(n.startswith("register-model") for n in names)
    assert all(state == "COMPLETED" for _, state in run["tasks"]), run["tasks"]
    logs_down = [m for t, m in run["logs"] if down_from <= t <= down_until]
    assert logs_down, "the flow's log lines from the downtime never reached the server"
    noted = [line.rstrip() for line in lines if "retry" in line.lower() or "failed to" in line.lower()]
    print(
        f"prefect restart: first start {first_start_s:.1f} s, down {down_until - down_from:.1f} s "
        f"(start {restart_s:.1f} s); trials starting/ending meanwhile: {during}; server logs from the "
        f"downtime: {len(logs_down)} of {len(run['logs'])}; client notes: {noted[:10]}"
    )


# ------------------------------------------------------------------------------ 7: two pipelines, one cluster


def test_two_pipelines_at_once_on_one_cluster_keep_to_their_own_runs(
    prefect_harness, mlflow_server, cluster, tmp_path
):
    """Two ``training_pipeline`` runs in two threads at once, against one Dask scheduler (2 workers: each
    pipeline alone would fill it, so their trials queue for workers) and one MLflow server, in one new
    experiment (both find it missing and create it: one creation loses the race and must use the other's).
    Both finish; each parent run's children are exactly its own trials (the grids do not overlap, so a
    child's l1 says which pipeline wrote it), and each parent's totals are its own children's."""
    from mlflow.tracking import MlflowClient

    from sweepflow.flows.pipeline import training_pipeline

    experiment = f"faults-two-{uuid.uuid4().hex[:6]}"
    grids = {"a": [8, 16], "b": [24, 32]}
    outcomes: dict[str, Any] = {}

    def run(name: str) -> None:
        cfg = _pipeline_config(
            tmp_path / name,
            cluster,
            mlflow_server,
            experiment=experiment,
            l1=grids[name],
            epochs=2,
            pace_s=0.3,
            model=f"{experiment}-{name}",  # one registered model each: this test is about runs, not the registry
        )
        try:
            outcomes[name] = training_pipeline(config=cfg)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread, which fails with it
            outcomes[name] = exc

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(name,), name=f"pipeline-{name}") for name in grids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    wall = time.monotonic() - started
    assert not any(t.is_alive() for t in threads), f"a pipeline did not finish in {wall:.0f} s (deadlock?)"
    for name, outcome in outcomes.items():
        if isinstance(outcome, BaseException):
            raise AssertionError(f"pipeline {name} failed") from outcome
    assert set(outcomes) == set(grids)

    client = MlflowClient(mlflow_server)
    a, b = outcomes["a"], outcomes["b"]
    assert a["experiment_id"] == b["experiment_id"] and a["parent_run_id"] != b["parent_run_id"]
    for name, summary in outcomes.items():
        assert summary["failed_trials"] == []
        children = _assert_children_exact(client, summary["parent_run_id"], l1=grids[name], epochs=2)
        assert {c.info.run_id for c in children} == {t["run_id"] for t in summary["trials"]}
        parent = client.get_run(summary["parent_run_id"])
        assert parent.info.status == "FINISHED"
        assert parent.data.metrics["worker_seconds"] == pytest.approx(
            sum(c.data.metrics["worker_seconds"] for c in children), abs=1e-2
        )
        assert summary["best_trial"]["run_id"] in {c.info.run_id for c in children}
        assert summary["registration"]["name"] == f"{experiment}-{name}"
    everything = client.search_runs([a["experiment_id"]], run_view_type=3)
    assert len(everything) == 2 + len(grids["a"]) + len(grids["b"])
    print(f"two pipelines: {wall:.1f} s")
