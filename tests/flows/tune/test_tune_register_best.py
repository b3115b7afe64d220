"""``tune.register_best`` lowers to the lifecycle's ``Finalize`` and runs the pipeline's one ``finalize`` in the
script's process: a grid over a real (local) MLflow store, a model from a checkpoint, the registry's aliases."""

from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient

from sweepflow import tune
from sweepflow.tasks.sweep.results import TrialResult, TrialStatus
from sweepflow.tune._internal.runner import ExperimentRecord
from sweepflow.tune.analysis import ResultGrid


def _model_fn(checkpoint):
    """A team's model_fn: the module alone."""
    model = torch.nn.Linear(3, 1)
    with checkpoint.as_directory() as path:
        model.load_state_dict(torch.load(f"{path}/model.pt"))
    return model


def _grid(tmp_path, accuracies: list[float], name: str = "register-best") -> tuple[ResultGrid, MlflowClient]:
    """A finished sweep's grid, recorded in the one store under ``tmp_path`` as experiment ``name``."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(name, artifact_location=str(tmp_path / "artifacts"))
    parent = client.create_run(experiment_id).info.run_id
    trials = []
    for i, accuracy in enumerate(accuracies):
        checkpoint = tmp_path / name / f"trial{i}" / "checkpoint_000001"
        checkpoint.mkdir(parents=True)
        torch.save(torch.nn.Linear(3, 1).state_dict(), checkpoint / "model.pt")
        run = client.create_run(experiment_id, tags={"mlflow.parentRunId": parent}).info.run_id
        trials.append(
            TrialResult(
                trial_id=f"t{i}",
                index=i,
                name=f"trial_{i}",
                config={"lr": 0.1 * (i + 1)},
                status=TrialStatus.COMPLETED,
                run_id=run,
                epochs=1,
                last={"accuracy": accuracy, "loss": 1 - accuracy},
                history=({"accuracy": accuracy, "loss": 1 - accuracy},),
                best=accuracy,
                checkpoint=str(checkpoint),
            )
        )
    record = ExperimentRecord(
        tracking_uri=uri,
        scheduler_address=None,
        state_dir=str(tmp_path),
        experiment_path=str(tmp_path),
        experiment_id=experiment_id,
        parent_run_id=parent,
    )
    return ResultGrid(trials, metric="accuracy", mode="max", record=record), client


def test_without_evaluate_fn_the_reported_metric_decides_the_champion(tmp_path):
    grid, client = _grid(tmp_path, [0.6, 0.9])
    first = tune.register_best(grid, model_fn=_model_fn, registered_model_name="digits")
    assert (first["version"], first["became_champion"], first["metrics"]["accuracy"]) == (1, True, 0.9)
    best_run = grid.get_best_result().mlflow_run_id
    assert client.get_model_version("digits", "1").run_id == best_run  # the trial that trained it
    assert client.get_registered_model("digits").aliases == {"champion": 1, "challenger": 1}
    tags = client.get_run(best_run).data.tags
    assert tags["sweepflow.winner"] == "true" and tags["sweepflow.registered_version"] == "digits/1"
    assert "sweepflow.data_checksum" not in client.get_model_version("digits", "1").tags  # the face has none

    worse, _ = _grid(tmp_path, [0.5], "again")  # a later sweep's best does not beat the sitting champion
    second = tune.register_best(worse, model_fn=_model_fn, registered_model_name="digits")
    assert (second["version"], second["became_champion"]) == (2, False)
    assert client.get_registered_model("digits").aliases == {"champion": 1, "challenger": 2}


def test_a_champion_metric_the_trial_never_reported_is_refused_naming_the_argument(tmp_path):
    grid, client = _grid(tmp_path, [0.7])
    with pytest.raises(ValueError, match=r"register_best: champion_metric='f1' is not among the best trial's reported "
                                         r"metrics \['accuracy', 'loss'\]"):
        tune.register_best(grid, model_fn=_model_fn, registered_model_name="digits", champion_metric="f1")
    assert client.search_registered_models() == []  # nothing was registered


def test_a_failing_model_fn_is_one_sentence_naming_it(tmp_path):
    grid, _ = _grid(tmp_path, [0.7])

    def model_fn(checkpoint):
        raise KeyError("state")

    with pytest.raises(RuntimeError, match=r"register_best: the registration failed: training.model_fn='.*model_fn' "
                                           r"raised KeyError"):
        tune.register_best(grid, model_fn=model_fn, registered_model_name="digits")
