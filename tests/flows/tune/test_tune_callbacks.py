"""A Ray Tune user's callbacks and MLflow integration, as their scripts write them: ``tune.Callback`` hooks (in this
process, in order, with Ray's trial objects), ``LoggerCallback``, ``MLflowLoggerCallback`` shaping the trials' own
MLflow runs (no second run per trial), ``setup_mlflow`` inside the trainable (its metrics land in the trial's run),
and ``trial_name_creator`` / ``trial_dirname_creator``. Against the session's Dask cluster, MLflow server and Prefect
API (``services``), like tests/flows/tune/test_tune.py."""

from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import replace

import pytest
from mlflow.tracking import MlflowClient
from prefect_records import final_task_runs

from sweepflow import tune
from sweepflow.air.integrations.mlflow import MLflowLoggerCallback, setup_mlflow
from sweepflow.tune.callback import CallbackError, check_callbacks, recording
from sweepflow.tune.logger import LoggerCallback
from sweepflow.tune.result import SHOULD_CHECKPOINT

REPORTS = 3


def mlflow_trainable(config):
    """Three reports; q=3 fails at its second. Logs an extra metric through setup_mlflow's module."""
    mlflow = setup_mlflow(config, tags={"logged_by": "setup_mlflow"})
    for step in range(1, REPORTS + 1):
        if config["q"] == 3.0 and step == 2:
            raise RuntimeError("q=3 fails at its second report")
        mlflow.log_metric("inner", config["q"] * step, step=step)
        tune.report(loss=config["q"] / step)


def quick_trainable(config):
    for step in range(1, REPORTS + 1):
        tune.report(loss=config["q"] / step)


class Recorder(tune.Callback):
    """Every hook call, with what the hook saw, and which process and thread called it."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.steps: list[tuple[str, int]] = []
        self.callers: set[tuple[int, str]] = set()

    def _seen(self, *event) -> None:
        self.callers.add((os.getpid(), threading.current_thread().name))
        self.events.append(event)

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self._seen("setup", num_samples, total_num_samples)

    def on_step_begin(self, iteration, trials, **info):
        self.steps.append(("begin", iteration))

    def on_step_end(self, iteration, trials, **info):
        self.steps.append(("end", iteration))

    def on_trial_start(self, iteration, trials, trial, **info):
        self._seen("start", trial.trial_id, str(trial), trial.status, dict(trial.config), trial in trials)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._seen("result", trial.trial_id, result["training_iteration"], result["loss"], result["config"],
                   trial.last_result is result, trial.status)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._seen("complete", trial.trial_id, trial.status, trial.last_result["training_iteration"])

    def on_trial_error(self, iteration, trials, trial, **info):
        self._seen("error", trial.trial_id, trial.status, trial.error_msg)

    def on_experiment_end(self, trials, **info):
        self._seen("end", [(t.trial_id, t.status) for t in trials])


class Logged(LoggerCallback):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log_trial_start(self, trial):
        self.calls.append(("start", trial.trial_id))

    def log_trial_result(self, iteration, trial, result):
        self.calls.append(("result", trial.trial_id, result["training_iteration"]))

    def log_trial_end(self, trial, failed=False):
        self.calls.append(("end", trial.trial_id, failed))


def test_callbacks_mlflow_logger_setup_mlflow_and_trial_names(services, tmp_path):
    recorder, logged = Recorder(), Logged()
    mlflow_experiment = f"callbacks-{uuid.uuid4().hex[:8]}"
    analysis = tune.run(
        mlflow_trainable,
        name="callbacks",
        config={"q": tune.grid_search([1.0, 2.0, 3.0])},
        metric="loss",
        mode="min",
        storage_path=str(tmp_path / "results"),
        callbacks=[recorder, logged, MLflowLoggerCallback(experiment_name=mlflow_experiment, tags={"team": "vision"})],
        # Braces: the name is the task run's name as it is (Prefect would take a string as a format string).
        trial_name_creator=lambda trial: f"{trial.trainable_name}-{trial.trial_id}-{{q={trial.config['q']:g}}}",
        trial_dirname_creator=lambda trial: f"dir_{trial.trial_id}",
        raise_on_failed_trial=False,
        verbose=0,
    )
    names = {"trial_0000": "mlflow_trainable-trial_0000-{q=1}", "trial_0001": "mlflow_trainable-trial_0001-{q=2}",
             "trial_0002": "mlflow_trainable-trial_0002-{q=3}"}

    # Hooks: in this process (never on a worker), setup first, the experiment's end last, each trial in order.
    assert {pid for pid, _ in recorder.callers} == {os.getpid()}
    assert recorder.events[0] == ("setup", 1, 3)
    assert recorder.events[-1] == ("end", [("trial_0000", "TERMINATED"), ("trial_0001", "TERMINATED"),
                                           ("trial_0002", "ERROR")])
    for trial_id, q in (("trial_0000", 1.0), ("trial_0001", 2.0), ("trial_0002", 3.0)):
        own = [e for e in recorder.events if len(e) > 1 and e[1] == trial_id]
        assert own[0] == ("start", trial_id, names[trial_id], "RUNNING", {"q": q}, True)
        results = [e for e in own if e[0] == "result"]
        reports = REPORTS if q != 3.0 else 1
        assert [(e[2], e[3]) for e in results] == [(i, pytest.approx(q / i)) for i in range(1, reports + 1)]
        assert all(e[4] == {"q": q} and e[5] is True and e[6] == "RUNNING" for e in results)
        if q != 3.0:
            assert own[-1] == ("complete", trial_id, "TERMINATED", REPORTS) and len(own) == 1 + reports + 1
        else:
            assert own[-1][:3] == ("error", trial_id, "ERROR") and "q=3 fails" in own[-1][3]
    begins = [i for kind, i in recorder.steps if kind == "begin"]
    assert begins == list(range(1, len(begins) + 1)) and recorder.steps[-1] == ("end", begins[-1])

    # LoggerCallback's hooks call its log_trial_* methods.
    assert ("start", "trial_0001") in logged.calls and ("result", "trial_0001", REPORTS) in logged.calls
    assert ("end", "trial_0001", False) in logged.calls and ("end", "trial_0002", True) in logged.calls

    # MLflowLoggerCallback: the trials' own runs, in its experiment, with its tags: one parent, one run per trial.
    client = MlflowClient(services["mlflow"])
    experiment = client.get_experiment_by_name(mlflow_experiment)
    assert experiment is not None and experiment.experiment_id == analysis.record.experiment_id
    runs = client.search_runs([experiment.experiment_id])
    children = {r.data.tags["sweepflow.trial_id"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert len(runs) == 4 and sorted(children) == sorted(names)
    for trial_id, run in children.items():
        # trial_name_creator names the MLflow run (and the Prefect task run); the directory name is recorded
        assert run.info.run_name == names[trial_id] and run.data.tags["sweepflow.trial_name"] == names[trial_id]
        assert run.data.tags["team"] == "vision" and run.data.tags["logged_by"] == "setup_mlflow"
        assert run.data.tags["sweepflow.trial_dirname"] == f"dir_{trial_id}"
        assert run.info.status == ("FAILED" if trial_id == "trial_0002" else "FINISHED")  # setup_mlflow ended nothing
    # setup_mlflow: mlflow.log_metric inside the trainable landed in the trial's own run.
    inner = client.get_metric_history(children["trial_0001"].info.run_id, "inner")
    assert [(m.step, m.value) for m in inner] == [(1, 2.0), (2, 4.0), (3, 6.0)]
    assert [m.value for m in client.get_metric_history(children["trial_0002"].info.run_id, "inner")] == [3.0]
    assert children["trial_0001"].data.params["q"] == "2.0"  # the sampled config, logged once (by the trial)
    assert [str(t) for t in analysis.trials] == [names[t] for t in sorted(names)]

    from prefect import get_client

    with get_client(sync_client=True) as prefect:
        task_runs = final_task_runs(prefect, analysis.record.prefect_flow_run_id, at_least=len(names))
    assert set(names.values()) <= {t.name for t in task_runs}  # the trials' task runs carry the names too


class Boom(tune.Callback):
    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] == 1:
            raise ValueError("cannot digest this result")


def test_a_raising_callback_fails_the_experiment_naming_it(services, tmp_path):
    tuner = tune.Tuner(
        quick_trainable,
        param_space={"q": tune.grid_search([1.0, 2.0])},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", max_concurrent_trials=1, trial_name_creator=lambda trial: f"boom-{trial.trial_id}"
        ),
        run_config=tune.RunConfig(name="boom", storage_path=str(tmp_path / "results"), callbacks=[Boom()], verbose=0),
    )
    with pytest.raises(CallbackError, match=r"callback Boom\.on_trial_result raised ValueError: cannot digest this "
                                             r"result for trial trial_0000; the experiment stopped") as caught:
        tuner.fit()
    assert isinstance(caught.value.__cause__, ValueError)
    client = MlflowClient(services["mlflow"])
    experiment = client.get_experiment_by_name("boom")
    runs = client.search_runs([experiment.experiment_id])
    trial_runs = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    # The running trial stopped at its next report; the next one never started (its turn came after the error).
    assert [r.info.run_name for r in trial_runs] == ["boom-trial_0000"]
    assert trial_runs[0].info.status == "KILLED"
    assert [r.info.status for r in runs if "mlflow.parentRunId" not in r.data.tags] == ["FAILED"]


def test_an_error_of_ours_inside_a_trial_fails_the_experiment_and_ends_its_run(services, tmp_path, monkeypatch):
    """Not a training failure but a bug of sweepflow's own, raised in a trial's task after it trained: the
    experiment fails with that error (it does not wait for ever on the trial's MLflow writer) and the trial's
    run ends FAILED."""
    import sweepflow.tasks.sweep.trial_groups as trial_groups

    def broken(self, fit, error):
        raise TypeError("an error of ours")

    monkeypatch.setattr(trial_groups.TrialGroups, "_result", broken)
    tuner = tune.Tuner(
        quick_trainable,
        param_space={"q": tune.grid_search([1.0])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="ours-broken", storage_path=str(tmp_path / "results"), verbose=0),
    )
    outcome: list[BaseException | None] = []

    def fit() -> None:
        try:
            tuner.fit()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - what fit raised is the test's subject
            outcome.append(exc)

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    thread.join(timeout=240)
    assert not thread.is_alive(), "fit() hangs after an error inside a trial's task"
    assert isinstance(outcome[0], TypeError) and "an error of ours" in str(outcome[0]), outcome
    client = MlflowClient(services["mlflow"])
    runs = client.search_runs([client.get_experiment_by_name("ours-broken").experiment_id])
    assert sorted(r.info.status for r in runs if "mlflow.parentRunId" in r.data.tags) == ["FAILED"]


# ---- checked before any work (no services)


def test_callback_settings_are_checked_before_any_work(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    one, other = MLflowLoggerCallback(experiment_name="a"), MLflowLoggerCallback(experiment_name="b")
    with pytest.raises(ValueError, match="different MLflow experiment_names"):
        recording([one, other], environment_tracking_uri=None)
    with pytest.raises(ValueError, match="MLFLOW_TRACKING_URI is 'http://127.0.0.1:2'"):
        recording([MLflowLoggerCallback("http://127.0.0.1:1")], environment_tracking_uri="http://127.0.0.1:2")
    with pytest.raises(ValueError, match="holds credentials") as caught:
        recording([MLflowLoggerCallback("http://user:secret@127.0.0.1:1")], environment_tracking_uri=None)
    assert "secret" not in str(caught.value)
    asked = recording([one, MLflowLoggerCallback(tags={"x": 1})], environment_tracking_uri=None)
    assert (asked.experiment_name, dict(asked.tags)) == ("a", {"x": "1"})
    with pytest.raises(TypeError, match=r"is a class; pass an instance: Recorder\(\)"):
        check_callbacks([Recorder], "tune.run")


class _Planned(Exception):
    pass


def test_trial_name_creators_are_checked_when_trials_are_named(monkeypatch):
    from sweepflow.tune._internal import runner

    planned = []

    def stop_before_work(experiment):
        planned.append(experiment)
        raise _Planned

    monkeypatch.setattr(runner, "run", stop_before_work)
    with pytest.raises(_Planned):
        tune.run(quick_trainable, config={"q": tune.grid_search([1.0, 2.0])}, trial_dirname_creator=lambda t: "same",
                 trial_name_creator=lambda t: 1 / 0, verbose=0)
    template = planned[0].template
    with pytest.raises(ValueError, match=r"trial_name_creator raised ZeroDivisionError: division by zero for trial "
                                         r"trial_0000 \(config \{'q': 1.0\}\)"):
        template.trial(0, {"q": 1.0})
    template = replace(template, name_trial=None)
    assert template.trial(0, {"q": 1.0}).dirname == "same"
    assert template.trial(0, {"q": 1.0}).dirname == "same"  # the same trial named again (PBT, a resume) is fine
    with pytest.raises(ValueError, match="returned 'same' for trials trial_0000 and trial_0001"):
        template.trial(1, {"q": 2.0})


def test_setup_mlflow_outside_a_trial_says_where_it_belongs():
    with pytest.raises(RuntimeError, match="call it inside the trainable that tune.run / Tuner.fit runs"):
        setup_mlflow({"q": 1})


def test_setup_mlflow_refuses_a_run_other_than_the_trials():
    from sweepflow.tasks.training.function import TrialRun, _inside_trial

    run = TrialRun(tracking_uri="http://127.0.0.1:1", experiment_id="7", experiment_name="exp", run_id="r1",
                   trial_id="trial_0000", run_name="trial_0000")
    with _inside_trial(run):  # as on a rank of trial_0000 (no request is made before the refusal)
        with pytest.raises(ValueError, match=r"setup_mlflow\(experiment_name='other'\): trial trial_0000 is recorded"):
            setup_mlflow({"q": 1}, experiment_name="other", rank_zero_only=False)
        with pytest.raises(ValueError, match="trial_name_creator"):
            setup_mlflow({"q": 1}, run_name="mine", rank_zero_only=False)
        with pytest.raises(ValueError, match="sweepflow's or MLflow's own tags"):
            setup_mlflow({"q": 1}, tags={"mlflow.runName": "x"}, rank_zero_only=False, tracking_uri="http://127.0.0.1:1/")


class StepTrainable(tune.Trainable):
    """Counts its steps; asks for a checkpoint of its step 4 itself; notes each save in config["saves"]."""

    def setup(self, config):
        self.i = 0

    def step(self):
        self.i += 1
        return {"loss": 1.0 / self.i, SHOULD_CHECKPOINT: self.i == 4}

    def save_checkpoint(self, checkpoint_dir):
        open(os.path.join(self.config["saves"], str(self.i)), "w").close()
        return {"i": self.i}

    def load_checkpoint(self, checkpoint):
        self.i = checkpoint["i"]


class CheckpointAt(tune.Callback):
    """Asks for a checkpoint of the results at these iterations (Ray 2.49+: set SHOULD_CHECKPOINT in the result)."""

    def __init__(self, *iterations: int) -> None:
        self.iterations = iterations

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] in self.iterations:
            result[SHOULD_CHECKPOINT] = True


def test_should_checkpoint_from_a_step_or_a_callback_checkpoints_that_step(services, tmp_path):
    """Ray's ``should_checkpoint`` (``sweepflow.tune.result.SHOULD_CHECKPOINT``), in a class trainable's step result
    or set by a callback's ``on_trial_result``, has that step saved: no periodic or end checkpoints here."""
    saves = tmp_path / "saves"
    saves.mkdir()
    grid = tune.Tuner(
        StepTrainable,
        param_space={"saves": str(saves)},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(
            name="should_checkpoint",
            stop={"training_iteration": 5},
            callbacks=[CheckpointAt(1, 3, 5)],  # 5: the step the trial stops at is saved before it stops
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0, checkpoint_at_end=False),
            verbose=0,
        ),
    ).fit()
    assert not grid.errors, grid.errors
    assert sorted(int(p.name) for p in saves.iterdir()) == [1, 3, 4, 5]
    result = grid[0]
    assert result.metrics["training_iteration"] == 5 and SHOULD_CHECKPOINT not in result.metrics
    with result.checkpoint.as_directory() as directory:  # the latest: step 5's, filed under its report
        with open(os.path.join(directory, "_sweepflow_trainable_meta.json")) as f:
            assert json.load(f) == {"iteration": 5}
