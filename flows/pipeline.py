"""The training pipeline flow: data -> sweep (DDP trials on Dask, ASHA) -> best trial -> test -> registry.

Thin on purpose: each stage is a task or a library object from ``sweepflow.tasks``; this module composes them
and owns the paired set-up and tear-down of the run's resources (the MLflow parent run, the Dask client).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from distributed import Client
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.settings import PREFECT_API_URL

import ddp_runtime as train
from ddp_runtime.cluster import cluster_client, groups_that_fit
from sweepflow.flows.config import PipelineConfig, Settings, resolve_settings, with_credentials
from sweepflow.flows.preflight import check_pipeline
from sweepflow.tasks import WORKER_PRELOAD
from sweepflow.tasks.datasets import PreparedDataset
from sweepflow.tasks.datasets.uris import redact
from sweepflow.tasks.download import download_dataset
from sweepflow.tasks.finalize import evaluate_best, register_best
from sweepflow.tasks.sweep.driver import Sweep, TrialTemplate
from sweepflow.tasks.sweep.results import SweepResult, TrialResult
from sweepflow.tasks.sweep.resume import (
    RESUME_KEY_ARTIFACT,
    TAG_RESUME_KEY,
    TAG_RESUMES,
    PriorSweep,
    digest,
    find_interrupted_parent,
    load_prior_sweep,
    resume_key,
)
from sweepflow.tasks.sweep.samplers import make_sampler
from sweepflow.tasks.sweep.schedulers import make_scheduler
from sweepflow.tasks.sweep.space import parse_space
from sweepflow.tasks.tracking.links import (
    DESCRIPTION_TAG,
    MlflowLinks,
    leaderboard_markdown,
    markdown_link,
    prefect_flow_run,
    prefect_ui_url,
    sweep_views,
)
from sweepflow.tasks.tracking.runs import (
    RunTracker,
    check_direct_writes,
    direct_storage_uri,
    flatten,
    public_params,
)


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
    logger = get_run_logger()
    stages = _StageTimer()
    prepared = PreparedDataset.from_dict(download_dataset(cfg.data))
    stages.lap("data_s")
    tracker = run_tracker(cfg)
    with parent_run(tracker, cfg, prepared, resume_from=resume_from) as parent:
        logger.info(
            "MLflow parent run %s (if this run is interrupted: sweepflow run --resume %s, same settings)",
            parent,
            parent,
        )
        stages.lap("mlflow_setup_s")
        with cluster_client(
            cfg.dask.scheduler_address,
            use_gpu=cfg.resources.use_gpu,
            n_workers=cfg.dask.n_workers,
            preload=[WORKER_PRELOAD],
        ) as client:
            stages.lap("dask_start_s")
            prior = None
            if resume_from:
                prior = load_prior_sweep(tracker, parent, metric=cfg.selection.metric, mode=cfg.selection.mode)
                logger.info(
                    "resuming pipeline run %s: %d trial(s) ended (read back), %d continue from their checkpoints",
                    parent,
                    len(prior.ended),
                    len(prior.interrupted),
                )
            sweep = build_sweep(cfg, prepared, client, tracker, parent, prior=prior).run()
            stages.lap("sweep_s")
            board, leaderboard_artifact = record_sweep(sweep, tracker, parent, cfg)
            best = sweep.best()
            if best is None:
                raise RuntimeError(
                    f"no trial reported {cfg.selection.metric} ({len(sweep.failed)} of {len(sweep.trials)} "
                    "failed); see the MLflow child runs' sweepflow.error tags"
                )
            tracker.set_tags(
                parent, {"sweepflow.best_trial": best.trial_id, "sweepflow.best_run_id": best.run_id}
            )
            evaluation = evaluate_best(best.best_checkpoint, prepared.path, tracker, [parent, best.run_id], client)
            stages.lap("evaluate_s")
            registration = register_best(
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
            )
            stages.lap("register_s")
            _mark_winner(tracker, cfg, best.run_id, registration)
            views = leaderboard_artifact.publish(
                best_run_id=best.run_id, registered=(registration["name"], registration["version"])
            )
    logger.info("stage timings: %s", stages.timings)
    _log_outcome(logger, cfg, best, evaluation, registration)
    _log_views(logger, cfg, parent, views)
    return {
        "parent_run_id": parent,
        "experiment_id": tracker.experiment_id,
        "tracking_uri": redact(cfg.mlflow.tracking_uri),  # e.g. a database URI from MLFLOW_TRACKING_URI
        "best_trial": best.to_dict(),
        "failed_trials": [t.trial_id for t in sweep.failed],
        "test_metrics": evaluation["metrics"],
        "registration": registration,
        "leaderboard": board.to_dict(orient="records"),
        "usage": sweep.usage(),
        "state_dir": cfg.state_dir,
        "data_path": prepared.path,
        "timings": stages.timings,
        "sweep_seconds": stages.timings["sweep_s"],
        "trials": [t.to_dict() for t in sweep.trials],
    }


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
        max_reports=cfg.scheduler.max_t if cfg.scheduler.type == "asha" else cfg.training.epochs,
        seed=cfg.sweep.seed,
        varying_names=tuple(space.varying_names),
        max_failures=cfg.training.max_failures,
        hang_timeout_s=cfg.training.hang_timeout_s,
        system_metrics_interval_s=cfg.training.system_metrics_interval_s,
    )
    concurrency = cfg.sweep.max_concurrent_trials or fits
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
        scheduler=make_scheduler(cfg.scheduler.as_dict()),
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


@contextlib.contextmanager
def parent_run(
    tracker: RunTracker, cfg: PipelineConfig, prepared: PreparedDataset, *, resume_from: str | None = None
) -> Iterator[str]:
    """The pipeline's MLflow parent run: FINISHED if the block completes, FAILED if it raises. With
    ``resume_from``, that (interrupted) run is reopened instead of a new one started."""
    key = resume_key(cfg.model_dump())
    # Every setting (credentials removed) as one artifact; as params only the few a user filters runs by, so
    # the runs table and compare view are not buried under ~50 settings.
    settings = public_params(flatten("", cfg.model_dump(exclude={"state_dir"})))
    if resume_from:
        parent = _reopen(tracker, resume_from, prepared)
    else:
        parent = tracker.start_run(
            f"pipeline-{flow_run.get_name() or 'local'}",
            params={k: v for k, v in settings.items() if k in PARENT_PARAMS},
            tags={
                "sweepflow.data_checksum": prepared.checksum,
                "sweepflow.dataset": prepared.name,
                "sweepflow.code_version": code_version(),
                "prefect.flow_run_id": str(flow_run.get_id() or ""),
                TAG_RESUME_KEY: digest(key),
                DESCRIPTION_TAG: _flow_run_description(),
            },
        )
        # The settings a resume must share, in full: a refused resume names what differs.
        tmp = os.path.join(cfg.state_dir, "tmp", parent)
        os.makedirs(tmp, exist_ok=True)
        with open(os.path.join(tmp, os.path.basename(RESUME_KEY_ARTIFACT)), "w") as f:
            json.dump(key, f, indent=1, sort_keys=True)
        tracker.log_artifact(parent, f.name, os.path.dirname(RESUME_KEY_ARTIFACT))
        with open(os.path.join(tmp, "pipeline_config.json"), "w") as f:
            json.dump(settings, f, indent=1, sort_keys=True, default=str)
        tracker.log_artifact(parent, f.name, "config")
    status = "FAILED"
    try:
        if cfg.mlflow.artifacts_destination:
            direct = direct_storage_uri(tracker.artifact_uri(parent), cfg.mlflow.artifacts_destination)
            if direct:
                check_direct_writes(tracker, parent, direct)
        yield parent
        status = "FINISHED"
    finally:
        tracker.end_run(parent, status)


def _reopen(tracker: RunTracker, parent: str, prepared: PreparedDataset) -> str:
    """The interrupted parent run, RUNNING again and its resumes counted; the data must be what it trained on."""
    run = tracker.client.get_run(parent)
    trained_on = run.data.tags.get("sweepflow.data_checksum")
    if trained_on != prepared.checksum:
        raise RuntimeError(
            f"resume: the data changed since pipeline run {parent} started (checksum {trained_on}, now "
            f"{prepared.checksum}); its trials cannot be continued on other data. Restore the data source, or "
            "start a new run"
        )
    tracker.set_status(parent, "RUNNING")
    tracker.set_tags(
        parent,
        {
            TAG_RESUMES: int(run.data.tags.get(TAG_RESUMES, 0)) + 1,
            "prefect.flow_run_id": str(flow_run.get_id() or ""),
            DESCRIPTION_TAG: _flow_run_description(),
        },
    )
    return parent


def _sweep_report(
    sweep: SweepResult,
    tracker: RunTracker,
    parent: str,
    cfg: PipelineConfig,
    mlflow_ui: MlflowLinks,
    views: dict[str, str | None],
) -> str | None:
    """The sweep report (learning curves, parallel coordinates, best so far, leaderboard: one self-contained
    HTML page and its PNGs) as the parent run's ``report/`` artifacts; its address in the MLflow UI, if any.
    ``views``: the MLflow views to link, by label."""
    from sweepflow.tasks.reporting.sweep_report import write_sweep_report

    eid = tracker.experiment_id
    links = {
        **views,
        "Prefect flow run": _prefect_flow_run_url(),
        "run_url_template": mlflow_ui.run(eid, "{run_id}"),
    }
    out_dir = os.path.join(cfg.state_dir, "tmp", f"report-{parent}")
    write_sweep_report(
        sweep,
        out_dir=out_dir,
        search_space=cfg.sweep.search_space,
        title=f"Sweep {flow_run.get_name() or parent}: {cfg.data.name}",
        links={k: v for k, v in links.items() if v},
    )
    tracker.log_artifact(parent, out_dir, "report")
    run_page = mlflow_ui.run(eid, parent)
    return f"{run_page}/artifacts/report/sweep_report.html" if run_page else None


def _mark_winner(tracker: RunTracker, cfg: PipelineConfig, run_id: str | None, registration: dict) -> None:
    """Tag the best trial's run as the sweep's winner, its description linking to the model version it became."""
    if not run_id:
        return
    version = markdown_link(
        f"{registration['name']} v{registration['version']}",
        MlflowLinks.for_tracking_uri(cfg.mlflow.tracking_uri).model_version(
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


def _prefect_flow_run_url() -> str | None:
    """This flow run's page in the Prefect UI; None outside a flow run or without an HTTP API."""
    return prefect_flow_run(prefect_ui_url(PREFECT_API_URL.value()), str(flow_run.get_id() or "") or None)


def _flow_run_description() -> str:
    """The parent run's description (markdown in the MLflow UI): a link to the Prefect flow run."""
    flow_run_id = str(flow_run.get_id() or "")
    if not flow_run_id:
        return "Not run by a Prefect flow run."
    return f"Prefect flow run: {markdown_link(flow_run.get_name() or flow_run_id, _prefect_flow_run_url())}"


@dataclass(frozen=True)
class LeaderboardArtifact:
    """The flow run's Prefect markdown artifact ``sweep-leaderboard``: links to the sweep's MLflow views and its
    report, then the leaderboard. Published when the sweep ends, and again (a new version of the same key, the
    one the UI shows) once the best trial is known and registered, with links to both."""

    mlflow_ui: MlflowLinks
    experiment_id: str
    parent_run_id: str
    trial_run_ids: tuple[str, ...]
    report_url: str | None
    table: str

    def publish(
        self, *, best_run_id: str | None = None, registered: tuple[str, str | int] | None = None
    ) -> dict[str, str | None]:
        """Publish (a new version of) the artifact; returns the MLflow views it links, by label."""
        views = sweep_views(
            self.mlflow_ui,
            self.experiment_id,
            parent_run_id=self.parent_run_id,
            trial_run_ids=self.trial_run_ids,
            best_run_id=best_run_id,
            registered=registered,
        )
        links = ["- " + " · ".join(markdown_link(f"MLflow {label}", url) for label, url in views.items())]
        if self.report_url:
            links.append(f"- {markdown_link('sweep report (plots)', self.report_url)}")
        create_markdown_artifact(
            markdown="\n".join(links) + "\n\n" + self.table,
            key="sweep-leaderboard",
            description=f"Trials of MLflow run {self.parent_run_id}",
        )
        return views


def record_sweep(
    sweep: SweepResult, tracker: RunTracker, parent: str, cfg: PipelineConfig
) -> tuple[Any, LeaderboardArtifact]:
    """The leaderboard (CSV artifact on the parent run, markdown artifact in Prefect, published here), the
    sweep's resource totals and best value as parent-run metrics, and its failed trials as a tag. Returns the
    leaderboard and its Prefect artifact (to publish again with the registered version)."""
    board = sweep.leaderboard()
    os.makedirs(os.path.join(cfg.state_dir, "tmp"), exist_ok=True)
    board_path = os.path.join(cfg.state_dir, "tmp", f"leaderboard-{parent}.csv")
    board.to_csv(board_path, index=False)
    tracker.log_artifact(parent, board_path, "leaderboard")
    mlflow_ui = MlflowLinks.for_tracking_uri(cfg.mlflow.tracking_uri)
    eid = tracker.experiment_id
    rows = board.astype(object).where(board.notna(), None).to_dict(orient="records")
    trial_run_ids = tuple(t.run_id for t in sweep.trials if t.run_id)
    views = {
        f"MLflow {label}": url
        for label, url in sweep_views(mlflow_ui, eid, parent_run_id=parent, trial_run_ids=trial_run_ids).items()
    }
    artifact = LeaderboardArtifact(
        mlflow_ui=mlflow_ui,
        experiment_id=eid,
        parent_run_id=parent,
        trial_run_ids=trial_run_ids,
        report_url=_sweep_report(sweep, tracker, parent, cfg, mlflow_ui, views),
        table=leaderboard_markdown(
            rows,
            metric=cfg.selection.metric,
            mode=cfg.selection.mode,
            run_url={str(r["mlflow_run_id"]): mlflow_ui.run(eid, str(r["mlflow_run_id"])) for r in rows},
        ),
    )
    artifact.publish()
    metrics = dict(sweep.usage())
    best = sweep.best()
    if best is not None:
        metrics[f"best_{cfg.selection.metric}"] = best.best
    tracker.log_metrics(parent, metrics, step=0)
    tracker.set_tags(
        parent, {"sweepflow.failed_trials": ",".join(t.trial_id for t in sweep.failed) or "none"}
    )
    return board, artifact


def code_version() -> str:
    """The git commit of the checkout the flow runs from, or "unknown" (e.g. an installed package)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


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
    prefect_run = _prefect_flow_run_url()
    if prefect_run:
        lines.append(f"  {'Prefect flow run:':17} {prefect_run}")
    logger.info("compare the trials in the MLflow UI:\n%s", "\n".join(lines))
