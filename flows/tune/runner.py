"""One Tune experiment = one Prefect flow run (``tune-experiment``) driving the sweep driver, with one MLflow
parent run and a child run per trial: a script's ``tune.run``/``Tuner.fit`` is recorded exactly like a
deployment's pipeline run.

Services: decided by ``sweepflow.flows.run_services``, as for ``sweepflow run``: ``PREFECT_API_URL``,
``MLFLOW_TRACKING_URI`` and ``DASK_SCHEDULER_ADDRESS`` when set (read once, here, through ``Settings``);
otherwise the background services that ``sweepflow run`` starts and reuses, under ``$SWEEPFLOW_HOME``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ddp_runtime import CheckpointConfig
from ddp_runtime.cluster import cluster_client, groups_that_fit
from ddp_runtime.config import stop_met
from sweepflow.flows.config import Settings
from sweepflow.flows.run_services import use_run_services
from sweepflow.tasks.sweep.events import SweepObserver
from sweepflow.tasks.sweep.results import SweepResult
from sweepflow.tasks.sweep.samplers import Sampler
from sweepflow.tasks.sweep.schedulers import Decision, TrialScheduler
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tune.class_trainable import ClassTrainableRun
from sweepflow.tune.shared import SharedParameters, SharedValue
from sweepflow.tune.stopper import Stopper, max_reports
from sweepflow.tune.trainable import shared_parameters, sharing


class TuneError(RuntimeError):
    """Raised by ``tune.run`` when trials failed (``raise_on_failed_trial=True``, Ray's default)."""


@dataclass(frozen=True)
class Experiment:
    """Everything one ``tune.run`` / ``Tuner.fit`` runs, checked before any work."""

    template: TrialTemplate  # what each trial runs (from the trainable); the runner adds the ranking and retention
    trainable_name: str  # Ray names experiments after it
    sampler: Sampler
    name: str
    scheduler: TrialScheduler  # with the experiment's metric/mode set
    metric: str | None = None
    mode: str | None = None
    stop: Mapping[str, float] | Callable[[str, dict[str, Any]], bool] | None = None
    max_concurrent_trials: int | None = None
    time_budget_s: float | None = None
    max_failures: int = 0
    fail_fast: bool | str = False  # FailureConfig.fail_fast: the first failed trial ends the experiment
    storage_path: str | None = None
    varying_names: tuple[str, ...] = ()  # searched top-level keys (trial names show them)
    searched: tuple[str, ...] = ()  # every searched path, "a/b" for nested keys (the trials table shows them)
    search: str = "random"
    checkpoint_config: CheckpointConfig | None = None  # retention; None: the best by the metric and the latest
    search_space: dict[str, Any] = field(default_factory=dict)  # its top level as data (the sweep report's axes)
    resume: str | None = None  # "auto": pick up an interrupted run of it if any; "required": there must be one;
    # "restore" (Tuner.restore): the newest run of it, interrupted or ended
    errored: str = "keep"  # a resumed run's failed trials: "keep" (read back), "resume" or "restart"
    reuse_actors: bool = False  # a class trainable's object is handed to the next trial on its worker
    restore_state: bytes | None = None  # the Tuner's settings, written to <experiment path>/tuner.pkl (Tuner.restore)
    # The script's hooks (hooks.py): its callbacks, and where MLflowLoggerCallback asked the trials recorded
    observer: SweepObserver | None = None
    tracking_uri: str | None = None  # None: MLFLOW_TRACKING_URI, else the tracking server sweepflow starts
    mlflow_experiment: str | None = None  # the MLflow experiment's name (None: the experiment's name)

    @property
    def mlflow_experiment_name(self) -> str:
        return self.mlflow_experiment or self.name


class _StopCriteria(TrialScheduler):
    """Tune's ``stop=``: a trial meeting a criterion is complete (DONE); otherwise the scheduler decides."""

    def __init__(self, inner: TrialScheduler, stop: Mapping[str, float] | Callable[[str, dict[str, Any]], bool]):
        super().__init__()
        self.inner, self.stop = inner, stop
        self.stop_reason = inner.stop_reason

    def on_trial_add(self, trial_id: str) -> None:
        self.inner.on_trial_add(trial_id)

    def on_trial_config(self, trial_id: str, config: dict[str, Any]) -> dict[str, Any]:
        return self.inner.on_trial_config(trial_id, config)

    def take_exploit(self, trial_id: str) -> Any:
        return self.inner.take_exploit(trial_id)

    def wait_to_resume(self, trial_id: str, give_up: Callable[[], bool]) -> Decision:
        return self.inner.wait_to_resume(trial_id, give_up)

    def no_more_trials(self, total: int) -> None:
        self.inner.no_more_trials(total)

    def on_trial_result(self, trial_id: str, result: Mapping[str, Any]) -> Decision:
        decision = self.inner.on_trial_result(trial_id, result)
        if stop_met(self.stop, trial_id, result):
            decision = Decision.DONE
        if isinstance(self.stop, Stopper) and self.stop.stop_all():
            return Decision.STOP_ALL
        return decision

    def on_trial_complete(self, trial_id: str, result: Mapping[str, Any] | None) -> None:
        self.inner.on_trial_complete(trial_id, result)

    def on_trial_error(self, trial_id: str) -> None:
        self.inner.on_trial_error(trial_id)


@dataclass(frozen=True)
class ExperimentRecord:
    """Where an experiment runs and is recorded: decided at the entry point, before its flow run (the services,
    the run it resumes, its path), then where its flow run recorded it."""

    tracking_uri: str
    scheduler_address: str | None
    state_dir: str
    experiment_path: str  # Ray's experiment path: what Tuner.restore(path) takes
    resume_from: str | None = None  # the MLflow parent run of the interrupted run it resumes
    experiment_id: str | None = None  # the MLflow experiment, once recorded
    parent_run_id: str | None = None
    prefect_flow_run_id: str | None = None


def run(experiment: Experiment) -> tuple[SweepResult, ExperimentRecord]:
    """Run the experiment as a Prefect flow run; returns the sweep's result and where it is recorded."""
    settings = Settings.from_env()
    chosen = use_run_services(
        settings, settings.home, tracking_uri=experiment.tracking_uri, use_gpu=experiment.template.use_gpu
    )
    tracking_uri, scheduler_address = chosen.tracking_uri, chosen.scheduler_address
    if scheduler_address:  # a trial the cluster can never hold is refused before the flow run starts
        with cluster_client(scheduler_address) as client:
            _, fits = _placement(client, experiment.template, log=None)
        _whole_population_fits(experiment, fits)
    resume_from = _interrupted_run(tracking_uri, experiment) if experiment.resume else None
    path = experiment_path(experiment, settings.home)
    if experiment.restore_state is not None:
        save_restore_state(path, experiment.restore_state)
    place = ExperimentRecord(
        tracking_uri=tracking_uri,
        scheduler_address=scheduler_address,
        state_dir=settings.home,
        experiment_path=path,
        resume_from=resume_from,
    )
    # The flow's parameters are what the Prefect UI shows of the experiment; the experiment itself (functions,
    # schedulers, searchers) goes to the flow function directly, in this process.
    flow_fn = _flow(lambda **shown: _experiment_flow(experiment, place, **shown))
    return flow_fn.with_options(flow_run_name=f"{experiment.name}-{time.strftime('%Y%m%d-%H%M%S')}")(
        trainable=experiment.trainable_name,
        num_trials=experiment.sampler.total,
        metric=experiment.metric,
        mode=experiment.mode,
        scheduler=repr(experiment.scheduler),
        search=experiment.search,
    )


RESTORE_STATE_FILE = "tuner.pkl"


def experiment_path(exp: Experiment, home: str) -> str:
    """Where the experiment keeps its files (staging, local artifacts, the Tuner's settings): Ray's experiment
    path, which ``Tuner.restore(path)`` takes."""
    return os.path.join(exp.storage_path or os.path.join(home, "tune"), exp.name)


def save_restore_state(path: str, state: bytes) -> None:
    """The Tuner's settings at ``path`` (local or a remote URL), written whole or not at all."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    fs.makedirs(root, exist_ok=True)
    target = f"{root.rstrip('/')}/{RESTORE_STATE_FILE}"
    with fs.open(target + ".part", "wb") as f:
        f.write(state)
    fs.mv(target + ".part", target)


def load_restore_state(path: str) -> bytes | None:
    """The settings ``save_restore_state`` wrote at ``path``; None when there are none."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    target = f"{root.rstrip('/')}/{RESTORE_STATE_FILE}"
    if not fs.exists(target):
        return None
    with fs.open(target, "rb") as f:
        return f.read()


def parent_params(exp: Experiment) -> dict[str, Any]:
    """The experiment's parent-run params: what its runs are compared by, and (with its search space) what a
    resumed run must share with the interrupted one."""
    return {
        "trainable": exp.trainable_name,
        "num_trials": exp.sampler.total,
        "metric": exp.metric,
        "mode": exp.mode,
        "scheduler": repr(exp.scheduler),
        "search": exp.search,
        "ranks_per_trial": exp.template.num_ranks,
        "resources_per_rank": exp.template.resources_per_rank,
    }


def _experiment_key(exp: Experiment) -> dict[str, Any]:
    """The settings a resumed Tune experiment must share with the interrupted one (as the pipeline's
    ``sweep.resume.resume_key`` for a pipeline config)."""
    return json.loads(json.dumps({**parent_params(exp), "search_space": exp.search_space}, default=str))


def _interrupted_run(tracking_uri: str, exp: Experiment) -> str | None:
    """The interrupted run of this experiment (same name, same settings) to resume; checked before any work."""
    from mlflow.tracking import MlflowClient

    from sweepflow.tasks.sweep.resume import latest_interrupted

    client = MlflowClient(tracking_uri)
    mlflow_experiment = client.get_experiment_by_name(exp.mlflow_experiment_name)
    found = latest_interrupted(
        client,
        mlflow_experiment and mlflow_experiment.experiment_id,
        _experiment_key(exp),
        finished_too=exp.resume == "restore",
    )
    if found is None and exp.resume == "required":
        raise ValueError(
            f"resume=True: experiment {exp.name!r} has no interrupted run with these settings to resume; run it "
            "with resume='AUTO' (resume if there is one, else start) or without resume"
        )
    if found is None and exp.resume == "restore":
        raise ValueError(
            f"Tuner.restore: experiment {exp.name!r} has no run with these settings in the MLflow tracking server "
            "this process uses: point MLFLOW_TRACKING_URI (and SWEEPFLOW_HOME) at the services the experiment ran "
            "on, or start it anew with Tuner(...).fit()"
        )
    return found


def _flow(body: Callable[..., tuple[SweepResult, ExperimentRecord]]) -> Any:
    """The ``tune-experiment`` flow running ``body`` (the experiment at hand) with what the UI shows as its
    parameters."""
    from prefect import flow

    from sweepflow.tasks.compat import stop_flow_heartbeats_promptly

    stop_flow_heartbeats_promptly()  # else each experiment's end waits up to 1 s for its heartbeat thread

    def tune_experiment(
        trainable: str, num_trials: int, metric: str | None, mode: str | None, scheduler: str, search: str
    ) -> tuple[SweepResult, ExperimentRecord]:
        """A Tune experiment: its trials as one DDP group each, one task run and one MLflow child run per trial."""
        return body(
            trainable=trainable, num_trials=num_trials, metric=metric, mode=mode, scheduler=scheduler, search=search
        )

    return flow(name="tune-experiment", log_prints=True)(tune_experiment)


def _experiment_flow(exp: Experiment, place: ExperimentRecord, **shown: Any) -> tuple[SweepResult, ExperimentRecord]:
    """The experiment's flow run (``shown``: its parameters as the UI shows them, all from ``exp``)."""
    from prefect import get_run_logger
    from prefect.runtime import flow_run

    from sweepflow.tasks.recording import ParentRun, SweepRecord, parent_run, record_sweep
    from sweepflow.tasks.sweep.driver import Sweep
    from sweepflow.tasks.sweep.resume import load_prior_sweep
    from sweepflow.tasks.tracking.runs import RunTracker

    log = get_run_logger().info
    tracking_uri = place.tracking_uri
    local_store = tracking_uri.startswith("sqlite:")
    root = place.experiment_path
    log(f"Experiment path: {root} (Tuner.restore(path, trainable) picks the experiment up from here)")
    tracker = RunTracker(tracking_uri, exp.mlflow_experiment_name, artifact_root=os.path.join(root, "mlartifacts") if local_store else None)
    params = parent_params(exp)
    scratch = os.path.join(root, "tmp")
    spec = ParentRun(
        name=flow_run.get_name() or exp.name,
        params=params,
        tags={"sweepflow.kind": "tune"},
        settings={**params, "search_space": exp.search_space, "stop": repr(exp.stop), "max_failures": exp.max_failures},
        settings_file="tune_experiment.json",
        resume_key=_experiment_key(exp),
        scratch_dir=scratch,
    )
    resume_from = place.resume_from
    with cluster_client(place.scheduler_address, use_gpu=exp.template.use_gpu) as client:
        placed, fits = _placement(client, exp.template, log=log)
        _whole_population_fits(exp, fits)
        with parent_run(tracker, spec, resume_from=resume_from) as parent:
            prior = None
            if resume_from:
                prior = load_prior_sweep(
                    tracker, parent, metric=exp.metric or "", mode=exp.mode or "max", errored=exp.errored
                )
                restarted = sum(1 for t in prior.interrupted if t.restart)
                log(
                    f"resuming experiment run {parent}: {len(prior.ended)} trial(s) ended (read back), "
                    f"{len(prior.interrupted) - restarted} continue from their checkpoints, {restarted} failed "
                    "one(s) start over"
                )
            with _shared_parameters(client, placed) as shared, contextlib.ExitStack() as stack:
                ends_at = exp.scheduler.max_t or max_reports(exp.stop)
                if isinstance(shared.train_fn, ClassTrainableRun):  # checkpoint_at_end: the step trials end on
                    shared = replace(shared, train_fn=_checkpointed_for(exp.scheduler, shared.train_fn.ending_at(ends_at)))
                    if exp.reuse_actors:
                        shared = replace(shared, train_fn=replace(shared.train_fn, reuse_token=uuid.uuid4().hex))
                        stack.callback(_release_reused, client, shared.train_fn.reuse_token, log)
                sweep = Sweep(
                    sampler=exp.sampler,
                    template=replace(
                        shared,
                        selection_metric=exp.metric,
                        selection_mode=exp.mode or "max",
                        max_reports=ends_at,
                        varying_names=exp.varying_names,
                        max_failures=exp.max_failures,
                        **_retention(exp.checkpoint_config),
                    ),
                    cluster=client,
                    tracker=tracker,
                    parent_run_id=parent,
                    scheduler=_StopCriteria(exp.scheduler, exp.stop) if exp.stop else exp.scheduler,
                    concurrency=min(exp.max_concurrent_trials or fits, fits),
                    staging_dir=os.path.join(root, "staging"),
                    time_budget_s=exp.time_budget_s,
                    prior=prior,
                    fail_fast=bool(exp.fail_fast),
                    log=log,
                    observer=exp.observer,
                ).run()
            # Recorded as a pipeline run's sweep is: leaderboard (MLflow + Prefect, with links), report, totals.
            record = SweepRecord(
                metric=exp.metric,
                mode=exp.mode or "max",
                search_space=exp.search_space,
                title=f"Tune experiment {exp.name}",
                tracking_uri=tracking_uri,
                scratch_dir=scratch,
            )
            _, leaderboard = record_sweep(sweep, tracker, parent, record)
            best = sweep.best() if exp.metric else None
            if best is not None:
                tracker.set_tags(parent, {"sweepflow.best_trial": best.trial_id, "sweepflow.best_run_id": best.run_id})
                leaderboard.publish(best_run_id=best.run_id)
    recorded = replace(
        place,
        experiment_id=tracker.experiment_id,
        parent_run_id=parent,
        prefect_flow_run_id=str(flow_run.get_id() or ""),
    )
    return sweep, recorded


def _release_reused(client: Any, token: str, log: Callable[[str], None]) -> None:
    """reuse_actors: the objects the workers kept for the experiment's next trials are cleaned up."""
    from sweepflow.tune.class_trainable import release_idle

    released = sum(client.run(release_idle, token).values())
    log(f"reuse_actors: {released} trainable object(s) kept on the workers cleaned up")


def _whole_population_fits(exp: Experiment, fits: int) -> None:
    exp.scheduler.check_room(trials=exp.sampler.total, at_once=min(exp.max_concurrent_trials or fits, fits))


def _checkpointed_for(scheduler: TrialScheduler, run: ClassTrainableRun) -> ClassTrainableRun:
    """A class trainable under PBT or HyperBand is checkpointed by itself (Ray saves one when the scheduler asks;
    here it must already be there): every ``perturbation_interval`` steps for PBT (counted in steps), else every
    step; a frequency the user gave stays."""
    every = scheduler.checkpoint_every()
    if run.checkpoint_frequency or every is None:
        return run
    return replace(run, checkpoint_frequency=every)


def _retention(checkpoint: CheckpointConfig | None) -> dict[str, Any]:
    """A Tune checkpoint config as the trial template's retention fields (none given: the template's)."""
    if checkpoint is None:
        return {}
    return {
        "checkpoints_to_keep": checkpoint.num_to_keep,
        "checkpoint_score": checkpoint.checkpoint_score_attribute,
        "checkpoint_score_mode": checkpoint.checkpoint_score_order if checkpoint.checkpoint_score_attribute else None,
    }


def _placement(client: Any, template: TrialTemplate, *, log: Callable[[str], None] | None) -> tuple[TrialTemplate, int]:
    """The template with its resources as this cluster grants them, and how many trials run at once; raises,
    naming the setting to change, when none fits."""
    template, shared_cores = _share_cores(client, template)
    if shared_cores is not None and log is not None:
        log(
            f"each trial asks {template.threads_per_rank} CPUs per rank, more than one Dask worker here declares: "
            f"as Ray does on one machine, its ranks use {template.threads_per_rank} threads and {shared_cores} "
            "trial(s) run at once, so the host's cores are shared, not oversubscribed"
        )
    resources = _dask_resources(client, template)
    fits = _fits(client, template, resources)
    return replace(template, resources_per_rank=resources), min(fits, shared_cores or fits)


def _share_cores(client: Any, template: TrialTemplate) -> tuple[TrialTemplate, int | None]:
    """Ray fits a trial that asks more CPUs than one Dask worker declares when the machine has them (a trial
    asking {"cpu": 2} runs on a 2-core laptop, one at a time): when every worker is on one host and their CPUs
    add up to a trial's, each rank reserves one worker's CPUs, runs ``asked`` torch threads, and the trials
    running at once are capped by the host's CPUs (the cap returned; None when nothing was changed). Across hosts
    a rank cannot use another host's cores, so such a trial is refused by ``_fits`` with the fix."""
    asked = template.resources_per_rank.get("CPU", 0.0)
    workers = list(client.scheduler_info()["workers"].values())
    cpus = [float((w.get("resources") or {}).get("CPU", 0.0)) for w in workers]
    if not asked or not cpus or max(cpus) >= asked or len({w.get("host") for w in workers}) != 1:
        return template, None
    at_once = int(sum(cpus) // (asked * template.num_ranks))
    if at_once < 1 or template.num_ranks > len(workers):
        return template, None  # the host has not the cores: refused by _fits
    granted = {**template.resources_per_rank, "CPU": max(cpus)}
    return replace(template, resources_per_rank=granted, threads_per_rank=max(1, math.ceil(asked))), at_once


def _dask_resources(client: Any, template: TrialTemplate) -> dict[str, float]:
    """The template's per-rank resources as this cluster can grant them: GPU always; CPU only when the workers
    declare it (otherwise a worker is one slot, its threads the CPUs a rank gets)."""
    declared = {name for w in client.scheduler_info()["workers"].values() for name in (w.get("resources") or {})}
    return {name: v for name, v in template.resources_per_rank.items() if name != "CPU" or "CPU" in declared}


def _fits(client: Any, template: TrialTemplate, resources: dict[str, float]) -> int:
    """How many trials run at once; raises, naming the setting to change, when none fits."""
    import ddp_runtime as train

    scaling = train.ScalingConfig(
        num_workers=template.num_ranks, use_gpu=template.use_gpu, resources_per_worker=resources or None
    )
    asked = {name.lower(): v for name, v in template.resources_per_rank.items()}
    return groups_that_fit(client, scaling, what=f"resources_per_trial / the trainable's resources {asked}")


@contextlib.contextmanager
def _shared_parameters(client: Any, template: TrialTemplate) -> Iterator[TrialTemplate]:
    """``tune.with_parameters`` objects go to every worker once (a worker plugin); trials read the worker's copy."""
    parameters = shared_parameters(template)
    if not parameters:
        yield template
        return
    plugin = SharedParameters(parameters)
    client.register_plugin(plugin, name=plugin.name)
    try:
        yield sharing(template, {name: SharedValue(plugin.name, name) for name in parameters})
    finally:
        client.unregister_worker_plugin(plugin.name)
