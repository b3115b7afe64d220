"""The stages after the sweep: evaluate the best trial's best checkpoint on the test split, register it."""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from ddp_runtime import Checkpoint
from tasks.tracking import RunTracker

# tasks.evaluate (matplotlib) and tasks.registry (mlflow.pytorch, torch._dynamo for pt2 export) cost seconds
# to import: they are imported where used, and warm_imports() loads them in the background during the sweep.


def warm_imports() -> threading.Thread:
    """Import the finalize stages' heavy modules in a background thread (the sweep mostly waits on Dask)."""

    def _load() -> None:
        import torch._dynamo  # noqa: F401

        import tasks.evaluate  # noqa: F401
        import tasks.registry  # noqa: F401

    thread = threading.Thread(target=_load, name="sweepflow-warm-imports", daemon=True)
    thread.start()
    return thread


@task(name="evaluate-best-trial", cache_policy=NO_CACHE)
def evaluate_best(
    checkpoint_path: str,
    data_path: str,
    tracker: RunTracker,
    parent_run_id: str,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Test-set loss, accuracy, per-class accuracy and a confusion-matrix PNG, logged to the parent run."""
    from tasks.evaluate import evaluate_checkpoint, plot_confusion_matrix
    with Checkpoint(checkpoint_path, storage_options=storage_options).as_directory() as local:
        result = evaluate_checkpoint(local, data_path, split="test")
    metrics = result.to_metrics()
    tracker.log_metrics(parent_run_id, metrics, step=0)
    with tempfile.TemporaryDirectory() as tmp:
        png = plot_confusion_matrix(result, os.path.join(tmp, "confusion_matrix.png"))
        tracker.log_artifact(parent_run_id, png, "evaluation")
    return {
        "metrics": metrics,
        "confusion_matrix": result.confusion_matrix,
        "class_names": result.class_names,
    }


@task(name="register-model", cache_policy=NO_CACHE)
def register_best(
    checkpoint_path: str,
    data_path: str,
    *,
    tracking_uri: str,
    parent_run_id: str,
    registered_model_name: str,
    metric_name: str,
    metric_value: float,
    higher_is_better: bool,
    tags: dict[str, str],
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Log the model with mlflow.pytorch (signature + input example) in the parent run and register it:
    alias ``challenger`` always, ``champion`` only if it beats the current champion on the test metric."""
    from tasks.datasets import load_split
    from tasks.registry import log_and_register
    from tasks.train_loop import load_model_from_checkpoint
    with Checkpoint(checkpoint_path, storage_options=storage_options).as_directory() as local:
        model = load_model_from_checkpoint(local)
    x_test, _ = load_split(data_path, "test")
    registration = log_and_register(
        model=model,
        input_example=x_test[:4].numpy(),
        registered_model_name=registered_model_name,
        run_id=parent_run_id,
        metric_name=metric_name,
        metric_value=metric_value,
        higher_is_better=higher_is_better,
        tracking_uri=tracking_uri,
        extra_tags=tags,
    )
    return {
        "name": registration.name,
        "version": registration.version,
        "model_uri": registration.model_uri,
        "became_champion": registration.became_champion,
        "champion_version": registration.champion_version,
        "previous_champion_version": registration.previous_champion_version,
    }
