"""Ray Tune's file loggers (``sweepflow.tune.logger``'s ``CSVLoggerCallback``, ``JsonLoggerCallback``,
``TBXLoggerCallback``): Ray's files in each trial's directory, read back as Ray users read them (``csv``, ``json``,
TensorBoard's own event reader), first driven hook by hook, then in a real ``tune.run`` beside MLflow."""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import pickle
import sys

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from sweepflow import tune
from sweepflow.tasks.sweep.results import TrialResult, TrialStatus
from sweepflow.tune.analysis import Trial
from sweepflow.tune.file_loggers import experiment_logs_dir
from sweepflow.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback


def _trial(tmp_path, index=0, config=None) -> Trial:
    result = TrialResult(
        trial_id=f"trial_{index:04d}", index=index, name=f"t{index}", config=config or {"lr": 0.1, "opt": {"b": 2}},
        status=TrialStatus.NOT_STARTED,
    )
    return Trial(result, local_path=str(tmp_path / f"trial_{index:04d}"))


def _report(step, **metrics):
    return {"training_iteration": step, "time_total_s": 0.1 * step, "config": {"lr": 0.1}, **metrics}


def _events(directory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(directory)
    accumulator.Reload()
    return accumulator


def test_csv_logger_writes_one_row_per_report_with_flattened_columns_and_appends_when_resumed(tmp_path):
    trial, logger = _trial(tmp_path), CSVLoggerCallback()
    logger.log_trial_start(trial)
    logger.log_trial_result(1, trial, _report(1, loss=0.5, extra={"a": 1}))
    logger.log_trial_result(2, trial, _report(2, loss=0.4, extra={"a": 2}, later=7))  # a new key: not written
    logger.log_trial_end(trial)
    again = CSVLoggerCallback()  # a resumed experiment: the same trial's file goes on, with no second header
    again.log_trial_start(trial)
    again.log_trial_result(3, trial, _report(3, loss=0.3, extra={"a": 3}))
    again.log_trial_end(trial)
    with open(os.path.join(trial.local_path, "progress.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["training_iteration"] for r in rows] == ["1", "2", "3"]
    assert [float(r["loss"]) for r in rows] == [0.5, 0.4, 0.3]
    assert [r["extra/a"] for r in rows] == ["1", "2", "3"] and "config" not in rows[0] and "later" not in rows[0]


def test_json_logger_writes_a_line_per_report_and_the_config_as_json_and_pickle(tmp_path):
    trial = _trial(tmp_path, config={"lr": np.float64(0.1), "layers": [64, 32]})
    logger = JsonLoggerCallback()
    logger.log_trial_start(trial)
    logger.log_trial_result(1, trial, _report(1, loss=np.float32(0.5), weights=np.arange(3)))
    logger.log_trial_result(2, trial, _report(2, loss=0.25, note=object()))
    logger.on_experiment_end([trial])  # closes what is open
    with open(os.path.join(trial.local_path, "result.json")) as f:
        lines = [json.loads(line) for line in f]
    assert [line["loss"] for line in lines] == [0.5, 0.25] and lines[0]["weights"] == [0, 1, 2]
    assert lines[1]["note"].startswith("<object object") and lines[0]["config"] == {"lr": 0.1}
    with open(os.path.join(trial.local_path, "params.json")) as f:
        assert json.load(f) == {"layers": [64, 32], "lr": 0.1}
    with open(os.path.join(trial.local_path, "params.pkl"), "rb") as f:
        assert pickle.load(f) == {"lr": 0.1, "layers": [64, 32]}


def test_tbx_logger_files_are_read_by_tensorboards_own_reader(tmp_path):
    trial, logger = _trial(tmp_path), TBXLoggerCallback()
    logger.log_trial_start(trial)
    for step in (1, 2, 3):
        logger.log_trial_result(step, trial, _report(step, loss=1 / step, acc=step / 4, skipped=math.nan,
                                                     nested={"x": step}, flag=True, grads=[0.1, 0.2, 0.3]))
    logger.log_trial_end(trial)
    events = _events(trial.local_path)
    scalars = events.Tags()["scalars"]
    assert {"ray/tune/loss", "ray/tune/acc", "ray/tune/nested/x"} <= set(scalars)
    # bookkeeping keys, NaNs and booleans are no scalars (as in Ray)
    assert not {"ray/tune/training_iteration", "ray/tune/time_total_s", "ray/tune/skipped", "ray/tune/flag"} & set(
        scalars
    )
    loss = events.Scalars("ray/tune/loss")
    assert [e.step for e in loss] == [1, 2, 3] and [round(e.value, 4) for e in loss] == [1.0, 0.5, 0.3333]
    assert "ray/tune/grads" in events.Tags()["histograms"]
    # the trial's hyperparameters (flattened) for TensorBoard's HParams tab, as its hparams plugin reads them
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert {k: v.number_value for k, v in start.hparams.items()} == {"lr": 0.1, "opt/b": 2.0}


def test_tbx_logger_without_tensorboardx_is_one_sentence_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # not installed
    with pytest.raises(ImportError, match=r"pip install 'sweepflow\[tensorboard\]'"):
        TBXLoggerCallback()


def test_a_trial_without_a_directory_is_refused(tmp_path):
    trial = Trial(TrialResult(trial_id="trial_0000", index=0, name="t", config={}, status=TrialStatus.NOT_STARTED))
    with pytest.raises(ValueError, match="trial_0000 has no local directory"):
        CSVLoggerCallback().log_trial_start(trial)


def test_the_trials_directories_are_the_experiments_path_on_this_machine_else_under_home(tmp_path):
    home = str(tmp_path / "home")
    assert experiment_logs_dir(str(tmp_path / "exp"), home, "exp") == str(tmp_path / "exp")
    assert experiment_logs_dir(f"file://{tmp_path}/exp", home, "exp") == str(tmp_path / "exp")
    assert experiment_logs_dir("s3://bucket/exps/exp", home, "exp") == os.path.join(home, "tune", "exp")


def test_rays_legacy_logger_classes_stay_refused_with_the_fix():
    with pytest.raises(ImportError, match=r"^ray.tune.logger.CSVLogger: .*LoggerCallback"):
        from sweepflow.tune.logger import CSVLogger  # noqa: F401


# -------------------------------------------------------------------------------------- a real run, as users write


def reporting(config):
    for step in range(3):
        tune.report(loss=config["lr"] * (3 - step), nested={"lr": config["lr"]})


class SeenDirectories(tune.Callback):
    def __init__(self):
        self.local_paths = {}

    def on_trial_start(self, iteration, trials, trial, **info):
        self.local_paths[trial.trial_id] = trial.local_path


def test_tune_run_with_the_three_loggers_writes_each_trials_files_beside_its_mlflow_run(services, tmp_path):
    seen = SeenDirectories()
    analysis = tune.run(
        reporting,
        config={"lr": tune.grid_search([0.1, 0.2])},
        callbacks=[CSVLoggerCallback(), JsonLoggerCallback(), TBXLoggerCallback(), seen],
        storage_path=str(tmp_path / "results"),
        name="logged",
        verbose=0,
    )
    trials = sorted(analysis.trials, key=lambda t: t.trial_id)
    assert len(trials) == 2
    client = MlflowClient(services["mlflow"])
    for trial in trials:
        directory = tmp_path / "results" / "logged" / trial.trial_id
        assert seen.local_paths[trial.trial_id] == str(directory)  # the loggers' trial.local_path
        with open(directory / "progress.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert [float(r["loss"]) for r in rows] == pytest.approx([trial.config["lr"] * k for k in (3, 2, 1)])
        assert all(r["trial_id"] == trial.trial_id for r in rows) and float(rows[0]["nested/lr"]) == trial.config["lr"]
        with open(directory / "params.json") as f:
            assert json.load(f) == trial.config
        with open(directory / "result.json") as f:
            assert len(f.readlines()) == 3
        assert glob.glob(str(directory / "events.out.tfevents.*"))
        assert [e.step for e in _events(str(directory)).Scalars("ray/tune/loss")] == [1, 2, 3]
        # MLflow records the trial all the same: the loggers are beside it, never instead of it
        history = client.get_metric_history(trial.mlflow_run_id, "loss")
        assert [m.value for m in history] == pytest.approx([float(r["loss"]) for r in rows])
