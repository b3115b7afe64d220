"""The stages after the sweep: evaluate the best trial's best checkpoint on the test split, register it.

Both run their torch work on a Dask worker of the sweep's cluster (``finalize_on_worker``), not in the flow
process: the workers are long-lived and already hold torch and the training code (the
``sweepflow.tasks.worker_preload`` preload), while the flow process never imports torch at all. That keeps a pipeline run's start-up free of torch's import and the sweep free of a second process
competing for cores. mlflow.pytorch and torch._dynamo (the pt2 export) are imported by the first registration on
a worker, and later ones go to that worker (``finalizing_worker``); the confusion matrix is drawn here, where matplotlib already is.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from distributed import Client
from prefect import task
from prefect.cache_policies import NO_CACHE

from sweepflow.tasks.finalize_on_worker import (
    evaluate_on_worker,
    evaluate_own_model,
    holds_registry,
    register_on_worker,
    register_own_model,
    warm_registry,
)
from sweepflow.tasks.tracking.credentials import tracking_auth_env
from sweepflow.tasks.tracking.runs import RunTracker


def finalizing_worker(client: Client) -> dict[str, Any]:
    """Where evaluation and registration go (``client.submit`` keywords): a worker that already imported what
    registration needs, if one did (an earlier run's), else any. Every worker paying that import (seconds, and
    memory for the worker's life) when one does the registrations would only cost the others."""
    answers = client.run(holds_registry, on_error="ignore")  # a worker going away meanwhile is just not chosen
    warm = sorted(address for address, has in answers.items() if has is True)
    return {"workers": warm[:1], "allow_other_workers": True} if warm else {}


def warm_finalizer(client: Client) -> str | None:
    """Right after the sweep: start, in the background on the worker evaluation and registration will use, the
    imports registration needs (``warm_registry``), so a cold cluster's ~9 s of them overlap the flow's report and
    the evaluation instead of following them. A worker that already has them is left alone; otherwise one with no
    task running is chosen. Returns the worker's address (None: no worker, or one already warm)."""
    if finalizing_worker(client):
        return None
    processing = client.processing()
    idle = sorted(address for address, keys in processing.items() if not keys)
    chosen = (idle or sorted(processing))[:1]
    if not chosen:
        return None
    started = client.run(warm_registry, workers=chosen, on_error="ignore")
    return chosen[0] if started.get(chosen[0]) is True else None


@task(name="evaluate-best-trial", cache_policy=NO_CACHE)
def evaluate_best(
    checkpoint_path: str,
    data_path: str,
    tracker: RunTracker,
    run_ids: Sequence[str],
    client: Client | None,
    storage_options: dict[str, Any] | None = None,
    evaluate_fn: str | Callable[..., Any] | None = None,
    project_dir: str | None = None,
) -> dict[str, Any]:
    """Test-set loss, accuracy and per-class accuracy, logged to each of ``run_ids`` (the pipeline's parent run,
    and the best trial's run: the registered version's source). With the project's ``evaluate_fn``
    (``evaluation.evaluate_fn``), what it returns instead, as ``test_<name>``. The built-in evaluation also
    returns its confusion matrix (``confusion_matrix``, ``class_names``): ``log_confusion_matrix`` draws it,
    while the model registers."""
    if evaluate_fn is not None:
        metrics = _on_finalizing_worker(
            client, evaluate_own_model, evaluate_fn, project_dir, checkpoint_path, data_path, storage_options
        )
        out: dict[str, Any] = {"metrics": metrics}
    else:
        out = _on_finalizing_worker(client, evaluate_on_worker, checkpoint_path, data_path, storage_options)
    for run_id in run_ids:
        tracker.log_metrics(run_id, out["metrics"], step=0)
    return out


def log_confusion_matrix(evaluation: dict[str, Any], tracker: RunTracker, run_ids: Sequence[str]) -> None:
    """The built-in evaluation's confusion matrix as ``evaluation/confusion_matrix.png`` on each of ``run_ids``
    (nothing for a project's ``evaluate_fn``, which returns metrics only). Drawn here, in the flow process, where
    matplotlib already is (the sweep report): ~0.7 CPU-s of text layout, which the pipeline spends while a
    worker exports and registers the model."""
    if "confusion_matrix" not in evaluation:
        return
    from sweepflow.tasks.reporting.confusion_matrix import plot_confusion_matrix

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "confusion_matrix.png")
        png = plot_confusion_matrix(evaluation["confusion_matrix"], evaluation["class_names"], path)
        for run_id in run_ids:
            tracker.log_artifact(run_id, png, "evaluation")


@task(name="register-model", cache_policy=NO_CACHE)
def register_best(
    checkpoint_path: str,
    data_path: str | None,
    *,
    client: Client | None,
    tracking_uri: str,
    run_id: str,
    registered_model_name: str,
    metric_name: str,
    metric_value: float,
    higher_is_better: bool,
    tags: dict[str, str],
    storage_options: dict[str, Any] | None = None,
    model_fn: str | Callable[..., Any] | None = None,
    project_dir: str | None = None,
) -> dict[str, Any]:
    """Log the model with mlflow.pytorch (signature + input example) in run ``run_id`` (the trial that trained
    it: the version's source run) and register it: alias ``challenger`` always, ``champion`` only if it beats
    the current champion on the test metric.

    The model is logged from the Dask worker that exports it (the flow process meanwhile only uploads the
    evaluation's confusion-matrix image, so the run's data still has one writer at a time); the worker gets the
    tracking URI and this process's MLflow credentials (``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``), which
    never pass through Prefect."""
    registration_args = {
        "registered_model_name": registered_model_name,
        "run_id": run_id,
        "metric_name": metric_name,
        "metric_value": metric_value,
        "higher_is_better": higher_is_better,
        "tracking_uri": tracking_uri,
        "extra_tags": tags,
    }
    if model_fn is not None:  # the project's model (training.model_fn), from the checkpoint its train_fn wrote
        outcome = _on_finalizing_worker(
            client,
            register_own_model,
            model_fn,
            project_dir,
            checkpoint_path,
            data_path,
            storage_options,
            registration_args,
            tracking_auth_env(),
        )
        return outcome  # its ``input_example`` says where the example came from: the caller logs it
    return _on_finalizing_worker(
        client,
        register_on_worker,
        checkpoint_path,
        data_path,
        storage_options,
        registration_args,
        tracking_auth_env(),
    )


def _on_finalizing_worker(client: Client | None, function: Any, *args: Any) -> Any:
    """``function(*args)`` on the worker evaluation and registration go to (``finalizing_worker``); its result.
    No client: in this process (``tune.register_best``, called by a Tune script after its cluster is gone)."""
    if client is None:
        return function(*args)
    return client.submit(function, *args, pure=False, **finalizing_worker(client)).result()


def mark_winner(
    tracker: RunTracker, tracking_uri: str, run_id: str | None, registration: dict[str, Any]
) -> None:
    """Tag the best trial's run as the sweep's winner, its description linking to the model version it became."""
    from sweepflow.tasks.tracking.links import DESCRIPTION_TAG, MlflowLinks, markdown_link

    if not run_id:
        return
    version = markdown_link(
        f"{registration['name']} v{registration['version']}",
        MlflowLinks.for_tracking_uri(tracking_uri).model_version(
            registration["name"], registration["version"]
        ),
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
