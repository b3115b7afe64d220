"""Ray Tune's APIs on sweepflow (``sweepflow.tune``, ``sweepflow.sgd``), against a real Dask LocalCluster, a real
``mlflow server`` and a real Prefect API: every experiment is a flow run with a task run per trial and an
MLflow parent run with a child run per trial."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import paths
import pytest
from mlflow.tracking import MlflowClient
from prefect_records import final_task_run, final_task_runs

import ddp_runtime as train
import ddp_runtime.data as ray_data
from ddp_runtime.torch import TorchTrainer
from sweepflow import tune
from sweepflow.sgd.integration.torch import DistributedTrainableCreator
from sweepflow.sgd.torch import distributed_checkpoint_dir, is_distributed_trainable
from sweepflow.tune.schedulers import ASHAScheduler, MedianStoppingRule
from sweepflow.tune.search.optuna import OptunaSearch

ROOT = str(paths.ROOT)


def quality_trainable(config, checkpoint_dir=None):
    """Classic Tune: loss = config["quality"] / epoch; a checkpoint each epoch; resumes from checkpoint_dir."""
    start = 0
    if checkpoint_dir:
        with open(os.path.join(checkpoint_dir, "epoch")) as f:
            start = int(f.read())
    for epoch in range(start + 1, 5):
        with tune.checkpoint_dir(epoch) as directory:
            with open(os.path.join(directory, "epoch"), "w") as f:
                f.write(str(epoch))
        tune.report(loss=config["quality"] / epoch, width=config["width"])


def _children(mlflow_uri: str, parent_run_id: str):
    client = MlflowClient(mlflow_uri)
    parent = client.get_run(parent_run_id)
    return parent, client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'"
    )


def test_classic_tune_run_with_asha_checkpoints_and_records(services):
    np.random.seed(0)
    analysis = tune.run(
        quality_trainable,
        config={
            "quality": tune.grid_search([1.0, 4.0, 8.0]),
            "width": tune.sample_from(lambda spec: int(spec.config.quality) * 10),
        },
        num_samples=1,
        scheduler=ASHAScheduler(metric="loss", mode="min", max_t=4, grace_period=1, reduction_factor=2),
        resources_per_trial={"cpu": 1, "gpu": 0},
        max_concurrent_trials=1,  # one at a time: ASHA's decisions are then known in advance
        name="classic",
        verbose=1,
    )
    assert [t.config for t in analysis.trials] == [
        {"quality": 1.0, "width": 10},
        {"quality": 4.0, "width": 40},
        {"quality": 8.0, "width": 80},
    ]
    best = analysis.get_best_trial("loss", "min", "last")
    assert best.config["quality"] == 1.0 and best.last_result["training_iteration"] == 4
    assert best.last_result["loss"] == pytest.approx(0.25)
    # The best trial's latest checkpoint is a local directory with what the trainable wrote.
    with open(os.path.join(best.checkpoint.value, "epoch")) as f:
        assert f.read() == "4"
    # Worse trials were stopped by ASHA after their first report; Ray shows them as TERMINATED.
    stopped = [t for t in analysis.trials if t.config["quality"] > 1.0]
    assert all(t.last_result["training_iteration"] == 1 and t.status == "TERMINATED" for t in stopped)
    assert analysis.get_best_trial("loss", "min", "all").config["quality"] == 1.0

    # Recorded like the pipeline: an MLflow parent run with a child per trial, a Prefect flow run with task runs.
    info = analysis.record
    parent, children = _children(services["mlflow"], info.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["sweepflow.kind"] == "tune"
    assert sorted(c.data.params["quality"] for c in children) == ["1.0", "4.0", "8.0"]
    by_quality = {c.data.params["quality"]: c for c in children}
    assert by_quality["1.0"].data.tags["sweepflow.status"] == "COMPLETED"
    assert by_quality["8.0"].data.tags["sweepflow.status"] == "STOPPED"
    history = MlflowClient(services["mlflow"]).get_metric_history(by_quality["1.0"].info.run_id, "loss")
    assert [m.value for m in history] == pytest.approx([1.0, 0.5, 1 / 3, 0.25])

    # ... and recorded by the same step as a pipeline's sweep: per-trial summaries, the parent's totals and best,
    # the leaderboard (MLflow CSV and Prefect artifact with links), the sweep report, the best trial named.
    assert by_quality["1.0"].data.metrics["best_loss"] == pytest.approx(0.25)
    assert by_quality["8.0"].data.metrics["worker_seconds"] > 0
    assert (
        parent.data.metrics["best_loss"] == pytest.approx(0.25) and parent.data.metrics["worker_seconds"] > 0
    )
    assert parent.data.tags["sweepflow.failed_trials"] == "none"
    assert parent.data.tags["sweepflow.best_run_id"] == by_quality["1.0"].info.run_id
    client = MlflowClient(services["mlflow"])
    assert client.list_artifacts(parent.info.run_id, "leaderboard")
    assert client.list_artifacts(parent.info.run_id, "config")
    report = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert report == {"report/sweep_report.html"}, (
        report
    )  # one interactive page: its plots are drawn by its script

    from prefect import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
    )

    with get_client(sync_client=True) as prefect:
        flow_run = prefect.read_flow_run(info.prefect_flow_run_id)
        assert flow_run.state.is_completed()
        task_runs = final_task_runs(prefect, flow_run.id, at_least=3)
        board = [
            a
            for a in prefect.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id]))
            )
            if a.key == "sweep-leaderboard"
        ]
    assert sorted(t.name.split("-")[0] for t in task_runs) == ["trial_0000", "trial_0001", "trial_0002"]
    # Published once, when the sweep's best trial is known (one version in the flow run's Artifacts tab).
    latest = max(board, key=lambda a: a.created).data
    assert len(board) == 1 and "best_loss" in latest and f"]({services['mlflow']}/#/experiments/" in latest


def test_script_functions_ship_by_value_and_with_parameters_reach_every_trial(services):
    offset = 3.0
    table = np.arange(100_000, dtype=np.float64)  # a large object: sent to the workers once

    def closure_trainable(config, data=None):  # a closure: not importable on the workers
        from distributed import get_worker

        # The table is this worker's copy (sent once, as a worker plugin), not a copy shipped with the trial.
        in_store = any(data is getattr(p, "values", {}).get("data") for p in get_worker().plugins.values())
        tune.report({"score": config["x"] + offset + float(data[-1]), "in_store": float(in_store)})

    grid = tune.Tuner(
        tune.with_parameters(closure_trainable, data=table),
        param_space={"x": tune.grid_search([1.0, 2.0])},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(name="closures", verbose=0),
    ).fit()
    assert len(grid) == 2 and not grid.errors
    best = grid.get_best_result()
    assert best.config == {"x": 2.0} and best.metrics["score"] == pytest.approx(2.0 + 3.0 + 99_999.0)
    assert all(r.metrics["in_store"] == 1.0 for r in grid)
    frame = grid.get_dataframe()
    assert sorted(frame["config/x"]) == [1.0, 2.0] and list(frame["status"]) == ["TERMINATED"] * 2

    lam = tune.Tuner(
        lambda config: tune.report({"score": config["x"] * 2}),
        param_space={"x": tune.uniform(0.0, 1.0)},
        tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=2),
        run_config=tune.RunConfig(name="lambdas", verbose=0),
    ).fit()
    assert all(r.metrics["score"] == pytest.approx(2 * r.config["x"]) for r in lam)


def ddp_loop(config):
    """A TorchTrainer's train_loop_per_worker (current Ray docs): fails for x == 0 to show errors."""
    ctx = train.get_context()
    if config["x"] == 0:
        raise ValueError("x must not be 0")
    rows = train.get_dataset_shard("train").count()  # this rank's shard of the trainer's dataset
    for step in range(1, 3):
        train.report(
            {"score": config["x"] * step + config["base"], "world_size": ctx.get_world_size(), "rows": rows}
        )


def test_tuner_with_a_torch_trainer_runs_a_ddp_group_per_trial_and_collects_errors(services):
    trainer = TorchTrainer(
        ddp_loop,
        train_loop_config={"base": 100},
        scaling_config=train.ScalingConfig(num_workers=2),
        datasets={"train": ray_data.range(10)},  # every trial's group gets it, each rank its half
    )
    grid = tune.Tuner(
        trainer,
        param_space={"train_loop_config": {"x": tune.grid_search([0, 1, 2])}},
        tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=1),
        run_config=tune.RunConfig(name="torch-trainer", verbose=0),
    ).fit()
    assert len(grid) == 3 and grid.num_errors == 1 and "x must not be 0" in grid.errors[0]
    best = grid.get_best_result()
    assert best.config == {"train_loop_config": {"x": 2}}
    assert best.metrics["score"] == 104 and best.metrics["world_size"] == 2 and best.metrics["rows"] == 5
    assert best.metrics_dataframe["score"].tolist() == [102, 104]


def ddp_classic(config, checkpoint_dir=None):
    """The tutorial's DDP section: DistributedDataParallel when distributed, distributed_checkpoint_dir."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    net = torch.nn.Linear(2, 1)
    if is_distributed_trainable():
        net = DistributedDataParallel(net)
    for epoch in range(1, 3):
        with distributed_checkpoint_dir(step=epoch) as directory:
            with open(os.path.join(directory, "rank"), "w") as f:
                f.write(str(train.get_context().get_world_rank()))
        tune.report(loss=config["lr"] / epoch, distributed=float(is_distributed_trainable()))


def test_distributed_trainable_creator_runs_ddp_trials_and_rank0_checkpoints(services):
    analysis = tune.run(
        DistributedTrainableCreator(ddp_classic, num_workers=2, num_cpus_per_worker=1),
        config={"lr": tune.grid_search([0.1, 0.2])},
        resources_per_trial=None,
        metric="loss",
        mode="min",
        verbose=0,
    )
    best = analysis.get_best_trial()
    assert best.config == {"lr": 0.1} and best.last_result["distributed"] == 1.0
    with open(os.path.join(best.checkpoint.value, "rank")) as f:
        assert f.read() == "0"  # rank 0's directory is the checkpoint; the others were thrown away
    with pytest.raises(ValueError, match="resources_per_trial=None"):
        tune.run(
            DistributedTrainableCreator(ddp_classic, num_workers=2), config={}, resources_per_trial={"cpu": 1}
        )


def test_optuna_search_proposes_configs_from_results(services):
    analysis = tune.run(
        lambda config: tune.report(loss=(config["x"] - 3.0) ** 2),
        config={"x": tune.uniform(0.0, 10.0)},
        num_samples=8,
        search_alg=OptunaSearch(metric="loss", mode="min", seed=0),
        max_concurrent_trials=1,
        verbose=0,
    )
    assert len(analysis.trials) == 8
    assert analysis.get_best_trial().last_result["loss"] < 4.0


def test_mistakes_are_refused_before_any_work(services):
    client = MlflowClient(services["mlflow"])
    runs_before = len(client.search_runs([e.experiment_id for e in client.search_experiments()]))
    with pytest.raises(train.InsufficientResourcesError, match="resources_per_trial"):
        tune.run(quality_trainable, config={"quality": 1.0, "width": 1}, resources_per_trial={"gpu": 1})
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        ASHAScheduler(metric="loss", mode="minimize")
    with pytest.raises(ValueError, match="needs the metric"):
        tune.run(quality_trainable, config={}, scheduler=ASHAScheduler(max_t=4))
    with pytest.raises(ValueError, match="lower < upper"):
        tune.loguniform(1e-1, 1e-4)
    with pytest.raises(ValueError, match="object store"):
        tune.run(quality_trainable, config={}, resources_per_trial={"object_store_memory": 1})
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == runs_before


def run_example(name: str, *args: str) -> str:
    """Run examples/<name> as a user would, against this test's services (from the environment); its stdout."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.subprocess
def test_rays_cifar_tutorial_runs_with_its_imports_changed(services, prefect_harness):
    stdout = run_example("ray_tune_cifar.py", "--smoke-test")
    assert "Number of trials: 2 (2 TERMINATED)" in stdout
    accuracy = float(stdout.split("Best trial test set accuracy: ")[1].split()[0])
    assert 0.0 <= accuracy <= 1.0  # smoke mode: 2 random configs x 2 epochs may not beat chance (0.1)


@pytest.mark.subprocess
def test_rays_2_function_trainable_getting_started_runs_with_its_imports_changed(services, prefect_harness):
    """Ray 2's Tune function API: tune.report(metrics, checkpoint=), Tuner + TuneConfig + RunConfig(stop=)."""
    stdout = run_example("ray_tune_function_trainable.py", "--smoke-test")
    assert "Number of results: 2, errors: 0" in stdout
    assert (
        float(stdout.split("Best mean_accuracy: ")[1].split()[0]) > 0.2
    )  # chance is 0.1: 3 epochs of a tiny ConvNet
    assert "Best checkpoint's epoch: 2" in stdout  # the stop criterion's last report (training_iteration 3)


@pytest.mark.subprocess
def test_rays_2_tuner_over_a_torch_trainer_runs_with_its_imports_changed(services, prefect_harness):
    """Ray 2's Ray Train + Tune: Tuner(TorchTrainer(...), param_space={"train_loop_config": ...}), 2-rank trials."""
    stdout = run_example("ray_tuner_torch_trainer.py", "--smoke-test")
    assert "Number of results: 2, errors: 0" in stdout
    config = stdout.split("Best train_loop_config: ")[1].splitlines()[0]
    assert "'lr': " in config and "'hidden': " in config  # the searched keys, merged over the trainer's own
    assert float(stdout.split("Best loss: ")[1].split(",")[0]) < 2.3  # better than chance (ln 10)
    assert "Best checkpoint holds 4 tensors" in stdout  # rank 0's model: two Linear layers


def test_a_metric_the_trainable_never_reports_stops_the_sweep_at_its_first_report(services):
    with pytest.raises(Exception, match="never reports 'accuracy'") as excinfo:
        tune.run(
            quality_trainable,
            config={"quality": tune.grid_search([1.0, 2.0, 3.0, 4.0]), "width": 1},
            scheduler=ASHAScheduler(metric="accuracy", mode="max", max_t=4),
            verbose=0,
        )
    assert "['loss', 'width']" in str(excinfo.value)


@pytest.mark.subprocess
def test_rays_ddp_trainable_runs_ddp_trials_with_its_imports_changed(services, prefect_harness):
    stdout = run_example("ray_tune_ddp_mnist.py", "--smoke-test")
    accuracy = float(stdout.split("Best mean_accuracy: ")[1].split()[0])
    assert accuracy > 0.5  # 2 epochs of a small ConvNet on 4,000 real MNIST images
    assert "Best checkpoint holds 4 tensors" in stdout


def crash_once_trainable(config, checkpoint_dir=None):
    """Fails once after its second report (the first attempt); the restart resumes from checkpoint_dir."""
    start = 0
    if checkpoint_dir:
        with open(os.path.join(checkpoint_dir, "epoch")) as f:
            start = int(f.read())
    for epoch in range(start + 1, 4):
        with tune.checkpoint_dir(epoch) as directory:
            with open(os.path.join(directory, "epoch"), "w") as f:
                f.write(str(epoch))
        tune.report(loss=1.0 / epoch, resumed_from=float(start))
        marker = os.path.join(config["marker_dir"], "crashed")
        if epoch == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("simulated crash after epoch 2")


def test_a_failed_trial_restarts_from_its_checkpoint_dir_with_max_failures(services, tmp_path):
    analysis = tune.run(
        crash_once_trainable,
        config={"marker_dir": str(tmp_path)},
        max_failures=1,
        metric="loss",
        mode="min",
        verbose=0,
    )
    trial = analysis.trials[0]
    assert trial.status == "TERMINATED" and trial.last_result["loss"] == pytest.approx(1 / 3)
    # epochs 1, 2 from the first attempt, then epoch 3 from the restart, which started at epoch 2's checkpoint
    assert [h["resumed_from"] for h in trial.metric_history] == [0.0, 0.0, 2.0]
    assert trial.result.restarts == 1


def diverging_trainable(config, checkpoint_dir=None):
    """The loss of quality 0 becomes NaN at its second report (a diverged run); the others train normally."""
    for epoch in range(1, 5):
        loss = float("nan") if config["quality"] == 0.0 and epoch >= 2 else config["quality"] / epoch
        tune.report(loss=loss)


def test_a_non_finite_loss_fails_its_trial_at_that_report_and_the_sweep_goes_on(services):
    analysis = tune.run(
        diverging_trainable,
        config={"quality": tune.grid_search([0.0, 1.0, 2.0])},
        scheduler=ASHAScheduler(metric="loss", mode="min", max_t=4, grace_period=4),
        max_concurrent_trials=1,
        raise_on_failed_trial=False,
        verbose=0,
    )
    by_quality = {t.config["quality"]: t for t in analysis.trials}
    diverged = by_quality[0.0]
    assert (
        diverged.status == "ERROR" and diverged.last_result["training_iteration"] == 2
    )  # stopped at that report
    assert "non-finite loss=nan at report 2" in diverged.error_msg
    assert [by_quality[q].status for q in (1.0, 2.0)] == ["TERMINATED", "TERMINATED"]
    assert analysis.get_best_trial("loss", "min", "last").config["quality"] == 1.0
    _, children = _children(services["mlflow"], analysis.record.parent_run_id)
    run = next(c for c in children if c.data.params["quality"] == "0.0")
    assert run.info.status == "FAILED" and "diverged" in run.data.tags["sweepflow.error"]


def scored_trainable(config):
    """Fails for x == 0; otherwise reports score = x * step for 3 steps."""
    if config["x"] == 0:
        raise ValueError("x must not be 0")
    for step in range(1, 4):
        tune.report({"score": config["x"] * step})


class StopOnceAScoreReaches(tune.Stopper):
    """What a Ray user writes: no trial stopped on its own, the experiment once any score reached ``bound``."""

    def __init__(self, bound: float) -> None:
        self.bound, self.reached = bound, False

    def __call__(self, trial_id, result):
        self.reached = self.reached or result["score"] >= self.bound
        return False

    def stop_all(self):
        return self.reached


def _child_exits_cleanly() -> None:
    """A forked child that does nothing: its exit code is the process's own health."""


def _forks_cleanly() -> bool:
    """What a DataLoader(num_workers=2) over the best checkpoint does after tuning: fork a child that must exit 0."""
    child = multiprocessing.get_context("fork").Process(target=_child_exits_cleanly)
    child.start()
    child.join(timeout=60)
    return child.exitcode == 0


def test_fail_fast_and_a_stoppers_stop_all_end_the_experiment_and_the_process_forks_cleanly_after(services):
    def tuner(fail_fast):
        return tune.Tuner(
            scored_trainable,
            param_space={"x": tune.grid_search([0, 1, 2])},
            tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=1),
            run_config=tune.RunConfig(
                name="fail-fast", verbose=0, failure_config=tune.FailureConfig(fail_fast=fail_fast)
            ),
        )

    grid = tuner(True).fit()  # trial 0 fails first: nothing else starts
    assert len(list(grid)) == 1 and "x must not be 0" in str(list(grid)[0].error)
    assert _forks_cleanly()  # after Tuner.fit
    with pytest.raises(tune.TuneError, match="x must not be 0"):
        tuner("raise").fit()

    analysis = tune.run(
        scored_trainable,
        config={"x": tune.grid_search([1, 2, 3])},
        metric="score",
        mode="max",
        stop=StopOnceAScoreReaches(4),
        max_concurrent_trials=1,
        verbose=0,
    )
    by_x = {t.config["x"]: t for t in analysis.trials}
    assert sorted(by_x) == [1, 2]  # x=3 never started
    assert by_x[1].last_result["training_iteration"] == 3
    assert by_x[2].status == "TERMINATED" and by_x[2].last_result["score"] == 4  # complete at the report
    _, children = _children(services["mlflow"], analysis.record.parent_run_id)
    assert sorted(c.info.status for c in children) == ["FINISHED", "FINISHED"]
    assert _forks_cleanly()  # after tune.run, the third experiment in this process


class AccumulatingTrainable(tune.Trainable):
    """What a Ray user writes: a class trainable whose state is one number. Its trial with lr=0.5 crashes once
    at step 3, after its step-2 checkpoint: with max_failures it restarts from that checkpoint."""

    def setup(self, config, offset=0.0, marker_dir=""):
        self.lr, self.offset, self.marker_dir = config["lr"], offset, marker_dir
        self.value, self.restored = 0.0, 0.0

    def step(self):
        marker = os.path.join(self.marker_dir, "crashed")
        if self.lr == 0.5 and self.iteration == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("crash once at step 3")
        self.value += self.lr
        return {"score": self.value + self.offset, "restored": self.restored}

    def save_checkpoint(self, checkpoint_dir):
        return {"value": self.value}

    def load_checkpoint(self, checkpoint):
        self.value, self.restored = checkpoint["value"], 1.0


def test_a_class_trainable_steps_checkpoints_and_restarts_from_its_checkpoint(services, tmp_path):
    analysis = tune.run(
        tune.with_parameters(AccumulatingTrainable, offset=10.0, marker_dir=str(tmp_path)),
        config={"lr": tune.grid_search([0.5, 1.0])},
        stop={"training_iteration": 4},
        checkpoint_freq=2,
        checkpoint_at_end=True,
        max_failures=1,
        metric="score",
        mode="max",
        verbose=0,
    )
    by_lr = {t.config["lr"]: t for t in analysis.trials}
    for lr, trial in by_lr.items():
        assert trial.status == "TERMINATED" and trial.last_result["training_iteration"] == 4
        assert trial.last_result["score"] == pytest.approx(
            10.0 + 4 * lr
        )  # the state carried over the restart
        with open(os.path.join(trial.checkpoint.value, "_sweepflow_trainable_state.pkl"), "rb") as f:
            assert pickle.load(f) == {"value": pytest.approx(4 * lr)}  # checkpoint_at_end: the step-4 state
    assert by_lr[0.5].last_result["restored"] == 1.0 and by_lr[1.0].last_result["restored"] == 0.0
    assert os.path.exists(tmp_path / "crashed")


def test_the_median_stopping_rule_stops_a_trial_behind_the_others(services):
    analysis = tune.run(
        scored_trainable,  # score = x * step, 3 steps
        config={"x": tune.grid_search([3, 2, 1])},
        scheduler=MedianStoppingRule(metric="score", mode="max", grace_period=2, min_samples_required=2),
        max_concurrent_trials=1,
        verbose=0,
    )
    by_x = {t.config["x"]: t for t in analysis.trials}
    assert [by_x[x].last_result["training_iteration"] for x in (3, 2, 1)] == [3, 3, 2]
    _, children = _children(services["mlflow"], analysis.record.parent_run_id)
    stopped = next(c for c in children if c.data.params["x"] == "1")
    assert stopped.data.tags["sweepflow.outcome"] == "stopped early (median stopping rule) at epoch 2"
    # Prefect shows it too: a success named for how it ended, and the outcome in the run's description.
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect:
        state = final_task_run(prefect, stopped.data.tags["prefect.task_run_id"]).state
    assert state.is_completed() and state.name == "Stopped early"
    assert state.message.endswith("stopped early (median stopping rule) at epoch 2")
    assert "stopped early (median stopping rule) at epoch 2" in stopped.data.tags["mlflow.note.content"]


@pytest.mark.subprocess
def test_an_interrupted_experiment_is_restored_from_the_path_it_printed(services, tmp_path):
    """Ray's fault-tolerance pattern after the script running ``Tuner.fit()`` was SIGKILLed with its workers:
    ``Tuner.can_restore(path)`` / ``Tuner.restore(path, trainable).fit()`` with the path the experiment printed.
    The ended trials are read back from MLflow (not run again), the running one continues from its checkpoint in
    the same MLflow run. Restoring the finished experiment reads it back; ``tune.run(resume=True)`` finds nothing
    left to resume."""
    from tune_resume_fns import blocking_trainable, experiment

    marks = str(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(paths.SUPPORT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("DASK_SCHEDULER_ADDRESS")  # the killed experiment runs on its own workers
    script = str(paths.SUPPORT / "tune_resume_fns.py")
    output = tmp_path / "script.log"
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, script, marks, "resumable", "tuner"],
            env=env,
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    client = MlflowClient(services["mlflow"])
    try:
        # Killed once trials 1 and 2 have ended and trial 3 has committed its first checkpoint (it then waits).
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            runs = _experiment_runs(client, "resumable")
            ended = [r for r in runs if "sweepflow.status" in r.data.tags]
            third = [r for r in runs if r.data.params.get("quality") == "3"]
            if len(ended) == 2 and third and client.list_artifacts(third[0].info.run_id, "checkpoints"):
                break
            time.sleep(0.2)
        else:
            pytest.fail(
                f"the experiment did not reach its third trial (exit code {proc.poll()}): {output.read_text()}"
            )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    runs = client.search_runs([client.get_experiment_by_name("resumable").experiment_id])
    killed_parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert killed_parent.info.status == "RUNNING"
    printed = re.search(r"Experiment path: (\S+)", output.read_text())
    assert printed, output.read_text()
    path = printed.group(1)
    assert tune.Tuner.can_restore(path) and not tune.Tuner.can_restore(str(tmp_path))

    # Read back without running anything (Ray's Tuner.get_results): the two ended trials, and the third as its
    # dead process left it, one report in, pending.
    seen = tune.Tuner.restore(path, trainable=blocking_trainable).get_results()
    assert (
        seen.record.parent_run_id == killed_parent.info.run_id and len(seen) == 3 and seen.num_terminated == 2
    )
    assert sorted(len(r.metrics_dataframe) for r in seen) == [1, 3, 3]  # reports so far
    assert next(r for r in seen if r.config["quality"] == 1).metrics["loss"] == pytest.approx(1 / 3)
    assert next(r for r in seen if r.config["quality"] == 3).error is None
    assert client.get_run(killed_parent.info.run_id).info.status == "RUNNING"  # nothing changed
    with open(os.path.join(marks, "starts")) as f:
        assert f.read().split() == ["1:0", "2:0", "3:0"]

    open(os.path.join(marks, "go"), "w").close()
    tuner = tune.Tuner.restore(path, trainable=blocking_trainable)
    grid = tuner.fit()
    assert tuner.get_results() is grid
    assert grid.experiment_path == path
    assert grid.record.parent_run_id == killed_parent.info.run_id
    parent = client.get_run(killed_parent.info.run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["sweepflow.resumes"] == "1"
    with open(os.path.join(marks, "starts")) as f:
        starts = f.read().split()
    assert starts == ["1:0", "2:0", "3:0", "3:1"]  # 1 and 2 read back; 3 continued after its first checkpoint
    assert len(_experiment_runs(client, "resumable")) == 3  # the same child run per trial
    best = grid.get_best_result()
    assert best.config["quality"] == 1 and best.metrics["loss"] == pytest.approx(1 / 3)
    third = next(r for r in grid if r.config["quality"] == 3)
    assert third.metrics["training_iteration"] == 3 and third.error is None
    assert third.mlflow_run_id == _run_of(client, 3)
    history = client.get_metric_history(third.mlflow_run_id, "loss")
    assert [m.value for m in history] == pytest.approx([3.0, 1.5, 1.0])  # each epoch logged once

    # The finished experiment restores as read back (the trainable saved with it), nothing run again.
    again = tune.Tuner.restore(path).fit()
    assert sorted(r.metrics["loss"] for r in again) == pytest.approx(sorted(r.metrics["loss"] for r in grid))
    with open(os.path.join(marks, "starts")) as f:
        assert f.read().split() == starts
    assert len(_experiment_runs(client, "resumable")) == 3
    with pytest.raises(ValueError, match="no interrupted run"):  # nothing left to resume
        experiment(marks, "resumable", resume=True)
    with pytest.raises(ValueError, match="holds no experiment"):
        tune.Tuner.restore(str(tmp_path), trainable=blocking_trainable)


def flaky(config):
    """Two reports with a checkpoint each; fails after its first while the file ``fail`` exists. Its starts are
    logged as ``start-epoch``."""
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory, open(os.path.join(directory, "epoch")) as f:
            start = int(f.read())
    with open(os.path.join(config["marks"], "starts"), "a") as f:
        f.write(f"{config['x']}:{start}\n")
    for epoch in range(start + 1, 3):
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "epoch"), "w") as f:
                f.write(str(epoch))
            tune.report({"score": config["x"] * epoch}, checkpoint=tune.Checkpoint.from_directory(directory))
        if config["x"] == 2 and os.path.exists(os.path.join(config["marks"], "fail")):
            raise RuntimeError("flaky trial fails")


def test_restore_resumes_or_restarts_the_failed_trials_as_asked(services, tmp_path):
    marks = str(tmp_path)
    open(os.path.join(marks, "fail"), "w").close()
    grid = tune.Tuner(
        flaky,
        param_space={"x": tune.grid_search([1, 2]), "marks": marks},
        tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=1),
        run_config=tune.RunConfig(name="flaky", storage_path=str(tmp_path / "results"), verbose=0),
    ).fit()
    path = grid.experiment_path
    assert path == str(tmp_path / "results" / "flaky") and grid.num_errors == 1

    def starts() -> list[str]:
        with open(os.path.join(marks, "starts")) as f:
            return f.read().split()

    assert tune.Tuner.restore(path, flaky).fit().num_errors == 1  # failed trials stay failed by default
    assert starts() == ["1:0", "2:0"]
    resumed = tune.Tuner.restore(path, flaky, resume_errored=True).fit()  # from its checkpoint: fails again
    assert resumed.num_errors == 1 and starts() == ["1:0", "2:0", "2:1"]
    os.remove(os.path.join(marks, "fail"))
    restarted = tune.Tuner.restore(path, flaky, restart_errored=True).fit()
    assert restarted.num_errors == 0 and starts() == ["1:0", "2:0", "2:1", "2:0"]
    assert sorted(r.metrics["score"] for r in restarted) == [2, 4]
    client = MlflowClient(services["mlflow"])
    runs = _experiment_runs(client, "flaky")
    assert len(runs) == 3  # the restarted trial's failed run is kept, tagged; the trial has a new one
    [old] = [r for r in runs if r.data.tags.get("sweepflow.restarted") == "true"]
    assert old.info.status == "FAILED"
    with pytest.raises(ValueError, match="not both"):
        tune.Tuner.restore(path, flaky, resume_errored=True, restart_errored=True)


def _experiment_runs(client: MlflowClient, name: str):
    """The trial runs of experiment ``name`` (none before it exists)."""
    found = client.get_experiment_by_name(name)
    if found is None:
        return []
    return [r for r in client.search_runs([found.experiment_id]) if "mlflow.parentRunId" in r.data.tags]


def _run_of(client: MlflowClient, quality: int) -> str:
    return next(
        r.info.run_id
        for r in _experiment_runs(client, "resumable")
        if r.data.params["quality"] == str(quality)
    )


def threads_and_times(config):
    """Reports the torch threads its rank got, and when it ran."""
    import torch

    started = time.time()
    time.sleep(0.3)
    tune.report(threads=torch.get_num_threads(), started=started, ended=time.time())


def test_a_trial_asking_two_cpus_runs_on_a_two_core_host_as_ray_fits_it(services):
    """The session's cluster has 2 workers declaring CPU=1 each on one host. A trial asking {"cpu": 2} runs,
    with 2 torch threads, one trial at a time (the host's 2 cores shared, not oversubscribed); {"cpu": 3} is
    more than the host has, and is refused before any work."""
    analysis = tune.run(
        threads_and_times, config={"i": tune.grid_search([0, 1])}, resources_per_trial={"cpu": 2}, verbose=0
    )
    results = sorted((t.last_result for t in analysis.trials), key=lambda r: r["started"])
    assert [r["threads"] for r in results] == [2, 2]
    assert results[0]["ended"] <= results[1]["started"]  # one at a time
    with pytest.raises(train.InsufficientResourcesError, match="resources_per_trial"):
        tune.run(threads_and_times, config={}, resources_per_trial={"cpu": 3}, verbose=0)


class CountingTrainable(tune.Trainable):
    """Logs each setup, reset and cleanup to the file ``events`` in config["marks"]."""

    def _log(self, what):
        with open(os.path.join(self.config["marks"], "events"), "a") as f:
            f.write(f"{what}:{os.getpid()}\n")

    def setup(self, config):
        self._log("setup")

    def step(self):
        open(os.path.join(self.config["marks"], f"ran-{self.trial_id}"), "w").close()
        return {"score": self.config["x"] * (self.iteration + 1)}

    def reset_config(self, new_config):
        self.config = new_config
        self._log("reset")
        return True

    def cleanup(self):
        self._log("cleanup")


def test_reuse_actors_hands_a_class_trainables_object_to_the_next_trial_and_cleans_it_up(services, tmp_path):
    analysis = tune.run(
        CountingTrainable,
        config={"x": tune.grid_search([1, 2, 3, 4]), "marks": str(tmp_path)},
        stop={"training_iteration": 2},
        metric="score",
        mode="max",
        max_concurrent_trials=1,
        reuse_actors=True,
        verbose=0,
    )
    assert sorted(t.last_result["score"] for t in analysis.trials) == [2, 4, 6, 8]  # each with its own config
    events = [line.split(":") for line in (tmp_path / "events").read_text().split()]
    kinds = [kind for kind, _ in events]
    assert kinds.count("setup") + kinds.count("reset") == 4 and kinds.count("reset") >= 1
    # Each object built is cleaned up once, in its own worker, when the experiment ends (not between trials).
    assert sorted(pid for kind, pid in events if kind == "setup") == sorted(
        pid for kind, pid in events if kind == "cleanup"
    )
    assert kinds[-kinds.count("cleanup") :] == ["cleanup"] * kinds.count("cleanup")
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == [
        f"ran-trial_000{i}" for i in range(4)
    ]  # its own id


def test_a_trainable_built_outside_a_trial_steps_and_names_itself_default(tmp_path, monkeypatch):
    """As Ray's: a Trainable stepped in a plain process (a benchmark, a test, ``validate_save_restore``) has the
    trial id ``"default"`` and the current directory as its logdir."""
    monkeypatch.chdir(tmp_path)
    work = CountingTrainable({"x": 2, "marks": str(tmp_path)})
    assert work.trial_id == work.trial_name == "default" and work.logdir == str(tmp_path)
    assert work.train()["score"] == 2 and work.train()["score"] == 4 and work.iteration == 2
    assert (tmp_path / "ran-default").exists()


def test_a_parked_trainable_keeps_its_scripts_modules_so_its_classes_still_pickle(tmp_path):
    """reuse_actors: the object a trial leaves for the next holds its script's modules loaded
    (``hold_script_modules``); without the hold the next trial imports them anew and pickling what the object
    holds (a DataLoader starting workers with spawn or forkserver) fails: "it's not the same object as ..."."""
    import pickle
    import sys

    from sweepflow.tasks.training.function import _importable, hold_script_modules

    script_dir = tmp_path / "script"
    script_dir.mkdir()
    (script_dir / "parked_sibling_mod.py").write_text("class Dataset:\n    pass\n")
    with _importable(str(script_dir)):  # the first trial
        import parked_sibling_mod

        kept = parked_sibling_mod.Dataset()  # what the parked object holds
        release = hold_script_modules()
    assert str(script_dir) in sys.path and sys.modules["parked_sibling_mod"].Dataset is type(kept)
    with _importable(str(script_dir)):  # the next trial takes the object over
        import parked_sibling_mod

        assert pickle.loads(pickle.dumps(kept)).__class__ is parked_sibling_mod.Dataset
    release()
    release()  # once only
    assert "parked_sibling_mod" not in sys.modules and str(script_dir) not in sys.path

    with _importable(str(script_dir)):  # no hold: the trial's modules go with it, as before
        import parked_sibling_mod

        left = parked_sibling_mod.Dataset()
    with _importable(str(script_dir)), pytest.raises(pickle.PicklingError, match="not the same object"):
        import parked_sibling_mod  # noqa: F401 - imported anew

        pickle.dumps(left)
    assert hold_script_modules()() is None  # outside a trial: nothing to hold


def same_relative_path_trainable(config):
    """Writes its name to the relative path scratch/owner.txt, waits until every trial of the experiment has, then
    reads it back (Ray runs each trial in its own directory: its examples write to relative paths, "my_model/")."""
    me, marks = config["me"], config["marks"]
    os.makedirs("scratch", exist_ok=True)
    with open("scratch/owner.txt", "w") as f:
        f.write(me)
    with open(os.path.join(marks, f"{me}.cwd"), "w") as f:
        f.write(os.getcwd())
    deadline = time.monotonic() + 120
    while len([n for n in os.listdir(marks) if n.endswith(".cwd")]) < config["together"]:
        assert time.monotonic() < deadline, "the other trial never started: the trials did not run together"
        time.sleep(0.05)
    with open("scratch/owner.txt") as f:
        seen = f.read()
    in_trial_dir = os.path.samefile(os.getcwd(), tune.get_context().get_trial_dir())
    tune.report({"clobbered": float(seen != me), "in_trial_dir": float(in_trial_dir)})


def test_each_trial_runs_in_its_own_directory_so_relative_paths_do_not_clobber(
    services, cluster, tmp_path, monkeypatch
):
    """Two trials at once on the session's cluster write and read the same relative path: each in its own trial
    directory (``tune.get_context().get_trial_dir()``), its worker's directory given back afterwards; with Ray's
    ``RAY_CHDIR_TO_TRIAL_DIR=0`` a trial stays in its worker's directory."""
    workers_cwd = cluster.run(os.getcwd)
    marks = tmp_path / "marks"
    marks.mkdir()
    grid = tune.Tuner(
        same_relative_path_trainable,
        param_space={"me": tune.grid_search(["a", "b"]), "marks": str(marks), "together": 2},
        tune_config=tune.TuneConfig(metric="clobbered", mode="min", max_concurrent_trials=2),
        run_config=tune.RunConfig(name="own_directories", verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    assert [(r.metrics["clobbered"], r.metrics["in_trial_dir"]) for r in grid] == [(0.0, 1.0), (0.0, 1.0)]
    cwds = {me: (marks / f"{me}.cwd").read_text() for me in ("a", "b")}
    assert cwds["a"] != cwds["b"] and not set(cwds.values()) & set(workers_cwd.values())
    for me, cwd in cwds.items():  # the files stay in the trial's directory (until its worker closes)
        assert open(os.path.join(cwd, "scratch", "owner.txt")).read() == me
    assert cluster.run(os.getcwd) == workers_cwd

    monkeypatch.setenv("RAY_CHDIR_TO_TRIAL_DIR", "0")
    alone = tmp_path / "alone"
    alone.mkdir()
    grid = tune.Tuner(
        same_relative_path_trainable,
        param_space={"me": "c", "marks": str(alone), "together": 1},
        run_config=tune.RunConfig(name="no_chdir", verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    assert grid[0].metrics["in_trial_dir"] == 0.0
    assert (alone / "c.cwd").read_text() in workers_cwd.values()
    for cwd in set(workers_cwd.values()):  # what the trial wrote, where Ray would have put it: clean up
        shutil.rmtree(os.path.join(cwd, "scratch"), ignore_errors=True)


SIBLING_SCRIPT = """
from my_model import Net  # a module beside the script, importable only where the script's directory is

from sweepflow import tune


def trainable(config):
    tune.report({"score": Net().score(config["x"])})


if __name__ == "__main__":
    grid = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1.0, 2.0])},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(name="siblings", verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    print("best score", grid.get_best_result().metrics["score"])
"""


@pytest.mark.subprocess
def test_a_scripts_sibling_modules_import_on_workers_started_elsewhere(services, cluster, tmp_path):
    """Ray puts the driver script's directory on its workers' path, so a trainable may use the modules beside the
    script. The session's workers were started by this process (the script's directory is not on their path):
    the trials run, and afterwards the workers' path and modules are as before (the next run of the script gets
    its modules as they are then)."""
    (tmp_path / "my_model.py").write_text("class Net:\n    def score(self, x):\n        return 2 * x\n")
    (tmp_path / "train.py").write_text(SIBLING_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "best score 4.0" in proc.stdout
    directory = str(tmp_path)
    left = cluster.run(lambda: (directory in sys.path, "my_model" in sys.modules))
    assert set(left.values()) == {(False, False)}, left
