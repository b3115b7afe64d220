"""The pipeline end to end: real Dask LocalCluster, real `mlflow server`, Prefect test harness."""

from __future__ import annotations

import json
import logging
import os

import mlflow
import pytest
from conftest import SHARED_WORKERS, whole
from mlflow.tracking import MlflowClient
from mlflow_server import sqlite_store
from prefect import flow
from prefect_records import final_task_run
from sweep_parts import sweep_of

from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.pipeline import training_pipeline
from sweepflow.flows.pipeline_lowering import pipeline_sampler
from sweepflow.flows.settings import resolve_settings
from sweepflow.tasks.compat import tracking_uri_scope
from sweepflow.tasks.datasets import DataConfig, prepare_dataset
from sweepflow.tasks.sweep.results import TrialResult, TrialStatus
from sweepflow.tasks.tracking.runs import RunTracker
from sweepflow.tune import schedulers as tune_schedulers


def _config(tmp_path, cluster, tracking_uri, **sections) -> PipelineConfig:
    base = {
        "state_dir": str(tmp_path / "state"),
        "dask": {"scheduler_address": cluster.scheduler.address},
        "mlflow": {
            "tracking_uri": tracking_uri,
            "experiment_name": "e2e",
            "registered_model_name": "digits-e2e",
        },
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return PipelineConfig.model_validate(base)


class Run:
    """What one pipeline run left behind, read once: its summary, its log lines, its MLflow runs, its Prefect
    artifacts; then the scheduled retraining's summary."""

    def __init__(self, summary, messages, client, challenger_after_first, second, tracking_uri):
        self.summary = summary
        self.messages = messages
        self.client = client
        self.challenger_after_first = challenger_after_first
        self.second = second
        self.tracking_uri = tracking_uri
        self.parent = client.get_run(summary["parent_run_id"])
        self.children = client.search_runs(
            [self.parent.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{self.parent.info.run_id}'",
        )


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def run(prefect_harness, mlflow_server, _shared_cluster, tmp_path_factory):
    """The pipeline once, end to end (3 trials of 2 ranks, ASHA, evaluation, registration), then a scheduled
    retraining with a worse budget: every test below checks one property of what they left."""
    cluster = whole(_shared_cluster, SHARED_WORKERS)
    tmp_path = tmp_path_factory.mktemp("pipeline-e2e")
    good = _config(
        tmp_path,
        cluster,
        mlflow_server,
        sweep={
            "search_space": {
                "l1": {"type": "pow2", "low": 32, "high": 128},
                "l2": {"type": "pow2", "low": 32, "high": 128},
                "lr": {"type": "loguniform", "low": 4e-3, "high": 1.5e-2},
                "batch_size": {"type": "choice", "values": [32]},
            },
            "num_samples": 3,
        },
        training={"epochs": 8, "system_metrics_interval_s": 0.5},
        scheduler={"max_t": 8, "grace_period": 2, "reduction_factor": 2},
        resources={"ranks_per_trial": 2},
    )
    handler = _Messages()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        summary = training_pipeline(config=good)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    client = MlflowClient(mlflow_server)
    challenger_after_first = client.get_model_version_by_alias("digits-e2e", "challenger").version

    # Scheduled retraining with a worse budget.
    worse = _config(
        tmp_path,
        whole(_shared_cluster, SHARED_WORKERS),
        mlflow_server,
        sweep={"search_space": {"lr": 1e-5, "batch_size": 64, "l1": 4, "l2": 4}, "num_samples": 1},
        training={"epochs": 1},
        scheduler={"type": "fifo"},
        resources={"ranks_per_trial": 1},
    )
    second = training_pipeline(config=worse)
    return Run(summary, handler.messages, client, challenger_after_first, second, mlflow_server)


def test_the_progress_lines_last_best_is_the_best_trials_best_value(run):
    # The progress line's last "best" is the best trial's best value, as the summary names it (not a last value).
    progress = [m for m in run.messages if "| best val_accuracy=" in m]
    assert progress, run.messages[-20:]
    best = run.summary["best_trial"]
    assert progress[-1].endswith(f"best val_accuracy={best['best']:.4f} ({best['trial_id']})"), progress[-1]


def test_the_registered_model_is_good_and_holds_both_aliases(run):
    client, summary = run.client, run.summary
    assert summary["test_metrics"]["test_accuracy"] >= 0.90
    reg = summary["registration"]
    assert reg["became_champion"] and reg["version"] == 1
    version = client.get_model_version_by_alias("digits-e2e", "champion")
    assert version.version == "1"
    # Its source run is the trial that trained it (which carries the test-set evaluation too); the data it was
    # trained on is on the version and on the trial's parent run.
    assert version.run_id == summary["best_trial"]["run_id"]
    source = client.get_run(version.run_id)
    assert source.data.metrics["test_accuracy"] == summary["test_metrics"]["test_accuracy"]
    assert version.tags["sweepflow.data_checksum"] == client.get_run(
        source.data.tags["mlflow.parentRunId"]
    ).data.tags["sweepflow.data_checksum"]
    assert run.challenger_after_first == "1"


def test_the_parent_run_holds_config_checksum_best_trial_metrics_and_report(run):
    # Parent run: config, data checksum, code version, best trial, test metrics, confusion matrix, leaderboard.
    client, summary, parent = run.client, run.summary, run.parent
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["sweepflow.data_checksum"]
    assert parent.data.tags["sweepflow.best_trial"] == summary["best_trial"]["trial_id"]
    assert "sweep.num_samples" in parent.data.params
    # A few params to filter by; every setting in one artifact.
    assert len(parent.data.params) <= 16 and "scheduler.grace_period" not in parent.data.params
    config_file = mlflow.artifacts.download_artifacts(
        run_id=parent.info.run_id, artifact_path="config/pipeline_config.json", tracking_uri=run.tracking_uri
    )
    with open(config_file) as f:
        assert json.load(f)["scheduler.grace_period"] == 2
    assert parent.data.metrics["test_accuracy"] >= 0.90
    parent_artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "evaluation")}
    assert "evaluation/confusion_matrix.png" in parent_artifacts
    assert client.list_artifacts(parent.info.run_id, "leaderboard")
    report = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert report == {"report/sweep_report.html"}, report  # one interactive page: its plots are drawn by its script


def test_one_child_run_per_trial_with_params_metrics_status_and_checkpoints(run):
    # One nested child run per trial, with params, per-epoch metrics, a status and checkpoints in its artifacts.
    client, summary, children = run.client, run.summary, run.children
    assert len(children) == 3
    summary_by_run = {t["run_id"]: t for t in summary["trials"]}
    for child in children:
        assert {"l1", "l2", "lr", "batch_size"} <= set(child.data.params)
        assert child.info.status == "FINISHED"  # stopped early by ASHA is a normal end, not a red "Killed"
        history = client.get_metric_history(child.info.run_id, "val_loss")
        assert [m.step for m in history] == list(range(1, len(history) + 1))
        # The trial's summary, sortable in the runs table: best value of the selection metric and its epoch.
        best = summary_by_run[child.info.run_id]
        assert child.data.metrics["best_val_accuracy"] == pytest.approx(best["best"])
        assert child.data.metrics["best_epoch"] == best["best_epoch"]
        assert child.data.metrics["epochs_run"] == len(history)
        outcome = child.data.tags["sweepflow.outcome"]
        if child.data.tags["sweepflow.status"] == "STOPPED":
            assert outcome == f"stopped early (ASHA) at epoch {len(history)}"
        else:
            assert outcome == "completed"
        checkpoints = client.list_artifacts(child.info.run_id, "checkpoints")
        assert checkpoints and all(c.path.startswith("checkpoints/checkpoint_") for c in checkpoints)
    assert len(summary["leaderboard"]) == 3


def test_a_trial_starts_only_once_the_one_before_gave_its_slot_back(run):
    # Time is honest (one trial at a time: 2 ranks on 2 workers): a trial's MLflow run and its Prefect task run
    # start only once the trial before it gave its slot back at its final report, never while it waits.
    from prefect.client.orchestration import get_client

    client, children = run.client, run.children
    by_index = sorted(children, key=lambda c: int(c.data.tags["sweepflow.trial_index"]))
    with get_client(sync_client=True) as prefect:
        task_started = {
            c.info.run_id: final_task_run(prefect, c.data.tags["prefect.task_run_id"]).start_time.timestamp()
            for c in children
        }
    for before, after in zip(by_index, by_index[1:], strict=False):
        final_report_ms = max(m.timestamp for m in client.get_metric_history(before.info.run_id, "val_loss"))
        assert after.info.start_time >= final_report_ms, (before.data.tags, after.info)
        assert task_started[after.info.run_id] * 1000 >= final_report_ms - 50  # 50 ms: clock rounding
        # Its wait is on record: at least as long as the trial before it trained (tags are rounded to 0.1 s).
        trained_s = (final_report_ms - before.info.start_time) / 1000
        assert float(after.data.tags["sweepflow.queued_s"]) >= trained_s - 0.1, (trained_s, after.data.tags)
    assert float(by_index[0].data.tags["sweepflow.queued_s"]) < 0.5


def test_runs_link_their_prefect_runs_and_the_winner_its_version(run):
    # Links both ways: the parent run's description links its Prefect flow run, each trial's run its Prefect
    # task run; the winner is tagged and its description links the registered version.
    client, parent, children = run.client, run.parent, run.children
    assert "Prefect flow run: [" in parent.data.tags["mlflow.note.content"]
    assert (
        "/runs/flow-run/" + parent.data.tags["prefect.flow_run_id"] in parent.data.tags["mlflow.note.content"]
    )
    for child in children:
        task_run_id = child.data.tags["prefect.task_run_id"]
        assert f"/runs/task-run/{task_run_id})" in child.data.tags["mlflow.note.content"]
    winners = [c for c in children if c.data.tags.get("sweepflow.winner") == "true"]
    assert [w.info.run_id for w in winners] == [run.summary["best_trial"]["run_id"]]
    winner = client.get_run(winners[0].info.run_id)
    assert "#/models/digits-e2e/versions/1?workflowType=machine_learning)" in winner.data.tags["mlflow.note.content"]


def test_every_trial_of_a_second_or_more_has_system_metrics(run):
    # System metrics, from each trial's rank 0 while it trained: every trial of a second or more has them, with
    # the CPU its ranks' process used. Not the latest sample's alone: it covers the trial's end, where rank 0 may
    # have sat idle for a tenth of a second waiting for the sweep's verdict on its last report (0 %, as CI saw).
    client, children = run.client, run.children
    longest = max(children, key=lambda c: c.data.metrics["group_seconds"])
    for child in children:
        if child is longest or float(child.data.tags["sweepflow.train_time_s"]) >= 1.0:
            cpu = client.get_metric_history(child.info.run_id, "system/process_cpu_percentage")
            assert max(m.value for m in cpu) > 0, (sorted(child.data.metrics), [m.value for m in cpu])
            assert "system/cpu_utilization_percentage" in child.data.metrics
            assert "system/system_memory_usage_megabytes" in child.data.metrics
            steps = [m.step for m in client.get_metric_history(child.info.run_id, "system/cpu_utilization_percentage")]
            assert sorted(steps) == list(range(len(steps))), steps
        # MLflow's compare view opens its plot on the metric a run logged first: the trial's own, never a sample.
        assert not list(client.get_run(child.info.run_id).data.metrics)[0].startswith("system/")


def test_prefect_artifacts_link_each_trial_and_publish_the_leaderboard_once(run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterTaskRunId,
    )

    parent, children, mlflow_server = run.parent, run.children, run.tracking_uri
    task_runs = [c.data.tags["prefect.task_run_id"] for c in children]
    with get_client(sync_client=True) as prefect:
        links = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(task_run_id=ArtifactFilterTaskRunId(any_=task_runs))
        )
        board = [
            a
            for a in prefect.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[parent.data.tags["prefect.flow_run_id"]])
                )
            )
            if a.key == "sweep-leaderboard"
        ]
        # Independent trials: no dependency between their task runs (Prefect draws one as an arrow).
        for task_run_id in task_runs:
            inputs = prefect.read_task_run(task_run_id).task_inputs
            assert not [i for values in inputs.values() for i in values], inputs
    # One link artifact per trial task run (Prefect 3 stores it as markdown: "[text](url)"), titled (keyed) with
    # the trial, its description's first line the result, best value first; the trial's MLflow description leads
    # with the same outcome.
    assert len(links) == 3 and all(f"]({mlflow_server}/#/experiments/" in str(a.data) for a in links), links
    by_task_run = {str(a.task_run_id): a for a in links}
    for child in children:
        artifact = by_task_run[child.data.tags["prefect.task_run_id"]]
        assert f"/runs/{child.info.run_id}?" in str(artifact.data), artifact.data
        name = child.data.tags["sweepflow.trial_name"]
        assert artifact.key == name.split("-", 1)[0].replace("_", "-"), (artifact.key, name)
        first, rest = artifact.description.split("\n\n", 1)
        assert first.startswith("**val_accuracy ") and child.data.tags["sweepflow.outcome"] in first, first
        assert rest == name
        outcome = f"**Outcome:** {name}: {child.data.tags['sweepflow.outcome']}; best val_accuracy"
        assert outcome in child.data.tags["mlflow.note.content"]  # the winner's adds its version
    # Published once, with the best trial and the registered version (one version in the Artifacts tab).
    assert len(board) == 1, board
    latest = max(board, key=lambda a: a.created).data
    assert "best first by best_val_accuracy (higher is better)" in latest
    assert f"({mlflow_server}/#/models/digits-e2e/versions/1?workflowType=machine_learning)" in latest
    assert f"/runs/{run.summary['best_trial']['run_id']}?workflowType=machine_learning)" in latest


def test_resources_are_accounted_per_trial_on_the_parent_and_the_leaderboard(run):
    # Resource accounting: 2 ranks per trial; each child run, the parent and the leaderboard carry it.
    summary, parent, children = run.summary, run.parent, run.children
    for child in children:
        assert child.data.metrics["worker_seconds"] == pytest.approx(
            2 * child.data.metrics["group_seconds"], abs=1e-3
        )
        assert child.data.metrics["gpu_seconds"] == 0
    assert parent.data.metrics["worker_seconds"] == pytest.approx(
        sum(c.data.metrics["worker_seconds"] for c in children), abs=1e-2
    )
    assert summary["usage"]["worker_seconds"] == pytest.approx(
        parent.data.metrics["worker_seconds"], abs=1e-3
    )
    # Workers' one-time start-up (0 on the session's warm cluster) is stated apart, in no trial's worker-seconds.
    assert parent.data.metrics["startup_seconds"] == pytest.approx(summary["usage"]["startup_seconds"], abs=1e-3)
    assert all(row["worker_s"] > 0 for row in summary["leaderboard"])


def test_the_registered_model_loads_knowing_only_the_tracking_uri(run):
    # The registered model loads from a process that knows only the tracking URI. (Scoped: set_tracking_uri also
    # writes MLFLOW_TRACKING_URI into the environment, where a later test on this worker would find it.)
    import numpy as np

    with tracking_uri_scope(run.tracking_uri):
        model = mlflow.pyfunc.load_model("models:/digits-e2e@champion")
    assert model.predict(np.zeros((5, 1, 8, 8), dtype=np.float32)).shape[0] == 5


def test_a_worse_retraining_is_a_new_challenger_and_the_champion_stays(run):
    # Scheduled retraining with a worse budget: a new challenger, the champion stays.
    assert run.second["registration"]["version"] == 2 and not run.second["registration"]["became_champion"]
    assert run.client.get_model_version_by_alias("digits-e2e", "champion").version == "1"
    assert run.client.get_model_version_by_alias("digits-e2e", "challenger").version == "2"


def _scripted_sweep(
    tmp_path, cluster, *, qualities, epochs, scheduler, train_fn="pipeline_helpers:scripted_quality", **sweep
) -> PipelineConfig:
    """One trial at a time (unless ``sweep`` says otherwise) over a grid of scripted trials
    (pipeline_helpers.scripted_quality), 1 rank each."""
    return resolve_settings(
        _config(
            tmp_path,
            cluster,
            sqlite_store(tmp_path),
            sweep={
                "search_space": {"quality": {"type": "grid", "values": qualities}},
                "num_samples": 1,
                "max_concurrent_trials": 1,
                **sweep,
            },
            training={"train_fn": train_fn, "epochs": epochs},
            scheduler=scheduler,
            resources={"ranks_per_trial": 1},
        )
    )


def test_asha_stops_worse_trials_mid_run(prefect_harness, cluster, tmp_path):
    """One trial at a time, so the rung decisions are fixed: trial 0 (best) runs to max_t; each later, worse
    trial reaches rung 1 behind a better recorded value and is stopped after its first report."""
    cfg = _scripted_sweep(
        tmp_path,
        cluster,
        qualities=[1, 2, 3],
        epochs=4,
        scheduler={"metric": "val_loss", "mode": "min", "max_t": 4, "grace_period": 1, "reduction_factor": 2},
    )
    prepared = prepare_dataset(DataConfig(name="digits", cache_dir=str(tmp_path / "data")))
    tracker = RunTracker(cfg.mlflow.tracking_uri, "asha", artifact_root=str(tmp_path / "artifacts"))

    @flow
    def sweep_only():
        parent = tracker.start_run("asha-parent")
        return sweep_of(cfg, prepared, cluster, tracker, parent).run()

    sweep = sweep_only()
    results = {r.config["quality"]: r for r in sweep.trials}
    assert results[1].status == "COMPLETED" and results[1].epochs == 4
    for quality in (2, 3):
        assert results[quality].status == "STOPPED" and results[quality].epochs == 1
        run = tracker.client.get_run(results[quality].run_id)
        assert run.info.status == "FINISHED" and run.data.tags["sweepflow.stop_reason"] == "ASHA"

    # Resource accounting: 1 rank, no GPU; the stopped trials saved their 3 remaining epochs at their own pace.
    for result in sweep.trials:
        assert result.usage.ranks == 1 and result.usage.group_seconds >= result.train_time_s > 0
        assert result.usage.worker_seconds == pytest.approx(result.usage.group_seconds)
        assert result.usage.gpu_seconds == 0
    assert results[1].usage.saved_worker_seconds == 0
    for quality in (2, 3):
        assert results[quality].usage.saved_epochs == 3
        assert results[quality].usage.saved_worker_seconds == pytest.approx(
            3 * results[quality].train_time_s, rel=1e-3
        )
    totals = sweep.usage()
    assert totals["worker_seconds"] == pytest.approx(
        sum(r.usage.worker_seconds for r in sweep.trials), abs=1e-3
    )
    assert totals["saved_worker_seconds"] > 0
    assert sweep.best().trial_id == results[1].trial_id and sweep.best().best == 1.0

    # Each trial's state can be rebuilt from its MLflow child run alone (what resuming a sweep builds on).
    for result in sweep.trials:
        rebuilt = TrialResult.from_mlflow(tracker.client, result.run_id, metric="val_accuracy", mode="max")
        assert rebuilt.status is result.status and isinstance(rebuilt.status, TrialStatus)
        assert (rebuilt.trial_id, rebuilt.index, rebuilt.config) == (
            result.trial_id,
            result.index,
            result.config,
        )
        assert (rebuilt.epochs, rebuilt.best, rebuilt.best_epoch) == (
            result.epochs,
            result.best,
            result.best_epoch,
        )
        assert rebuilt.best_checkpoint == result.best_checkpoint
        assert rebuilt.usage.saved_epochs == result.usage.saved_epochs
        assert rebuilt.usage.worker_seconds == pytest.approx(result.usage.worker_seconds, abs=1e-3)
        metrics = tracker.client.get_run(result.run_id).data.metrics
        assert metrics["worker_seconds"] == pytest.approx(result.usage.worker_seconds, abs=1e-3)


def _sweep_only(cfg, cluster, tmp_path, name):
    prepared = prepare_dataset(DataConfig(name="digits", cache_dir=str(tmp_path / "data")))
    tracker = RunTracker(cfg.mlflow.tracking_uri, name, artifact_root=str(tmp_path / "artifacts"))

    @flow
    def sweep_only():
        return sweep_of(cfg, prepared, cluster, tracker, tracker.start_run(f"{name}-parent")).run()

    return tracker, sweep_only()


def test_the_pipeline_runs_the_tune_faces_median_stopping_rule(prefect_harness, cluster, tmp_path):
    """`scheduler.type: median_stopping` is Tune's MedianStoppingRule: one trial at a time, each later, worse
    trial is behind the median of the others after its first report and is stopped there."""
    cfg = _scripted_sweep(
        tmp_path, cluster, qualities=[1, 2, 3], epochs=4,
        scheduler={"type": "median_stopping", "metric": "val_loss", "grace_period": 1, "min_samples_required": 1},
    )
    assert isinstance(cfg.scheduler.build(), tune_schedulers.MedianStoppingRule)
    tracker, sweep = _sweep_only(cfg, cluster, tmp_path, "median")
    results = {r.config["quality"]: r for r in sweep.trials}
    assert results[1].status == "COMPLETED" and results[1].epochs == 4
    for quality in (2, 3):
        assert results[quality].status == "STOPPED" and results[quality].epochs == 1
        tags = tracker.client.get_run(results[quality].run_id).data.tags
        assert tags["sweepflow.stop_reason"] == "median stopping rule"


def test_the_pipeline_runs_the_tune_faces_hyperband_pausing_and_resuming_trials(prefect_harness, cluster, tmp_path):
    """`scheduler.type: hyperband` is Tune's HyperBandScheduler (max_t 4, eta 2: brackets of 3 trials): the first
    bracket runs its trials to max_t, as in Ray; in the second, two trials at a time pause at the milestone
    (report 2) until the third gets there, the better ceil(3/2) resume from their checkpoints to max_t, the third
    stops."""
    cfg = _scripted_sweep(
        tmp_path, cluster, qualities=[5, 6, 4, 3, 1, 2], epochs=4, max_concurrent_trials=2,
        train_fn="pipeline_helpers:checkpointed_quality",
        scheduler={"type": "hyperband", "metric": "val_loss", "max_t": 4, "reduction_factor": 2},
    )
    assert isinstance(cfg.scheduler.build(), tune_schedulers.HyperBandScheduler)
    tracker, sweep = _sweep_only(cfg, cluster, tmp_path, "hyperband")
    seen = {r.config["quality"]: (r.status, r.epochs) for r in sweep.trials}
    assert seen == {
        5: ("COMPLETED", 4), 6: ("COMPLETED", 4), 4: ("COMPLETED", 4),
        1: ("COMPLETED", 4), 2: ("COMPLETED", 4), 3: ("STOPPED", 2),
    }, seen
    for result in sweep.trials:
        if result.status == "STOPPED":
            assert tracker.client.get_run(result.run_id).data.tags["sweepflow.stop_reason"] == "HyperBand"
    assert sweep.best().config["quality"] == 1


def test_the_pipeline_runs_the_tune_faces_pbt_the_worse_trial_continuing_from_the_better(
    prefect_harness, cluster, tmp_path
):
    """`scheduler.type: pbt` is Tune's PopulationBasedTraining with the mutations written as data: at report 2
    the worse of two trials copies the better one's checkpoint and config, then perturbs it (a neighbour in the
    list), and reports the better value from there on."""
    cfg = _scripted_sweep(
        tmp_path, cluster, qualities=[1, 4], epochs=6, max_concurrent_trials=2,
        train_fn="pipeline_helpers:checkpointed_quality",
        scheduler={
            "type": "pbt", "metric": "val_loss", "perturbation_interval": 2, "quantile_fraction": 0.5,
            "resample_probability": 0, "synch": True, "hyperparam_mutations": {"quality": [1, 2, 3, 4]},
        },
    )
    assert isinstance(cfg.scheduler.build(), tune_schedulers.PopulationBasedTraining)
    tracker, sweep = _sweep_only(cfg, cluster, tmp_path, "pbt")
    started = {r.config_history[0]["config"]["quality"] if r.config_history else r.config["quality"]: r for r in sweep.trials}
    worse, better = started[4], started[1]
    # Its first exploit is at the first sync point, from the better trial (later ones, between two trials that
    # then score alike, may go either way).
    first = worse.config_history[1]
    assert (first["iteration"], first["donor"]) == (2, better.trial_id), worse.config_history
    assert first["config"]["quality"] in (1, 2)  # the donor's 1, perturbed to a neighbour in the list
    assert int(tracker.client.get_run(worse.run_id).data.tags["sweepflow.pbt.exploits"]) >= 1
    history = sorted(tracker.client.get_metric_history(worse.run_id, "val_loss"), key=lambda m: m.step)
    assert [m.value for m in history][:2] == [4.0, 4.0] and history[-1].value < 4.0
    assert worse.epochs == 6


def test_the_pipeline_runs_a_teams_own_searcher_named_by_import_path(prefect_harness, cluster, tmp_path):
    """`sweep.sampler: package.module:Class` is a Searcher subclass (Ray Tune's API) made with
    `sweep.sampler_options`: its suggestions are the trials' configs, each end reaches its on_trial_complete
    (the third trial repeats the best of the first two), and the sweep's log names it."""
    cfg = _scripted_sweep(
        tmp_path, cluster, qualities=[1], epochs=2, scheduler={"type": "fifo"},
        search_space={"quality": {"type": "choice", "values": [1, 2, 3]}}, num_samples=3,
        sampler="pipeline_helpers:BestAgainSearcher", sampler_options={"first": [3, 1]},
    )
    sampler, label = pipeline_sampler(cfg)
    assert label == "pipeline_helpers:BestAgainSearcher (searcher)" and (sampler.searcher.metric, sampler.searcher.mode) == ("val_accuracy", "max")
    tracker, sweep = _sweep_only(cfg, cluster, tmp_path, "own-searcher")
    trials = sorted(sweep.trials, key=lambda r: r.index)
    assert [r.config["quality"] for r in trials] == [3, 1, 1]
    assert [tracker.client.get_run(r.run_id).data.params["quality"] for r in trials] == ["3", "1", "1"]


def test_a_searcher_path_that_is_no_searcher_or_refuses_its_options_fails_before_work(tmp_path):
    from sweepflow.tasks.checks import PreflightError

    def config(**sweep):
        return PipelineConfig.model_validate({"sweep": {"search_space": {"lr": {"type": "uniform", "low": 0,
                                                                                "high": 1}}, **sweep}})

    with pytest.raises(PreflightError, match=r"sweep.sampler='json:dumps': is function .* not a Searcher class"):
        pipeline_sampler(config(sampler="json:dumps"))
    with pytest.raises(PreflightError, match=r"sweep.sampler_options=\{'bogus': 1\}: .*refused them: .*bogus"):
        pipeline_sampler(config(sampler="pipeline_helpers:BestAgainSearcher", sampler_options={"bogus": 1}))
    with pytest.raises(PreflightError, match=r"differ"):
        pipeline_sampler(config(sampler="pipeline_helpers:BestAgainSearcher",
                                sampler_options={"first": [0.1], "metric": "loss", "mode": "min"}))
    with pytest.raises(ValueError, match=r"sampler_options are the keyword arguments of a Searcher class"):
        config(sampler="tpe", sampler_options={"first": [1]})
    with pytest.raises(ValueError, match=r"use 'random', 'grid' or 'tpe', or a Searcher subclass's import path"):
        config(sampler="bayes")
    with pytest.raises(ValueError, match=r"\(a Searcher\) cannot search grid parameters \['bs'\]"):
        PipelineConfig.model_validate({"sweep": {"sampler": "a.b:C", "search_space": {"bs": {"type": "grid",
                                                                                               "values": [1, 2]}}}})


def test_synchronous_pbt_that_cannot_run_its_population_at_once_is_refused_before_work(cluster, tmp_path):
    from sweepflow.flows.preflight import check_pipeline

    cfg = _scripted_sweep(
        tmp_path, cluster, qualities=[1, 2, 3], epochs=4, max_concurrent_trials=None,
        scheduler={"type": "pbt", "synch": True, "hyperparam_mutations": {"quality": [1, 2, 3]}},
    )
    with pytest.raises(ValueError, match=r"waits for all 3 trials .* only 2 can run at once"):
        check_pipeline(cfg, imports=False)


def test_invalid_config_fails_before_any_work_with_the_field_and_reason():
    with pytest.raises(ValueError, match="ranks_per_trial"):
        PipelineConfig.model_validate({"resources": {"ranks_per_trial": 2, "gpus_per_rank": 0.5}})
    with pytest.raises(ValueError, match="loguniform"):
        PipelineConfig.model_validate(
            {"sweep": {"search_space": {"lr": {"type": "loguniform", "low": 0, "high": 1}}}}
        )
    with pytest.raises(ValueError, match="max_t"):
        PipelineConfig.model_validate({"scheduler": {"max_t": 10}, "training": {"epochs": 2}})
    with pytest.raises(ValueError, match="max_t"):
        PipelineConfig.model_validate({"scheduler": {"type": "hyperband", "max_t": 10}, "training": {"epochs": 2}})
    with pytest.raises(ValueError, match="scheduler.type must be one of asha, fifo, hyperband, median_stopping, pbt"):
        PipelineConfig.model_validate({"scheduler": {"type": "bohb"}})
    with pytest.raises(ValueError, match="hyperparam_mutations"):
        PipelineConfig.model_validate({"scheduler": {"type": "pbt"}})
    with pytest.raises(ValueError, match=r"hyperparam_mutations.lr: a constant cannot be mutated"):
        PipelineConfig.model_validate({"scheduler": {"type": "pbt", "hyperparam_mutations": {"lr": {"type": "constant", "value": 1}}}})
    with pytest.raises(ValueError, match="fifo.max_t"):  # a setting the chosen scheduler does not have
        PipelineConfig.model_validate({"scheduler": {"type": "fifo", "max_t": 2}})
    assert os.path.isabs(resolve_settings(PipelineConfig()).state_dir)


def test_the_time_budget_stops_the_running_trial_and_starts_no_other(prefect_harness, cluster, tmp_path):
    """One trial at a time, a budget shorter than a trial: the running trial is stopped at its first report
    past the budget, the trials behind it never start (no MLflow run and no Prefect task run for them: a trial
    is submitted only when it has a slot), and the sweep returns what ran."""
    cfg = _scripted_sweep(
        tmp_path,
        cluster,
        qualities=[1, 2, 3, 4],
        epochs=400,
        scheduler={"type": "fifo"},
        time_budget_s=1.0,
    )
    prepared = prepare_dataset(DataConfig(name="digits", cache_dir=str(tmp_path / "data")))
    tracker = RunTracker(cfg.mlflow.tracking_uri, "budget", artifact_root=str(tmp_path / "artifacts"))

    @flow
    def sweep_only():
        parent = tracker.start_run("budget-parent")
        return parent, sweep_of(cfg, prepared, cluster, tracker, parent).run()

    parent, sweep = sweep_only()
    results = sweep.trials
    assert [r.config["quality"] for r in results] == [1]
    assert results[0].status == "STOPPED" and 1 <= results[0].epochs < 400
    assert sweep.not_started == 3
    children = tracker.client.search_runs(
        [tracker.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent}'",
        run_view_type=3,  # ALL: active and deleted
    )
    by_stage = {}
    for child in children:
        by_stage.setdefault(child.info.lifecycle_stage, []).append(child.data.tags["sweepflow.trial_id"])
    assert by_stage == {"active": ["trial_0000"]}
