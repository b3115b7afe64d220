"""The training pipeline flow: data -> sweep (DDP trials on Dask, ASHA) -> best trial -> test -> registry.

Thin on purpose: each stage is a task or a library object from ``sweepflow.tasks``; this module composes them
and owns the paired set-up and tear-down of the run's resources (the MLflow parent run, the Dask client).
"""

from __future__ import annotations

import os
import time
from typing import Any

from distributed import Client
from prefect import flow, get_run_logger
from prefect.runtime import flow_run

import ddp_runtime as train
from ddp_runtime.cluster import cluster_client, groups_that_fit
from sweepflow.flows.config import PipelineConfig, Settings, resolve_settings, with_credentials
from sweepflow.flows.preflight import check_pipeline
from sweepflow.tasks import WORKER_PRELOAD
from sweepflow.tasks.compat import stop_flow_heartbeats_promptly
from sweepflow.tasks.datasets import PreparedDataset
from sweepflow.tasks.datasets.uris import redact
from sweepflow.tasks.download import download_dataset
from sweepflow.tasks.finalize import evaluate_best, mark_winner, register_best
from sweepflow.tasks.recording import (
    ParentRun,
    SweepRecord,
    parent_run,
    prefect_flow_run_url,
    record_sweep,
)
from sweepflow.tasks.sweep.driver import Sweep
from sweepflow.tasks.sweep.results import SweepResult, TrialResult
from sweepflow.tasks.sweep.resume import PriorSweep, find_interrupted_parent, load_prior_sweep, resume_key
from sweepflow.tasks.sweep.samplers import make_sampler
from sweepflow.tasks.sweep.space import parse_space
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tasks.tracking.runs import RunTracker, flatten, public_params
from sweepflow.tasks.training.function import project_importable

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
    cfg = resolve_settings(config, Settings.from_env())  # a deployment's flow run is an entry point too
    cfg = with_credentials(cfg)  # the CLI's, held in this process: never in Prefect's stored parameters
    if resume_from is None and (flow_run.get_run_count() or 1) > 1:
        resume_from = find_interrupted_parent(run_tracker(cfg), str(flow_run.get_id()))
    # Bad parameters fail here, in seconds, before any run, download or trial exists.
    check_pipeline(cfg, resume_from=resume_from)
    with project_importable(cfg.project_dir):  # the project's functions import here (and on the workers)
        return _run_pipeline(cfg, resume_from)


def _run_pipeline(cfg: PipelineConfig, resume_from: str | None) -> dict[str, Any]:
    logger = get_run_logger()
    stages = _StageTimer()
    prepared = PreparedDataset.from_dict(download_dataset(cfg.data))
    stages.lap("data_s")
    tracker = run_tracker(cfg)
    with parent_run(tracker, parent_spec(cfg, prepared), resume_from=resume_from) as parent:
        logger.info("MLflow parent run %s (if interrupted: sweepflow run --resume %s, same settings)", parent, parent)
        stages.lap("mlflow_setup_s")
        with cluster_client(
            cfg.dask.scheduler_address,
            use_gpu=cfg.resources.use_gpu,
            n_workers=cfg.dask.n_workers,
            preload=[WORKER_PRELOAD],
        ) as client:
            stages.lap("dask_start_s")
            prior = prior_sweep(tracker, parent, cfg) if resume_from else None
            sweep = build_sweep(cfg, prepared, client, tracker, parent, prior=prior).run()
            stages.lap("sweep_s")
            board, leaderboard = record_sweep(sweep, tracker, parent, sweep_record(cfg))
            stages.lap("report_s")  # the leaderboard, the report, the parent run's sweep record
            best = best_trial(sweep, tracker, parent, cfg)
            evaluation = evaluate_best(
                best.best_checkpoint,
                prepared.path,
                tracker,
                [parent, best.run_id],
                client,
                evaluate_fn=None if cfg.evaluation.builtin else cfg.evaluation.evaluate_fn,
                project_dir=cfg.project_dir,
            )
            check_champion_metric(cfg, evaluation["metrics"])
            stages.lap("evaluate_s")
            registration = register(cfg, best, prepared, client, evaluation)
            stages.lap("register_s")
            mark_winner(tracker, cfg.mlflow.tracking_uri, best.run_id, registration)
            views = leaderboard.publish(
                best_run_id=best.run_id, registered=(registration["name"], registration["version"])
            )
            stages.lap("publish_s")  # the winner's tags, the report with the registered version
    logger.info("stage timings: %s", stages.timings)
    _log_outcome(logger, cfg, best, evaluation, registration)
    _log_views(logger, cfg, parent, views)
    outcome = {"best": best, "evaluation": evaluation, "registration": registration, "board": board}
    return _summary(
        cfg, tracker.experiment_id, parent, prepared, sweep, stages.timings, report_url=leaderboard.report_url, **outcome
    )


# ------------------------------------------------------------------------------------------- the stages' parts


def build_sweep(
    cfg: PipelineConfig,
    prepared: PreparedDataset,
    client: Client,
    tracker: RunTracker,
    parent_run_id: str,
    *,
    prior: PriorSweep | None = None,
) -> Sweep:
    """The configured sweep over ``prepared`` on ``client``'s cluster, its trials nested under the parent run
    (``prior``: the trials of the interrupted sweep it resumes). Fails at once if the cluster can never hold
    one trial."""
    scaling = train.ScalingConfig(
        num_workers=cfg.resources.ranks_per_trial,
        use_gpu=cfg.resources.use_gpu,
        resources_per_worker=cfg.resources.resources_per_rank() or None,
    )
    fits = groups_that_fit(client, scaling, what="resources.ranks_per_trial / gpus_per_rank / cpus_per_rank")
    space = parse_space(cfg.sweep.search_space)
    sampler = make_sampler(
        cfg.sweep.sampler,
        space,
        num_samples=cfg.sweep.num_samples,
        seed=cfg.sweep.seed,
        mode=cfg.selection.mode,
    )
    template = TrialTemplate(
        train_fn=cfg.training.train_fn,
        train_loop_config={
            **cfg.training.base_config,
            "model": cfg.training.model,
            "epochs": cfg.training.epochs,
            "data_path": prepared.path,
        },
        num_ranks=scaling.num_workers,
        resources_per_rank=dict(scaling.worker_resources),
        use_gpu=cfg.resources.use_gpu,
        selection_metric=cfg.selection.metric,
        selection_mode=cfg.selection.mode,
        max_reports=cfg.scheduler.max_reports(cfg.training.epochs),
        seed=cfg.sweep.seed,
        varying_names=tuple(space.varying_names),
        max_failures=cfg.training.max_failures,
        hang_timeout_s=cfg.training.hang_timeout_s,
        system_metrics_interval_s=cfg.training.system_metrics_interval_s,
        import_dir=cfg.project_dir,
    )
    concurrency = cfg.sweep.max_concurrent_trials or fits
    scheduler = cfg.scheduler.build()
    scheduler.check_room(trials=sampler.total, at_once=min(concurrency, fits))
    log = get_run_logger().info
    log(
        f"sweep: {sampler.total} trials ({cfg.sweep.sampler} sampler), {min(concurrency, sampler.total)} at a time "
        f"(cluster fits {fits}), {scaling.num_workers} rank(s) each"
    )
    return Sweep(
        sampler=sampler,
        template=template,
        cluster=client,
        tracker=tracker,
        parent_run_id=parent_run_id,
        scheduler=scheduler,
        concurrency=concurrency,
        staging_dir=os.path.join(cfg.state_dir, "staging"),
        time_budget_s=cfg.sweep.time_budget_s,
        artifacts_destination=cfg.mlflow.artifacts_destination,
        prior=prior,
        log=log,
    )


def run_tracker(cfg: PipelineConfig) -> RunTracker:
    default_store = cfg.mlflow.tracking_uri.startswith("sqlite:")
    return RunTracker(
        cfg.mlflow.tracking_uri,
        cfg.mlflow.experiment_name,
        artifact_root=os.path.join(cfg.state_dir, "mlartifacts") if default_store else None,
    )


#: The parent run's params: what a user filters and compares pipeline runs by (the rest: config/ artifact).
PARENT_PARAMS = frozenset(
    {
        "data.name",
        "data.source",
        "sweep.sampler",
        "sweep.num_samples",
        "sweep.max_concurrent_trials",
        "sweep.seed",
        "scheduler.type",
        "training.epochs",
        "training.train_fn",
        "resources.ranks_per_trial",
        "resources.gpus_per_rank",
        "training.model",
        "selection.metric",
        "selection.mode",
        "mlflow.registered_model_name",
    }
)


#: A project's functions and data preparation: parent params too, when set (a built-in run has none of them).
PROJECT_PARAMS = frozenset({"data.prepare_fn", "data.format", "data.target", "training.model_fn", "evaluation.evaluate_fn"})


def parent_spec(cfg: PipelineConfig, prepared: PreparedDataset) -> ParentRun:
    """The pipeline's parent run: the settings users filter by as params, all of them as an artifact, the data
    it trains on as tags (a resume must find the same data)."""
    # Every setting (credentials removed) as one artifact; as params only the few a user filters runs by, so
    # the runs table and compare view are not buried under ~50 settings.
    settings = public_params(flatten("", cfg.model_dump(exclude={"state_dir"})))
    return ParentRun(
        name=f"pipeline-{flow_run.get_name() or 'local'}",
        params={
            k: v
            for k, v in settings.items()
            if k in PARENT_PARAMS or (k in PROJECT_PARAMS and v is not None)
        },
        tags={
            "sweepflow.kind": "pipeline",
            "sweepflow.data_checksum": prepared.checksum,
            "sweepflow.dataset": prepared.name,
        },
        settings=settings,
        settings_file="pipeline_config.json",
        resume_key=resume_key(cfg.model_dump()),
        scratch_dir=os.path.join(cfg.state_dir, "tmp"),
        same_on_resume={"sweepflow.data_checksum": "the data (its checksum)"},
        artifacts_destination=cfg.mlflow.artifacts_destination,
    )


def sweep_record(cfg: PipelineConfig) -> SweepRecord:
    return SweepRecord(
        metric=cfg.selection.metric,
        mode=cfg.selection.mode,
        search_space=cfg.sweep.search_space,
        title=f"Sweep {flow_run.get_name() or 'local'}: {cfg.data.label}",
        tracking_uri=cfg.mlflow.tracking_uri,
        scratch_dir=os.path.join(cfg.state_dir, "tmp"),
    )


def prior_sweep(tracker: RunTracker, parent: str, cfg: PipelineConfig) -> PriorSweep:
    """The trials of the interrupted sweep this run resumes."""
    prior = load_prior_sweep(tracker, parent, metric=cfg.selection.metric, mode=cfg.selection.mode)
    get_run_logger().info(
        "resuming pipeline run %s: %d trial(s) ended (read back), %d continue from their checkpoints",
        parent,
        len(prior.ended),
        len(prior.interrupted),
    )
    return prior


def best_trial(sweep: SweepResult, tracker: RunTracker, parent: str, cfg: PipelineConfig) -> TrialResult:
    """The sweep's best trial, named on the parent run; an error when no trial reported the metric."""
    best = sweep.best()
    if best is None:
        raise RuntimeError(
            f"no trial reported {cfg.selection.metric} ({len(sweep.failed)} of {len(sweep.trials)} "
            "failed); see the MLflow child runs' sweepflow.error tags"
        )
    tracker.set_tags(parent, {"sweepflow.best_trial": best.trial_id, "sweepflow.best_run_id": best.run_id})
    return best


def register(
    cfg: PipelineConfig, best: TrialResult, prepared: PreparedDataset, client: Client, evaluation: dict[str, Any]
) -> dict[str, Any]:
    """Register the best trial's best checkpoint (a new champion if it beats the current one on the test set)."""
    return register_best(
        best.best_checkpoint,
        prepared.path,
        client=client,
        tracking_uri=cfg.mlflow.tracking_uri,
        run_id=best.run_id,  # the version's source run is the trial that trained it
        registered_model_name=cfg.mlflow.registered_model_name,
        metric_name=cfg.selection.champion_metric,
        metric_value=evaluation["metrics"][cfg.selection.champion_metric],
        higher_is_better=cfg.selection.champion_mode == "max",
        tags={"sweepflow.best_trial": best.trial_id, "sweepflow.data_checksum": prepared.checksum},
        model_fn=None if cfg.training.builtin_model else cfg.training.model_fn,
        project_dir=cfg.project_dir,
    )


class EvaluationMismatch(ValueError):
    """The evaluation did not report the metric that decides the champion: nothing is registered."""


def check_champion_metric(cfg: PipelineConfig, metrics: dict[str, float]) -> None:
    """Before registering: the champion metric is one the evaluation reported."""
    if cfg.selection.champion_metric not in metrics:
        raise EvaluationMismatch(
            f"selection.champion_metric={cfg.selection.champion_metric!r} is not among the evaluation's metrics "
            f"{sorted(metrics)}: name one of them (what evaluate_fn returns, prefixed test_); nothing was "
            "registered, the trials are in MLflow"
        )


def _summary(
    cfg: PipelineConfig,
    experiment_id: str,
    parent: str,
    prepared: PreparedDataset,
    sweep: SweepResult,
    timings: dict[str, float],
    *,
    best: TrialResult,
    evaluation: dict[str, Any],
    registration: dict[str, Any],
    board: Any,
    report_url: str | None = None,
) -> dict[str, Any]:
    """The flow run's result: where everything is recorded, what won, and how long each stage took."""
    return {
        "parent_run_id": parent,
        "experiment_id": experiment_id,
        "tracking_uri": redact(cfg.mlflow.tracking_uri),  # e.g. a database URI from MLFLOW_TRACKING_URI
        "selection": {"metric": cfg.selection.metric, "mode": cfg.selection.mode},
        "report_url": report_url,
        "best_trial": best.to_dict(),
        "failed_trials": [t.trial_id for t in sweep.failed],
        "test_metrics": evaluation["metrics"],
        "registration": registration,
        "leaderboard": board.to_dict(orient="records"),
        "usage": sweep.usage(),
        "state_dir": cfg.state_dir,
        "data_path": prepared.path,
        "timings": timings,
        "sweep_seconds": timings["sweep_s"],
        "trials": [t.to_dict() for t in sweep.trials],
    }


class _StageTimer:
    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self._mark, 3)
        self._mark = now


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
