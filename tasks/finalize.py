"""The stages after the sweep: evaluate the best trial's best checkpoint on the test split, register it.

Both run their torch work on a Dask worker of the sweep's cluster, not in the flow process: the workers are
long-lived and already hold torch (and, with the ``sweepflow.tasks.worker_preload`` preload, torch._dynamo for the pt2
export, matplotlib and mlflow.pytorch), while the flow process never imports torch at all. That keeps a
pipeline run's start-up free of torch's import and the sweep free of a second process competing for cores.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

from distributed import Client
from prefect import task
from prefect.cache_policies import NO_CACHE

from ddp_runtime import Checkpoint
from sweepflow.tasks.tracking.credentials import SecretEnv, tracking_auth_env, tracking_auth_scope
from sweepflow.tasks.tracking.runs import RunTracker


def _evaluate_on_worker(
    checkpoint_path: str, data_path: str, storage_options: dict[str, Any] | None
) -> dict[str, Any]:
    from sweepflow.tasks.training.evaluate import evaluate_checkpoint, plot_confusion_matrix

    with Checkpoint(checkpoint_path, storage_options=storage_options).as_directory() as local:
        result = evaluate_checkpoint(local, data_path, split="test")
    with tempfile.TemporaryDirectory() as tmp:
        with open(plot_confusion_matrix(result, os.path.join(tmp, "confusion_matrix.png")), "rb") as f:
            png = f.read()
    return {
        "metrics": result.to_metrics(),
        "confusion_matrix": result.confusion_matrix,
        "class_names": result.class_names,
        "png": png,
    }


@task(name="evaluate-best-trial", cache_policy=NO_CACHE)
def evaluate_best(
    checkpoint_path: str,
    data_path: str,
    tracker: RunTracker,
    run_ids: Sequence[str],
    client: Client,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Test-set loss, accuracy, per-class accuracy and a confusion-matrix PNG, logged to each of ``run_ids``
    (the pipeline's parent run, and the best trial's run: the registered version's source)."""
    out = client.submit(_evaluate_on_worker, checkpoint_path, data_path, storage_options, pure=False).result()
    with tempfile.TemporaryDirectory() as tmp:
        png = os.path.join(tmp, "confusion_matrix.png")
        with open(png, "wb") as f:
            f.write(out.pop("png"))
        for run_id in run_ids:
            tracker.log_metrics(run_id, out["metrics"], step=0)
            tracker.log_artifact(run_id, png, "evaluation")
    return out


def _register_on_worker(
    checkpoint_path: str,
    data_path: str,
    storage_options: dict[str, Any] | None,
    registration_args: dict[str, Any],
    auth_env: SecretEnv,
) -> dict[str, Any]:
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


@task(name="register-model", cache_policy=NO_CACHE)
def register_best(
    checkpoint_path: str,
    data_path: str,
    *,
    client: Client,
    tracking_uri: str,
    run_id: str,
    registered_model_name: str,
    metric_name: str,
    metric_value: float,
    higher_is_better: bool,
    tags: dict[str, str],
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Log the model with mlflow.pytorch (signature + input example) in run ``run_id`` (the trial that trained
    it: the version's source run) and register it: alias ``challenger`` always, ``champion`` only if it beats
    the current champion on the test metric.

    The model is logged from the Dask worker that exports it (the flow process waits meanwhile, so the run
    still has one writer at a time); the worker gets the tracking URI and this process's MLflow credentials
    (``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``), which never pass through Prefect."""
    registration_args = {
        "registered_model_name": registered_model_name,
        "run_id": run_id,
        "metric_name": metric_name,
        "metric_value": metric_value,
        "higher_is_better": higher_is_better,
        "tracking_uri": tracking_uri,
        "extra_tags": tags,
    }
    future = client.submit(
        _register_on_worker,
        checkpoint_path,
        data_path,
        storage_options,
        registration_args,
        tracking_auth_env(),
        pure=False,
    )
    return future.result()


def mark_winner(tracker: RunTracker, tracking_uri: str, run_id: str | None, registration: dict[str, Any]) -> None:
    """Tag the best trial's run as the sweep's winner, its description linking to the model version it became."""
    from sweepflow.tasks.tracking.links import DESCRIPTION_TAG, MlflowLinks, markdown_link

    if not run_id:
        return
    version = markdown_link(
        f"{registration['name']} v{registration['version']}",
        MlflowLinks.for_tracking_uri(tracking_uri).model_version(registration["name"], registration["version"]),
    )
    current = tracker.client.get_run(run_id).data.tags.get(DESCRIPTION_TAG, "")
    tracker.set_tags(
        run_id,
        {
            "sweepflow.winner": "true",
            "sweepflow.registered_version": f"{registration['name']}/{registration['version']}",
            DESCRIPTION_TAG: f"**Best trial of the sweep**, registered as {version}.\n\n{current}".strip(),
        },
    )
