"""The training pipeline flow: data -> sweep (DDP trials on Dask, ASHA) -> best trial -> test -> registry.

Thin on purpose: each stage is a task in ``tasks/``; this module composes them and owns the paired set-up and
tear-down of the run's resources (the Dask client, the MLflow parent run).
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pandas as pd
from distributed import Client
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run
from sweepflow.flows.config import PipelineConfig, resolve_settings
from sweepflow.services.local import WORKER_PRELOAD
from sweepflow.tasks.datasets import DataConfig, PreparedDataset
from sweepflow.tasks.download import download_dataset
from sweepflow.tasks.finalize import evaluate_best, register_best
from sweepflow.tasks.sweep.schedulers import make_scheduler
from sweepflow.tasks.sweep.space import TPESampler, describe_trial, generate_trials, parse_space
from sweepflow.tasks.tracking.runs import RunTracker, check_direct_writes, direct_storage_uri, flatten
from sweepflow.tasks.trial import (
    COMPLETED,
    FAILED,
    NOT_STARTED,
    STOPPED,
    SweepProgress,
    SweepRuntime,
    TrainFunction,
    TrialSlots,
    TrialSpec,
    registered_runtime,
    run_trial,
)

import ddp_runtime as train
from ddp_runtime.cluster import gpu_local_cluster, local_cluster, max_concurrent_groups

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def dask_client(cfg: PipelineConfig) -> Iterator[Client]:
    """The configured scheduler, or a local cluster for this run (one worker per core, or per GPU)."""
    if cfg.dask.scheduler_address:
        client = Client(cfg.dask.scheduler_address)
        try:
            yield client
        finally:
            client.close()
        return
    if cfg.resources.use_gpu:
        with gpu_local_cluster() as client:
            yield client
        return
    with local_cluster(n_workers=cfg.dask.n_workers, preload=[WORKER_PRELOAD]) as client:
        yield client


def code_version() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def leaderboard(results: list[dict[str, Any]], metric: str, mode: str) -> pd.DataFrame:
    """One row per trial (config, last/best metrics, status, epochs), best first — like Ray's
    ``ResultGrid.get_dataframe()``."""
    rows = []
    for r in results:
        row = {"trial": r["trial_id"], "status": r["status"], "epochs": r["epochs"]}
        row.update({f"config/{k}": v for k, v in r["params"].items()})
        row.update({k: v for k, v in r["last"].items() if k not in ("training_iteration",)})
        row[f"best_{metric}"] = r["best"]
        row["mlflow_run_id"] = r["run_id"]
        rows.append(row)
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame = frame.sort_values(f"best_{metric}", ascending=(mode == "min"), na_position="last")
    return frame.reset_index(drop=True)


def _sweep(
    cfg: PipelineConfig, prepared: PreparedDataset, client: Client, tracker: RunTracker, parent_run_id: str
) -> list[dict[str, Any]]:
    logger = get_run_logger()
    TrainFunction(cfg.training.train_fn)  # a missing training module fails here, before any trial starts
    space = parse_space(cfg.sweep.search_space)
    # Where trial configs come from: a list made up front (random, grid), or TPE proposing each next config
    # from the results so far (told as trials finish).
    tpe = None
    if cfg.sweep.sampler == "tpe":
        tpe = TPESampler(space, mode=cfg.selection.mode, seed=cfg.sweep.seed)
        configs = None
        total = cfg.sweep.num_samples
    else:
        configs = generate_trials(
            space, sampler=cfg.sweep.sampler, num_samples=cfg.sweep.num_samples, seed=cfg.sweep.seed
        )
        total = len(configs)
    scaling = train.ScalingConfig(
        num_workers=cfg.resources.ranks_per_trial,
        use_gpu=cfg.resources.use_gpu,
        resources_per_worker=cfg.resources.resources_per_rank() or None,
    )
    fits = max_concurrent_groups(client, scaling)
    if fits < 1:
        raise train.InsufficientResourcesError(
            f"no trial fits on this Dask cluster: each needs {scaling.num_workers} workers with "
            f"{scaling.worker_resources or 'a free thread'}; lower resources.ranks_per_trial or add workers"
        )
    concurrency = min(cfg.sweep.max_concurrent_trials or fits, total)
    logger.info(
        "sweep: %d trials (%s sampler), %d at a time (cluster fits %d), %d rank(s) each",
        total,
        cfg.sweep.sampler,
        concurrency,
        fits,
        scaling.num_workers,
    )

    def next_trial(i: int) -> tuple[TrialSpec, int | None]:
        """The i-th trial's spec, and its TPE trial number (None for list samplers)."""
        number, params = tpe.ask() if tpe is not None else (None, configs[i])
        trial_id = f"trial_{i:04d}"
        spec = TrialSpec(
            trial_id=trial_id,
            index=i,
            name=f"{trial_id}-{describe_trial(params, space.varying_names)}",
            params=params,
            train_fn=cfg.training.train_fn,
            train_loop_config={
                **cfg.training.base_config,
                "model": cfg.training.model,
                **params,
                "epochs": cfg.training.epochs,
                "data_path": prepared.path,
                "seed": cfg.sweep.seed + i,
            },
            num_ranks=scaling.num_workers,
            resources_per_rank=scaling.worker_resources,
            use_gpu=cfg.resources.use_gpu,
            selection_metric=cfg.selection.metric,
            selection_mode=cfg.selection.mode,
            max_reports=cfg.scheduler.max_t if cfg.scheduler.type == "asha" else cfg.training.epochs,
        )
        return spec, number

    progress = SweepProgress(cfg.selection.metric, cfg.selection.mode, total, log=logger.info)
    deadline = time.monotonic() + cfg.sweep.time_budget_s if cfg.sweep.time_budget_s else None
    runtime = SweepRuntime(
        client=client,
        slots=TrialSlots(concurrency),
        scheduler=make_scheduler(cfg.scheduler.as_dict()),
        tracker=tracker,
        parent_run_id=parent_run_id,
        progress=progress,
        staging_dir=os.path.join(cfg.state_dir, "staging"),
        deadline=deadline,
        artifacts_destination=cfg.mlflow.artifacts_destination,
    )
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as cleanup, registered_runtime(runtime) as runtime_id:
        # Before the parent run closes, even on errors: every trial's queued MLflow writes are done.
        cleanup.callback(runtime.join_writers)
        # The loop wakes when a trial task ends and when a queued trial takes its slot; both go through
        # this queue (a finished task's future, or None).
        events: queue.Queue[Any] = queue.Queue()
        runtime.slots.on_acquire = lambda: events.put(None)
        started = 0
        in_flight: dict[Any, tuple[float, int | None]] = {}  # task future -> (submitted at, TPE number)
        while started < total or in_flight:
            out_of_time = deadline is not None and time.monotonic() > deadline
            # Keep one trial queued beyond those running: it opens its MLflow run and waits for a slot, so it
            # starts the moment a running trial's final report is answered (see TrialSlots).
            while (
                started < total
                and (started < concurrency + 1 or started - runtime.slots.acquired < 1)
                and not out_of_time
            ):
                spec, number = next_trial(started)
                started += 1
                future = run_trial.with_options(task_run_name=spec.name).submit(spec, runtime_id)
                in_flight[future] = (time.perf_counter(), number)
                future.add_done_callback(events.put)
            if out_of_time and started < total:
                logger.warning("time budget spent: %d trial(s) not started", total - started)
                total = started
            if not in_flight:
                break
            done = events.get()
            if done is None or done not in in_flight:
                continue  # a slot was taken: maybe queue the next trial
            submitted_at, number = in_flight.pop(done)
            result = done.result()
            if result["status"] == NOT_STARTED:
                continue  # queued when the time budget ran out; its MLflow run was deleted
            if tpe is not None:  # early-stopped trials count with the best value they reached, as in Ray
                tpe.tell(number, result["best"] if result["status"] != FAILED else None)
            # Per-trial bookkeeping: Prefect task run + MLflow child run + group start/stop, i.e. the trial's
            # wall time minus its wait for a slot and the time spent inside the training function.
            result["bookkeeping_s"] = (
                time.perf_counter() - submitted_at - result["slot_wait_s"] - result["train_time_s"]
            )
            results.append(result)
    return results


@flow(name="training-pipeline", log_prints=True)
def training_pipeline(config: PipelineConfig = PipelineConfig()) -> dict[str, Any]:  # noqa: B008 - pydantic default
    """Download data, sweep hyperparameters with DDP trials and ASHA, evaluate and register the best model."""
    cfg = resolve_settings(config)
    logger = get_run_logger()
    timings: dict[str, float] = {}
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        timings[name] = round(now - mark, 3)
        mark = now

    prepared = PreparedDataset.from_dict(
        download_dataset(
            DataConfig(
                name=cfg.data.name,
                source=cfg.data.source,
                cache_dir=cfg.data.cache_dir,
                val_fraction=cfg.data.val_fraction,
                test_fraction=cfg.data.test_fraction,
                seed=cfg.data.seed,
            )
        )
    )
    lap("data_s")
    default_store = cfg.mlflow.tracking_uri.startswith("sqlite:")
    tracker = RunTracker(
        cfg.mlflow.tracking_uri,
        cfg.mlflow.experiment_name,
        artifact_root=os.path.join(cfg.state_dir, "mlartifacts") if default_store else None,
    )
    parent = tracker.start_run(
        f"pipeline-{flow_run.get_name() or 'local'}",
        params=flatten("", cfg.model_dump(exclude={"state_dir"})),
        tags={
            "sweepflow.data_checksum": prepared.checksum,
            "sweepflow.dataset": prepared.name,
            "sweepflow.code_version": code_version(),
            "prefect.flow_run_id": str(flow_run.get_id() or ""),
        },
    )
    status = "FAILED"
    resources = contextlib.ExitStack()  # the Dask client: open for the sweep, evaluation and registration
    try:
        if cfg.mlflow.artifacts_destination:
            direct = direct_storage_uri(tracker.artifact_uri(parent), cfg.mlflow.artifacts_destination)
            if direct:
                check_direct_writes(tracker, parent, direct)
        lap("mlflow_setup_s")
        client = resources.enter_context(dask_client(cfg))
        lap("dask_start_s")
        results = _sweep(cfg, prepared, client, tracker, parent)
        lap("sweep_s")
        board = leaderboard(results, cfg.selection.metric, cfg.selection.mode)
        os.makedirs(os.path.join(cfg.state_dir, "tmp"), exist_ok=True)
        board_path = os.path.join(cfg.state_dir, "tmp", f"leaderboard-{parent}.csv")
        board.to_csv(board_path, index=False)
        tracker.log_artifact(parent, board_path, "leaderboard")
        create_table_artifact(
            table=board.astype(object).where(board.notna(), None).to_dict(orient="records"),
            key="sweep-leaderboard",
            description=f"Trials of MLflow run {parent}, best first by {cfg.selection.metric}",
        )
        failed = [r["trial_id"] for r in results if r["status"] == FAILED]
        candidates = [r for r in results if r["status"] in (COMPLETED, STOPPED) and r["best"] is not None]
        if not candidates:
            raise RuntimeError(
                f"every trial failed ({failed}); see the MLflow child runs' sweepflow.error tags"
            )
        pick = max if cfg.selection.mode == "max" else min
        best = pick(candidates, key=lambda r: r["best"])
        tracker.set_tags(
            parent,
            {
                "sweepflow.best_trial": best["trial_id"],
                "sweepflow.best_run_id": best["run_id"],
                "sweepflow.failed_trials": ",".join(failed) or "none",
            },
        )
        tracker.log_metrics(parent, {f"best_{cfg.selection.metric}": best["best"]}, step=0)
        evaluation = evaluate_best(best["best_checkpoint"], prepared.path, tracker, parent, client)
        test_value = evaluation["metrics"][cfg.selection.champion_metric]
        lap("evaluate_s")
        registration = register_best(
            best["best_checkpoint"],
            prepared.path,
            client=client,
            tracking_uri=cfg.mlflow.tracking_uri,
            parent_run_id=parent,
            registered_model_name=cfg.mlflow.registered_model_name,
            metric_name=cfg.selection.champion_metric,
            metric_value=test_value,
            higher_is_better=cfg.selection.champion_mode == "max",
            tags={"sweepflow.best_trial": best["trial_id"], "sweepflow.data_checksum": prepared.checksum},
        )
        lap("register_s")
        status = "FINISHED"
        logger.info("stage timings: %s", timings)
        logger.info(
            "best trial %s: %s=%.4f; test %s=%.4f; registered %s v%s%s",
            best["trial_id"],
            cfg.selection.metric,
            best["best"],
            cfg.selection.champion_metric,
            test_value,
            registration["name"],
            registration["version"],
            " (new champion)" if registration["became_champion"] else " (champion unchanged)",
        )
        return {
            "parent_run_id": parent,
            "experiment_id": tracker.experiment_id,
            "tracking_uri": cfg.mlflow.tracking_uri,
            "best_trial": best,
            "failed_trials": failed,
            "test_metrics": evaluation["metrics"],
            "registration": registration,
            "leaderboard": board.to_dict(orient="records"),
            "state_dir": cfg.state_dir,
            "data_path": prepared.path,
            "timings": timings,
            "sweep_seconds": timings["sweep_s"],
            "trials": results,
        }
    finally:
        resources.close()
        tracker.end_run(parent, status)
