"""Lightning and Transformers trials under Tune (issue 64 item 3): ASHA stops them mid-training and every rank
ends cleanly; PBT's exploit restores the donor's Lightning checkpoint; a killed rank's group resumes from its
latest checkpoint."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("lightning")
pytest.importorskip("transformers")

from conftest import SHARED_WORKERS, whole  # noqa: E402
from hf_fns import train_transformers  # noqa: E402
from lightning_fns import train_lightning  # noqa: E402

import ddp_runtime as train  # noqa: E402
from ddp_runtime.torch import TorchTrainer  # noqa: E402
from sweepflow import tune  # noqa: E402
from sweepflow.tune.schedulers import ASHAScheduler, PopulationBasedTraining  # noqa: E402


def _asha(fn, metric: str, epochs: int, values: list, caplog, cluster):
    caplog.set_level(logging.INFO)
    grid = tune.Tuner(
        TorchTrainer(fn, train_loop_config={"epochs": epochs}, scaling_config=train.ScalingConfig(num_workers=2)),
        param_space={"train_loop_config": {"lr": tune.grid_search(values)}},
        tune_config=tune.TuneConfig(
            metric=metric, mode="min", scheduler=ASHAScheduler(max_t=epochs, grace_period=1, reduction_factor=2)
        ),
        run_config=tune.RunConfig(name=f"asha-{fn.__name__}", verbose=0),
    ).fit()
    assert len(grid) == len(values) and grid.num_errors == 0, grid.errors
    reports = sorted(len(r.metrics_dataframe) for r in grid)
    assert reports[0] < epochs == reports[-1], reports  # one stopped early, one ran to max_t
    whole(cluster, SHARED_WORKERS)  # every rank of the stopped trials ended: no worker is held or hung
    assert "Traceback" not in caplog.text
    return grid


def test_asha_stops_lightning_trials_mid_training_and_every_rank_ends(services, cluster, caplog):
    _asha(train_lightning, "val_loss", 4, [0.2, 1e-4, 0.05], caplog, cluster)


def test_asha_stops_transformers_trials_mid_training_and_every_rank_ends(services, cluster, caplog):
    _asha(train_transformers, "eval_loss", 3, [2e-3, 1e-6, 1e-3], caplog, cluster)


def test_pbt_exploit_restores_the_donors_lightning_checkpoint(services):
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        quantile_fraction=0.5,
        hyperparam_mutations={"train_loop_config": {"lr": [0.02, 0.05]}},
    )
    grid = tune.Tuner(
        TorchTrainer(
            train_lightning,
            train_loop_config={"epochs": 6, "epoch_sleep_s": 1.0},
            scaling_config=train.ScalingConfig(num_workers=1),
        ),
        param_space={"train_loop_config": {"lr": tune.grid_search([1e-5, 0.05])}},
        tune_config=tune.TuneConfig(metric="val_loss", mode="min", scheduler=pbt),
        run_config=tune.RunConfig(name="pbt-lightning", verbose=0),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    # The trial that started at lr 1e-5 exploits the other (lr 0.05): from then on it reports the donor's
    # weights (trained with 0.05), its loss at once the donor's level.
    slow = next(r for r in grid if r.metrics_dataframe["restored_lr"].iloc[0] == 0.0 and r.metrics_dataframe["val_loss"].iloc[0] > 1)
    history = slow.metrics_dataframe
    taken = history.index[(history["restored_lr"] - 0.05).abs() < 1e-6]
    assert len(taken), history[["epoch", "val_loss", "restored_lr"]].to_dict("records")
    first = taken[0]
    assert history["val_loss"][first] < history["val_loss"][first - 1] / 5
    # It went on from the donor's checkpoint (which epoch that was depends on when the exploit landed).
    assert history["epoch"].iloc[-1] >= history["epoch"][first]


def test_a_killed_rank_s_lightning_group_resumes_from_its_latest_checkpoint(cluster, tmp_path):
    result = TorchTrainer(
        train_lightning,
        train_loop_config={"epochs": 4, "kill": {"epoch": 2, "rank": 1, "marker": str(tmp_path / "killed")}},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="pl-killed", storage_path=str(tmp_path / "results"), failure_config=train.FailureConfig(max_failures=1)
        ),
        client=cluster,
    ).fit()
    assert result.error is None and result.num_failures == 1, result.error
    assert [m["epoch"] for m in result.metrics_history] == [0, 1, 2, 3]  # epoch 2 again, from epoch 1's checkpoint
    assert (tmp_path / "killed").exists()
    whole(cluster, SHARED_WORKERS)
