"""Faults of a trial's ranks (issue 12, faults 1 and 5): a Dask worker killed mid-trial and a hung rank, in
ddp_runtime and in the real pipeline flow (Dask LocalCluster, Prefect test harness, MLflow on SQLite)."""

from __future__ import annotations

import os
import time

import paths
import pytest
from conftest import whole
from fault_fns import hang_on_rank_one, silent_but_sampling
from mlflow_server import sqlite_store

import ddp_runtime as train
from ddp_runtime import _gang as gang
from ddp_runtime.cluster import local_cluster
from ddp_runtime.torch import TorchTrainer

FAULT_FNS = str(paths.SUPPORT / "fault_fns.py")


@pytest.fixture(scope="module")
def _own_cluster():
    """This module's own 2 workers: its tests kill and restart them."""
    with local_cluster(n_workers=2) as client:
        yield client


@pytest.fixture
def cluster(_own_cluster):
    return whole(_own_cluster, 2)


def _hang_line() -> int:
    """The line of fault_fns.hang_on_rank_one where rank 1 sleeps."""
    with open(FAULT_FNS) as f:
        lines = f.read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "time.sleep(HANG_S)  # the hung rank" in line)


def _wait_for_workers(client, n: int) -> None:
    """Killed workers come back (their nannies restart them): wait so the next test starts on a full cluster."""
    deadline = time.monotonic() + 60
    while len(client.scheduler_info(n_workers=-1)["workers"]) < n:
        assert time.monotonic() < deadline, "the killed Dask workers did not come back within 60 s"
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------------- ddp_runtime


def _hang_at_epoch_2(cluster, tmp_path, torch_config: train.TorchConfig) -> train.Result:
    """A 2-rank group whose rank 1 hangs at epoch 2 (fault_fns.hang_on_rank_one)."""
    return TorchTrainer(
        hang_on_rank_one,
        train_loop_config={"epochs": 3, "hang_at": 2},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=str(tmp_path / "results")),
        torch_config=torch_config,
        client=cluster,
    ).fit()


def test_hang_timeout_names_the_hung_rank_and_frees_its_workers(cluster, tmp_path):
    with pytest.raises(train.TrainingFailedError) as failed:
        _hang_at_epoch_2(cluster, tmp_path, train.TorchConfig(hang_timeout_s=2))
    failed_at = time.time()
    error = failed.value.result.error
    assert isinstance(error, train.RankHangError) and error.rank == 1
    message = str(error)
    assert message.startswith("rank 1 (Dask worker tcp://")
    assert "hung: no report for 2 s" in message
    assert f"fault_fns.py:{_hang_line()} in hang_on_rank_one (time.sleep(HANG_S)" in message
    assert "while rank 0 waits for it in a collective or report()" in message
    assert "TorchConfig.hang_timeout_s=2" in message
    assert "rank 1's stack" in message and f'{FAULT_FNS}", line {_hang_line()}' in message
    # Rank 0 reported epoch 2 and waits in its barrier for rank 1: the hang was found 2 s after that report
    # and the group torn down (its workers killed) within seconds, not at the 300 s collective timeout.
    history = failed.value.result.metrics_history
    assert [m["epoch"] for m in history] == [1, 2]
    assert failed_at - history[-1]["t"] < 20
    # The group's workers were restarted (the hung thread cannot be stopped otherwise) and nothing holds them.
    assert cluster.run_on_scheduler(gang.reservations) == {}
    _wait_for_workers(cluster, 2)


def test_a_collective_timeout_names_the_peer_that_never_joined(cluster, tmp_path):
    """Without hang_timeout_s, rank 0's barrier times out (TorchConfig.timeout_s) first: the error still names
    rank 1, read from its stack before its worker is killed, not rank 0 whose collective merely timed out."""
    with pytest.raises(train.TrainingFailedError) as failed:
        _hang_at_epoch_2(cluster, tmp_path, train.TorchConfig(timeout_s=3))
    error = failed.value.result.error
    assert isinstance(error, train.RankHangError) and error.rank == 1
    message = str(error)
    assert message.startswith("rank 1 (Dask worker tcp://") and "its peers' collective timed out" in message
    assert f"fault_fns.py:{_hang_line()} in hang_on_rank_one" in message
    assert "rank 0 failed waiting for it in a collective" in message and "TorchConfig.timeout_s=3" in message
    _wait_for_workers(cluster, 2)


def test_a_hang_is_a_failure_that_restarts_the_group(cluster, tmp_path):
    """FailureConfig.max_failures covers hangs: the second attempt (no hang: a marker file) completes."""
    result = TorchTrainer(
        hang_on_rank_one,
        train_loop_config={"epochs": 3, "hang_at": 2, "once": str(tmp_path / "hung-once")},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            storage_path=str(tmp_path / "results"), failure_config=train.FailureConfig(max_failures=1)
        ),
        torch_config=train.TorchConfig(hang_timeout_s=2),
        client=cluster,
    ).fit()
    assert result.error is None and result.num_failures == 1
    assert isinstance(result.attempts_errors[0], train.RankHangError)
    assert result.metrics["epoch"] == 3
    # The second attempt ran on the fresh workers the failed group's teardown started: their one-time start-up
    # (imports) is reported apart, not in the time the group held them.
    assert result.startup_s > 0


@pytest.mark.timeout(180)  # were they progress, it would wait for HANG_S
def test_side_messages_alone_are_no_progress_for_the_hang_timeout(cluster, tmp_path):
    """A rank 0 that stopped reporting but whose sampler still sends its samples is hung: found at
    hang_timeout_s, with the samples it sent meanwhile delivered."""
    samples = []
    with pytest.raises(train.TrainingFailedError) as failed:
        TorchTrainer(
            silent_but_sampling,
            scaling_config=train.ScalingConfig(num_workers=1),
            run_config=train.RunConfig(storage_path=str(tmp_path / "results")),
            torch_config=train.TorchConfig(hang_timeout_s=2),
            client=cluster,
            on_side=samples.append,
        ).fit()
    assert isinstance(failed.value.result.error, train.RankHangError)
    assert len(samples) >= 10  # about one every 0.1 s over the 2 s


def test_hang_timeout_s_is_validated():
    for bad in (0, -1.0, float("nan"), True, "10"):
        with pytest.raises(
            ValueError, match="TorchConfig.hang_timeout_s must be a positive number of seconds"
        ):
            train.TorchConfig(hang_timeout_s=bad)
    assert train.TorchConfig().hang_timeout_s is None


# ------------------------------------------------------------------------------------------------ the pipeline


def _fault_sweep(tmp_path, cluster, faults: list[str], **training):
    """One 2-rank trial per fault of ``faults`` (fault_fns.train_with_fault), one at a time, FIFO, 3 epochs."""
    from sweepflow.flows.config import PipelineConfig
    from sweepflow.flows.settings import resolve_settings

    fault_dir = tmp_path / "faults"
    fault_dir.mkdir(exist_ok=True)
    return resolve_settings(
        PipelineConfig.model_validate(
            {
                "state_dir": str(tmp_path / "state"),
                "dask": {"scheduler_address": cluster.scheduler.address},
                "mlflow": {
                    "tracking_uri": sqlite_store(tmp_path),
                    "experiment_name": "faults",
                    "registered_model_name": "faults-model",
                },
                "sweep": {
                    "search_space": {
                        "fault": {"type": "grid", "values": faults},
                        "l1": 16,
                        "l2": 16,
                        "lr": 0.01,
                        "batch_size": 64,
                    },
                    "num_samples": 1,
                    "max_concurrent_trials": 1,
                },
                "training": {
                    "train_fn": "fault_fns:train_with_fault",
                    "model_fn": "sweepflow.tasks.training.builtin:model_fn",
                    "epochs": 3,
                    "base_config": {"optimizer": "adam", "fault_dir": str(fault_dir)},
                    **training,
                },
                "scheduler": {"type": "fifo"},
                "resources": {"ranks_per_trial": 2},
                "evaluation": {"evaluate_fn": "sweepflow.tasks.training.builtin:evaluate_fn"},
            }
        )
    )


def test_a_killed_worker_and_a_hung_rank_fail_their_trials_and_the_sweep_goes_on(
    prefect_harness, cluster, tmp_path
):
    """No group restarts (max_failures 0): the trial whose rank 0 kills its own Dask worker after epoch 2 is
    FAILED naming the lost worker; the trial whose rank 1 hangs is FAILED after hang_timeout_s naming rank 1 and
    the line; their workers are freed, and the next trial trains on them to the end."""
    from mlflow.tracking import MlflowClient

    from sweepflow.flows.pipeline import training_pipeline

    cfg = _fault_sweep(tmp_path, cluster, ["kill", "hang", "none"], hang_timeout_s=10)
    summary = training_pipeline(config=cfg)
    client = MlflowClient(cfg.mlflow.tracking_uri)
    children = client.search_runs(
        [summary["experiment_id"]], filter_string=f"tags.mlflow.parentRunId = '{summary['parent_run_id']}'"
    )
    runs = {c.data.params["fault"]: c for c in children}
    assert set(runs) == {"kill", "hang", "none"}

    killed = runs["kill"]
    assert killed.info.status == "FAILED" and killed.data.tags["sweepflow.status"] == "FAILED"
    assert "worker" in killed.data.tags["sweepflow.error"].lower()
    assert [m.step for m in client.get_metric_history(killed.info.run_id, "val_loss")] == [1, 2]

    hung = runs["hang"]
    assert hung.info.status == "FAILED"
    error = hung.data.tags["sweepflow.error"]
    assert "rank 1 (Dask worker tcp://" in error and "hung: no report for" in error, error
    assert "fault_fns.py" in error and "TorchConfig.hang_timeout_s=10" in error, error
    # Rank 0 reported epoch 2 (its report reached the driver) and waited for rank 1 in report's barrier.
    assert [m.step for m in client.get_metric_history(hung.info.run_id, "val_loss")] == [1, 2]

    fine = runs["none"]
    assert fine.info.status == "FINISHED" and fine.data.tags["sweepflow.status"] == "COMPLETED"
    assert [m.step for m in client.get_metric_history(fine.info.run_id, "val_loss")] == [1, 2, 3]
    assert summary["best_trial"]["trial_id"] == fine.data.tags["sweepflow.trial_id"]
    assert cluster.run_on_scheduler(gang.reservations) == {}
    _wait_for_workers(cluster, 2)


def test_with_max_failures_a_killed_worker_resumes_the_trial_from_its_checkpoint(
    prefect_harness, cluster, tmp_path
):
    """training.max_failures=1: the group restarts on fresh workers from the epoch-2 checkpoint, trains epoch 3
    only, and the trial's run records one restart; every epoch is in its history once."""
    from mlflow.tracking import MlflowClient

    from sweepflow.flows.pipeline import training_pipeline

    cfg = _fault_sweep(tmp_path, cluster, ["kill"], max_failures=1)
    summary = training_pipeline(config=cfg)
    client = MlflowClient(cfg.mlflow.tracking_uri)
    (run,) = client.search_runs(
        [summary["experiment_id"]], filter_string=f"tags.mlflow.parentRunId = '{summary['parent_run_id']}'"
    )
    assert run.info.status == "FINISHED" and run.data.tags["sweepflow.status"] == "COMPLETED"
    assert run.data.tags["sweepflow.restarts"] == "1"
    assert os.path.exists(tmp_path / "faults" / "killed-seed0"), "the fault was never injected"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "epoch")] == [1, 2, 3]
    # Epoch 3 continued from the checkpoint: the epochs are 1, 2, 3, not 1, 2, 1, 2, 3.
    assert [m.value for m in client.get_metric_history(run.info.run_id, "epoch")] == [1, 2, 3]
    _wait_for_workers(cluster, 2)
