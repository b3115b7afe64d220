"""The training pipeline flow: data -> sweep (DDP trials on Dask, ASHA) -> best trial -> test -> registry.

Thin on purpose: the data stage, then the pipeline's settings lowered to the one ``Experiment`` both faces run
(``experiment_for``, ``sweepflow.flows.pipeline_lowering``) and run by the one lifecycle (``sweepflow.flows.experiment``), then the summary.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.credentials import Credentials, with_credentials
from sweepflow.flows.experiment import (
    EvaluationMismatch,
    ExperimentRun,
    run_experiment,
)
from sweepflow.flows.pipeline_lowering import experiment_for
from sweepflow.flows.preflight import check_pipeline
from sweepflow.flows.settings import Settings, resolve_settings
from sweepflow.tasks.compat import stop_flow_heartbeats_promptly
from sweepflow.tasks.datasets import PreparedDataset
from sweepflow.tasks.datasets.uris import redact
from sweepflow.tasks.download import download_dataset
from sweepflow.tasks.recording import prefect_flow_run_url
from sweepflow.tasks.sweep.results import TrialResult
from sweepflow.tasks.sweep.resume import find_parent, resume_key
from sweepflow.tasks.training.function import project_importable

__all__ = [
    "EvaluationMismatch",
    "bound_training_pipeline",
    "run_pipeline",
    "training_pipeline",
]

# Prefect's flow-run heartbeat thread sleeps in one-second steps: without this, every pipeline run's end waited
# up to a second for it (see compat). Here, so that every way of running the flow (the CLI, a deployment's
# process, Python) has it.
stop_flow_heartbeats_promptly()


@flow(name="training-pipeline", log_prints=True)
def training_pipeline(
    config: PipelineConfig = PipelineConfig(),  # noqa: B008 - pydantic default
    resume_from: str | None = None,
) -> dict[str, Any]:
    """Download data, sweep hyperparameters with DDP trials and ASHA, evaluate and register the best model.

    ``resume_from``: the MLflow parent run of an interrupted pipeline with the same settings; its ended trials
    are read back, its running ones continue from their checkpoints, the rest start. A Prefect retry of this
    flow run resumes the sweep its earlier attempt left unfinished."""
    # A deployment's flow run (or a Python caller's) is an entry point of its own: its settings are read here,
    # and it has no credentials but those its parameters and environment carry.
    return run_pipeline(config, resume_from, settings=Settings.from_env(), credentials=Credentials())


def bound_training_pipeline(settings: Settings, credentials: Credentials) -> Any:
    """The ``training-pipeline`` flow for an entry point that has read its settings and taken the credentials
    out of its config (``sweepflow run``): both reach the flow's body directly, never as parameters, which
    Prefect stores and shows. Same name, parameters and behaviour as ``training_pipeline``."""

    def bound(
        config: PipelineConfig = PipelineConfig(),  # noqa: B008 - pydantic default
        resume_from: str | None = None,
    ) -> dict[str, Any]:
        return run_pipeline(config, resume_from, settings=settings, credentials=credentials)

    bound.__doc__ = training_pipeline.fn.__doc__
    return flow(name=training_pipeline.name, log_prints=True)(bound)


def run_pipeline(
    config: PipelineConfig, resume_from: str | None, *, settings: Settings, credentials: Credentials
) -> dict[str, Any]:
    """The ``training-pipeline`` flow's body, inside its flow run."""
    cfg = resolve_settings(config, settings)
    cfg = with_credentials(cfg, credentials)  # the entry point's: never in Prefect's stored parameters
    if resume_from is None and (flow_run.get_run_count() or 1) > 1:
        resume_from = _interrupted_attempt(cfg, str(flow_run.get_id()))
    # Bad parameters fail here, in seconds, before any run, download or trial exists.
    check_pipeline(cfg, resume_from=resume_from)
    with project_importable(cfg.project_dir):  # the project's functions import here (and on the workers)
        return _run_pipeline(cfg, resume_from)


def _interrupted_attempt(cfg: PipelineConfig, flow_run_id: str) -> str | None:
    """The parent run an earlier attempt of this Prefect flow run left unfinished (a retry resumes it)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cfg.mlflow.tracking_uri)
    experiment = client.get_experiment_by_name(cfg.mlflow.experiment_name)  # None: no earlier attempt ran
    key = resume_key(cfg.model_dump())  # what its parent run recorded: the retry has the same parameters
    return find_parent(client, experiment and experiment.experiment_id, key, flow_run_id=flow_run_id)


def _run_pipeline(cfg: PipelineConfig, resume_from: str | None) -> dict[str, Any]:
    logger = get_run_logger()
    started = time.perf_counter()
    prepared = PreparedDataset.from_dict(download_dataset(cfg.data))
    data_s = round(time.perf_counter() - started, 3)
    if not cfg.training.builtin_model:
        _say_input_example(logger, cfg, prepared.path)
    exp = experiment_for(cfg, prepared, resume_from=resume_from)
    run = run_experiment(exp, log=logger.info)
    assert run.best is not None and run.evaluation is not None and run.registration is not None  # finalize ran
    timings = {"data_s": data_s, **run.timings}
    logger.info("stage timings: %s", timings)
    _log_outcome(logger, cfg, run.best, run.evaluation, run.registration)
    _log_views(logger, cfg, run.parent_run_id, run.views)
    return _summary(cfg, run, prepared, timings)


def _say_input_example(logger: Any, cfg: PipelineConfig, data_path: str) -> None:
    """Before the sweep: where the registered model's input example will come from if ``training.model_fn``
    returns the module alone, so that a model without a signature is known before the training, not after."""
    from sweepflow.tasks.datasets.examples import example_layout

    layout = example_layout(data_path)
    if layout:
        logger.info(
            "registry: if training.model_fn returns the module alone, its input example will be the first rows "
            "of the prepared data's test split (%s)",
            layout,
        )
    else:
        logger.info(
            "registry: the prepared data has no test split sweepflow reads (schema.json + test.csv/.parquet, "
            "test.npz, test/<class>/<image>): if training.model_fn returns the module alone, the model is "
            "registered without a signature (pickled with its code); return (module, input_example) to add one"
        )


def _summary(cfg: PipelineConfig, run: ExperimentRun, prepared: PreparedDataset, timings: dict[str, float]) -> dict[str, Any]:
    """The flow run's result: where everything is recorded, what won, and how long each stage took."""
    assert run.best is not None and run.evaluation is not None
    return {
        "parent_run_id": run.parent_run_id,
        "experiment_id": run.experiment_id,
        "tracking_uri": redact(cfg.mlflow.tracking_uri),  # e.g. a database URI from MLFLOW_TRACKING_URI
        "selection": {"metric": cfg.selection.metric, "mode": cfg.selection.mode},
        "report_url": run.report_url,
        "mlflow_view_key": run.view_key,
        "best_trial": run.best.to_dict(),
        "failed_trials": [t.trial_id for t in run.sweep.failed],
        "test_metrics": run.evaluation["metrics"],
        "registration": run.registration,
        "leaderboard": run.board.to_dict(orient="records"),
        "usage": run.sweep.usage(),
        "state_dir": cfg.state_dir,
        "data_path": prepared.path,
        "timings": timings,
        "sweep_seconds": timings["sweep_s"],
        "trials": [t.to_dict() for t in run.sweep.trials],
    }


def _log_outcome(
    logger: Any,
    cfg: PipelineConfig,
    best: TrialResult,
    evaluation: dict[str, Any],
    registration: dict[str, Any],
) -> None:
    logger.info(
        "best trial %s: %s=%.4f (epoch %s); test %s=%.4f; registered %s v%s%s",
        best.trial_id,
        cfg.selection.metric,
        best.best,
        best.best_epoch,
        cfg.selection.champion_metric,
        evaluation["metrics"][cfg.selection.champion_metric],
        registration["name"],
        registration["version"],
        " (new champion)" if registration["became_champion"] else " (champion unchanged)",
    )


def _log_views(logger: Any, cfg: PipelineConfig, parent: str, views: dict[str, str | None]) -> None:
    """The flow run's last log lines: where to look at what the sweep found (``views``: the MLflow views by
    label, None where the store has no UI), in MLflow and in Prefect."""
    if not any(views.values()):
        logger.info(
            "compare the trials in the MLflow UI: mlflow ui --backend-store-uri %s (runs table, parent run %s)",
            redact(cfg.mlflow.tracking_uri),
            parent,
        )
        return
    lines = [f"  {label + ':':17} {url}" for label, url in views.items()]
    prefect_run = prefect_flow_run_url()
    if prefect_run:
        lines.append(f"  {'Prefect flow run:':17} {prefect_run}")
    logger.info("compare the trials in the MLflow UI:\n%s", "\n".join(lines))
