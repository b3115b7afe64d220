"""Ray Train v2's Tune pattern: a function trainable that fits a ``TorchTrainer`` per trial, whose group's reports
reach Tune through ``sweepflow.tune.integration.ray_train.TuneReportCallback`` and which ASHA stops
(``examples/ray_train_v2_tune.py`` as a user runs it, and a deterministic sweep of the same shape in process)."""

from __future__ import annotations

import os

import pytest
from test_tune import run_example

import ddp_runtime as train
from ddp_runtime.torch import TorchTrainer
from sweepflow import tune
from sweepflow.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback
from sweepflow.tune.schedulers import ASHAScheduler


@pytest.mark.subprocess
def test_rays_train_v2_tune_example_runs_with_its_imports_changed(services, prefect_harness):
    stdout = run_example("ray_train_v2_tune.py", "--smoke-test")
    assert "Number of results: 3, errors: 0" in stdout
    assert "Number of trials: 3 (3 TERMINATED)" in stdout
    assert "holds 4 tensors" in stdout  # the best trial's checkpoint_path names the group's checkpoint


def per_worker(config):
    """Reports loss = x every step (x: the trial's own), rank 0 with a checkpoint of its step."""
    import tempfile

    ctx = train.get_context()
    for step in range(4):
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if ctx.get_world_rank() == 0:
                with open(os.path.join(d, "step"), "w") as f:
                    f.write(str(step))
                checkpoint = train.Checkpoint.from_directory(d)
            train.report({"loss": config["x"], "world_size": ctx.get_world_size()}, checkpoint=checkpoint)


def train_driver_fn(config):
    """The trial: a 2-rank group of its own; a file after ``fit()`` says the code after it ran."""
    trial_id = tune.get_context().get_trial_id()
    trainer = TorchTrainer(
        per_worker,
        train_loop_config={"x": config["x"]},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name=f"train-{trial_id}", storage_path=config["storage"], callbacks=[TuneReportCallback()]
        ),
    )
    trainer.fit()
    open(os.path.join(config["storage"], f"after-fit-{trial_id}"), "w").close()


def test_each_trial_is_its_groups_reports_and_asha_stops_the_worse_ones_at_their_rung(services, tmp_path):
    storage = str(tmp_path / "runs")
    os.makedirs(storage)
    analysis = tune.run(
        train_driver_fn,
        config={"x": tune.grid_search([1.0, 2.0, 0.5, 3.0]), "storage": storage},
        metric="loss",
        mode="min",
        max_concurrent_trials=1,  # one at a time: each meets the rungs of the trials before it
        # max_t above the 4 reports: the trials that pass the rungs end by themselves, not stopped at max_t
        scheduler=ASHAScheduler(max_t=10, grace_period=1, reduction_factor=2),
        verbose=0,
    )
    by_x = {t.config["x"]: t for t in analysis.trials}
    assert [len(by_x[x].metric_history) for x in (1.0, 2.0, 0.5, 3.0)] == [4, 1, 4, 1]
    for x, trial in by_x.items():
        last = trial.last_result
        assert last["loss"] == x and last["world_size"] == 2  # the group's rank 0's report, forwarded
        with open(os.path.join(last[CHECKPOINT_PATH_KEY], "step")) as f:  # committed before it was forwarded
            assert f.read() == str(len(trial.metric_history) - 1)
        ran_after_fit = os.path.exists(os.path.join(storage, f"after-fit-{trial.trial_id}"))
        assert ran_after_fit == (len(trial.metric_history) == 4)  # a stopped trial's function ends at fit()
    assert analysis.best_config["x"] == 0.5


def test_the_callback_outside_a_tune_trial_says_where_it_belongs():
    with pytest.raises(RuntimeError, match="TuneReportCallback must be used in a Tune session"):
        TuneReportCallback()
