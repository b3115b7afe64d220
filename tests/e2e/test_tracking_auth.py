"""A tracking server that asks for credentials (MLflow's basic-auth app, as ``sweepflow stack up
--mlflow-auth-file`` runs it): the flow holds the credentials (``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``),
the Dask workers do not, and each trial's rank 0 still writes its system metrics to the trial's run."""

from __future__ import annotations

import os
import secrets

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow_server import basic_auth_env, run_mlflow_server
from prefect import flow
from sweep_parts import sweep_of, tracker_of

from ddp_runtime.cluster import local_cluster
from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.settings import resolve_settings
from sweepflow.tasks.datasets import DataConfig, prepare_dataset

USER = "sweeper"
PASSWORD = "pw-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def auth_mlflow(tmp_path_factory):
    state = tmp_path_factory.mktemp("mlflow-auth")
    env = basic_auth_env(state, admin=USER, password=PASSWORD, default_permission="READ")
    artifacts = state / "artifacts"
    artifacts.mkdir()
    with run_mlflow_server(
        str(state), default_artifact_root=artifacts.as_uri(), env=env, extra_args=("--app-name", "basic-auth")
    ) as uri:
        yield uri


def _worker_passwords(cluster) -> list[str | None]:
    return list(cluster.run(lambda: os.environ.get("MLFLOW_TRACKING_PASSWORD")).values())


@pytest.mark.mlflow_server
@pytest.mark.dask
def test_system_metrics_reach_a_server_that_asks_for_credentials(
    prefect_harness, auth_mlflow, tmp_path, monkeypatch
):
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    # The credentials are needed: without them the server refuses a write.
    with pytest.raises(MlflowException, match="401|nauthori"):
        MlflowClient(auth_mlflow).create_experiment("anonymous")

    # Workers started without the credentials (a deployment's flow process has them, its cluster not).
    with local_cluster(n_workers=1) as cluster:
        assert _worker_passwords(cluster) == [None]
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
        cfg = resolve_settings(
            PipelineConfig.model_validate(
                {
                    "state_dir": str(tmp_path / "state"),
                    "dask": {"scheduler_address": cluster.scheduler.address},
                    "mlflow": {"tracking_uri": auth_mlflow, "experiment_name": "auth"},
                    "sweep": {"search_space": {"quality": 1}, "num_samples": 1},
                    "training": {
                        # 24 x 50 ms of a busy core: a trial shorter than the default 5 s between samples
                        "train_fn": "pipeline_helpers:burning_quality",
                        "epochs": 24,
                    },
                    "scheduler": {"type": "fifo"},
                    "resources": {"ranks_per_trial": 1},
                }
            )
        )
        prepared = prepare_dataset(DataConfig(name="digits", cache_dir=str(tmp_path / "data")))
        tracker = tracker_of(cfg)

        @flow
        def sweep_only():
            parent = tracker.start_run("auth-parent")
            try:
                return sweep_of(cfg, prepared, cluster, tracker, parent).run()
            finally:
                tracker.end_run(parent, "FINISHED")

        (trial,) = sweep_only().trials
        assert trial.status == "COMPLETED", trial.error
        # The credentials were on rank 0's worker only while it trained.
        assert _worker_passwords(cluster) == [None]

    mlflow = MlflowClient(auth_mlflow)
    run = mlflow.get_run(trial.run_id)
    # Sampled from the trial's start (after 0.5 s, then at its end), with the CPU its rank 0 burnt.
    cpu = mlflow.get_metric_history(trial.run_id, "system/process_cpu_percentage")
    assert len(cpu) >= 2 and all(m.value > 0 for m in cpu), ([m.value for m in cpu], trial.train_time_s)
    assert run.data.metrics["system/cpu_utilization_percentage"] > 0, sorted(run.data.metrics)
    assert "system/system_memory_usage_megabytes" in run.data.metrics
    assert "system/process_memory_megabytes" in run.data.metrics
    assert PASSWORD not in repr(run.data.tags) + repr(run.data.params)
