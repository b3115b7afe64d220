"""The worker side of ``sweepflow.tasks.finalize``: what its tasks run on a Dask worker of the sweep's cluster.

A module of its own, importing neither Prefect nor (until registration runs) MLflow: the worker unpickles these
functions by importing this module, and pays only for what it runs. Evaluation needs torch and the training code
(the workers' preload warmed them); registration imports mlflow.pytorch on first use, and
``finalize.finalizing_worker`` sends the next registration to a worker that already has it.
"""

from __future__ import annotations

import sys
from typing import Any

from ddp_runtime import Checkpoint
from sweepflow.tasks.tracking.credentials import SecretEnv, tracking_auth_scope

#: The module whose import makes registration cost seconds on a cold worker (mlflow.pytorch).
REGISTRY_MODULE = "sweepflow.tasks.tracking.registry"


def holds_registry() -> bool:
    """Whether this process already imported what registration needs (``client.run`` asks every worker)."""
    return REGISTRY_MODULE in sys.modules


def evaluate_on_worker(
    checkpoint_path: str, data_path: str, storage_options: dict[str, Any] | None
) -> dict[str, Any]:
    """Test-set metrics and confusion matrix of the checkpoint's model (the flow draws the matrix)."""
    from sweepflow.tasks.training.evaluate import evaluate_checkpoint

    with Checkpoint(checkpoint_path, storage_options=storage_options).as_directory() as local:
        result = evaluate_checkpoint(local, data_path, split="test")
    return {
        "metrics": result.to_metrics(),
        "confusion_matrix": result.confusion_matrix,
        "class_names": result.class_names,
    }


def register_on_worker(
    checkpoint_path: str,
    data_path: str,
    storage_options: dict[str, Any] | None,
    registration_args: dict[str, Any],
    auth_env: SecretEnv,
) -> dict[str, Any]:
    """Log the checkpoint's model with mlflow.pytorch and register it (``log_and_register``); the registration's
    outcome as plain data."""
    from sweepflow.tasks.datasets import load_split
    from sweepflow.tasks.tracking.registry import log_and_register
    from sweepflow.tasks.training.loop import load_model_from_checkpoint

    with Checkpoint(checkpoint_path, storage_options=storage_options).as_directory() as local:
        model = load_model_from_checkpoint(local)
    x_test, _ = load_split(data_path, "test")
    with tracking_auth_scope(auth_env):  # the flow's MLflow credentials, for this registration only
        registration = log_and_register(model=model, input_example=x_test[:4].numpy(), **registration_args)
    return {
        "name": registration.name,
        "version": registration.version,
        "model_uri": registration.model_uri,
        "became_champion": registration.became_champion,
        "champion_version": registration.champion_version,
        "previous_champion_version": registration.previous_champion_version,
    }
