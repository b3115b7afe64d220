"""``sweepflow.tune.register_best``: a Tune experiment's best trial through the pipeline's evaluation and registry.

Ray Tune ends at ``ResultGrid``; the pipeline goes on to a test-set evaluation and the model registry. A
``tune.run``/``Tuner`` user hands the grid to the same two stages, with the same functions a pipeline project
plugs in (README, "Your own project")::

    results = tuner.fit()
    registration = tune.register_best(
        results,
        model_fn=model_fn,                  # model_fn(checkpoint) -> nn.Module or (module, input_example)
        evaluate_fn=evaluate_fn,            # evaluate_fn(checkpoint, data_path) -> {"rmse": ...}; optional
        data_path="s3://bucket/houses/",
        registered_model_name="houses-price",
        champion_metric="test_rmse", champion_mode="min",
    )

The best trial's best checkpoint is evaluated (each metric logged as ``test_<name>`` on the trial's MLflow run
and the experiment's parent run), then its model is logged with mlflow.pytorch into the trial's run and
registered: alias ``challenger`` always, ``champion`` only if it beats the sitting champion on
``champion_metric``. Without ``evaluate_fn`` the champion is decided on the trial's own reported ``metric``.
Both run in this process (the driver's), as Ray users expect of code after ``fit()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sweepflow.flows.experiment import AfterSweepFailed, EvaluationMismatch, StageTimer, finalize
from sweepflow.tasks.sweep.experiment import Finalize
from sweepflow.tasks.tracking.runs import RunTracker
from sweepflow.tune.analysis import ResultGrid

_log = logging.getLogger("sweepflow.tune")


def register_best(
    results: ResultGrid,
    *,
    model_fn: Callable[..., Any],
    registered_model_name: str,
    evaluate_fn: Callable[..., Any] | None = None,
    data_path: str | None = None,
    metric: str | None = None,
    mode: str | None = None,
    champion_metric: str | None = None,
    champion_mode: str | None = None,
) -> dict[str, Any]:
    """Evaluate and register the grid's best trial (see the module doc); returns the registration (name,
    version, model_uri, became_champion, champion_version) and the test metrics (``metrics``).

    The arguments are checked and lowered to the lifecycle's ``Finalize``; the pipeline's own ``finalize`` runs
    it here, in the script's process."""
    if evaluate_fn is not None and data_path is None:
        raise ValueError("register_best: evaluate_fn(checkpoint, data_path) needs data_path=...")
    best = results.get_best_result(metric, mode)
    if best.checkpoint is None or not best.mlflow_run_id:
        raise ValueError(
            "register_best: the best trial has no checkpoint (report one with tune.report(..., checkpoint=...)) "
            "or no MLflow run"
        )
    if results.record is None:
        raise ValueError("register_best needs the ResultGrid a Tuner.fit() or tune.run returned (it says where it is recorded)")
    metric = metric or results.default_metric
    mode = mode or results.default_mode
    default = "test_" + str(metric or "") if evaluate_fn is not None else metric
    stage = Finalize(
        data_path=data_path,
        registered_model_name=registered_model_name,
        champion_metric=champion_metric or default or "",
        champion_mode=champion_mode or mode or "max",
        evaluate_fn=evaluate_fn,
        model_fn=model_fn,
        evaluate=evaluate_fn is not None,
        champion_setting="register_best: champion_metric",
    )
    trial = results.trial_result(best)
    record = results.record
    tracker = RunTracker(record.tracking_uri, _experiment_name(record.tracking_uri, trial.run_id))
    try:
        evaluation, registration = finalize(
            stage, trial, tracker, record.parent_run_id, None, StageTimer(), trials=len(results), log=_log.info
        )
    except EvaluationMismatch as exc:
        raise ValueError(exc.problem) from None
    except AfterSweepFailed as exc:
        raise RuntimeError(f"register_best: {exc.stage} failed: {exc.problem}") from exc
    return {**registration, "metrics": evaluation["metrics"]}


def _experiment_name(tracking_uri: str, run_id: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    return client.get_experiment(client.get_run(run_id).info.experiment_id).name
