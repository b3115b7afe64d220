"""A sharded trial through the pipeline (issue 63, item 2): a project whose train_fn trains with FSDP on 2 ranks
and checkpoints with torch.distributed.checkpoint from every rank, whose model_fn reads the sharded checkpoint
back whole (``ddp_runtime.sharded.load_full_state_dict``): evaluated, registered, loaded with mlflow.pyfunc in a
fresh process that cannot import the project."""

from __future__ import annotations

import os
import shutil

import numpy as np
import paths
from test_own_project import _predict_in_fresh_process, _quick

from sweepflow.flows.config_file import load_config_file

HERE = paths.SUPPORT  # the example project beside the helpers
PROJECT = HERE / "fsdp_project"


def test_a_sharded_fsdp_trial_is_evaluated_registered_and_loads_with_pyfunc(
    prefect_harness, mlflow_server, cluster, tmp_path
):
    from forecast_project.forecast.model import WINDOW, series_csv

    from sweepflow.flows.pipeline import training_pipeline

    project = tmp_path / "fsdp_project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    (project / "series").mkdir()
    for seed in range(3):
        (project / "series" / f"s{seed}.csv").write_text(series_csv(seed))
    name = f"sharded-{os.urandom(3).hex()}"
    cfg = load_config_file(
        project / "sweep.yaml", [f"mlflow.registered_model_name={name}", f"mlflow.experiment_name={name}"]
    )
    summary = training_pipeline(config=_quick(cfg, cluster, mlflow_server, tmp_path))
    metrics = summary["test_metrics"]
    assert summary["registration"]["version"] == 1, summary
    assert metrics["test_mse"] < metrics["test_naive_mse"], metrics  # the whole model, not one shard of it
    t = np.arange(WINDOW + 1)
    wave = (np.sin(2 * np.pi * t / 50) + 0.5 * np.sin(2 * np.pi * t / 13)).astype(np.float32)
    predicted = _predict_in_fresh_process(mlflow_server, f"models:/{name}/1", wave[None, :WINDOW])
    assert predicted.shape == (1,) and abs(predicted[0] - wave[WINDOW]) < 0.5, (predicted, wave[WINDOW])
    print(
        f"\nsharded trial: test metrics {metrics}; pyfunc in a fresh process predicted {predicted[0]:.3f} "
        f"for {wave[WINDOW]:.3f}"
    )
