"""One Tune experiment = one Prefect flow run (``tune-experiment``) driving the sweep driver, with one MLflow
parent run and a child run per trial: a script's ``tune.run``/``Tuner.fit`` is recorded exactly like a
deployment's pipeline run.

Services: decided by ``sweepflow.flows.run_services``, as for ``sweepflow run``: ``PREFECT_API_URL``,
``MLFLOW_TRACKING_URI`` and ``DASK_SCHEDULER_ADDRESS`` when set (read once, here, through ``Settings``);
otherwise the background services that ``sweepflow run`` starts and reuses, under ``$SWEEPFLOW_HOME``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ddp_runtime import CheckpointConfig
from ddp_runtime.cluster import cluster_client
from ddp_runtime.config import stop_met
from sweepflow.flows.run_services import use_run_services
from sweepflow.flows.settings import Settings
from sweepflow.tasks.sweep import experiment as sweep_experiment
from sweepflow.tasks.sweep.events import SweepObserver
from sweepflow.tasks.sweep.results import SweepResult, TrialResult
from sweepflow.tasks.sweep.samplers import Sampler
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tasks.sweep.trial_scheduler import Decision, TrialScheduler
from sweepflow.tune._internal.trainable import shared_parameters, sharing, users_code
from sweepflow.tune.class_trainable import ClassTrainableRun
from sweepflow.tune.shared import SharedParameters, SharedValue
from sweepflow.tune.stopper import Stopper, max_reports


class TuneError(RuntimeError):
    """Raised by ``tune.run`` when trials failed (``raise_on_failed_trial=True``, Ray's default)."""


@dataclass(frozen=True)
class TuneRequest:
    """What one ``tune.run`` / ``Tuner.fit`` asked for, checked before any work: lowered (``lowered``) to the one
    ``Experiment`` the pipeline's settings are lowered to too, and run by the same lifecycle."""

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
    objectives: tuple[tuple[str, str], ...] = ()  # a multi-objective search's (metric, mode) pairs (Pareto front)
    resume: str | None = None  # "auto": pick up an interrupted run of it if any; "required": there must be one;
    # "restore" (Tuner.restore): the newest run of it, interrupted or ended
    errored: str = "keep"  # a resumed run's failed trials: "keep" (read back), "resume" or "restart"
    reuse_actors: bool = False  # a class trainable's object is handed to the next trial on its worker
    restore_state: bytes | None = None  # the Tuner's settings, written to <experiment path>/tuner.pkl (Tuner.restore)
    # The script's hooks (hooks.py): its callbacks, and where MLflowLoggerCallback asked the trials recorded
    observer: SweepObserver | None = None
    tracking_uri: str | None = None  # None: MLFLOW_TRACKING_URI, else the tracking server sweepflow starts
    mlflow_experiment: str | None = None  # the MLflow experiment's name (None: the experiment's name)
    # The machine's settings, read from the environment once, where the script's call built the request
    # (tune.run, Tuner.fit, Tuner.get_results: each an entry point); everything below gets them from here.
    settings: Settings = field(default_factory=Settings.from_env)

    @property
    def mlflow_experiment_name(self) -> str:
        """The MLflow experiment the trials are recorded in: ``mlflow_experiment`` when a callback set it,
        else ``name``.
        """
        return self.mlflow_experiment or self.name


class _StopCriteria(TrialScheduler):
    """Tune's ``stop=``: a trial meeting a criterion is complete (DONE); otherwise the scheduler decides."""

    def __init__(self, inner: TrialScheduler, stop: Mapping[str, float] | Callable[[str, dict[str, Any]], bool]):
        super().__init__()
        self.inner, self.stop = inner, stop
        self.stop_reason = inner.stop_reason

    def check_room(self, *, trials: int, at_once: int) -> None:
        self.inner.check_room(trials=trials, at_once=at_once)

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


#: Where a Tune experiment's tracking URI comes from, as the pre-flight check's sentence names it.
TRACKING_FIELD = "tracking_uri (MLflowLoggerCallback / setup_mlflow, else $MLFLOW_TRACKING_URI)"


def run(experiment: TuneRequest) -> tuple[SweepResult, ExperimentRecord]:
    """Run the experiment as a Prefect flow run; returns the sweep's result and where it is recorded."""
    from sweepflow.flows.preflight import check_experiment, script_checks  # not on `import sweepflow.tune`

    settings = experiment.settings
    # The experiment's one pre-flight, as the pipeline's, before any service starts.
    checks = script_checks(
        home=settings.home,
        tracking_uri=experiment.tracking_uri or settings.tracking_uri,
        tracking_field=TRACKING_FIELD,
        prefect_api_url=settings.prefect_api_url,
        storage_path=experiment.storage_path,
        code=users_code(experiment.template),
        metrics=_wanted_metrics(experiment),
    )
    check_experiment(checks)
    if settings.scheduler_address:  # the user's cluster: checked before any service starts too
        _check_on_cluster(experiment, settings.scheduler_address)
    chosen = use_run_services(
        settings, settings.home, tracking_uri=experiment.tracking_uri, use_gpu=experiment.template.use_gpu
    )
    tracking_uri, scheduler_address = chosen.tracking_uri, chosen.scheduler_address
    if scheduler_address and not settings.scheduler_address:  # the local cluster the services started
        _check_on_cluster(experiment, scheduler_address)
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
    # The flow holds the experiment through a box emptied when the run returns: Prefect's background calls keep
    # the flow run's context, and so this flow, alive past its end, and the experiment holds the user's objects
    # (the param space's ray.put refs keep their objects on the cluster while anything holds them).
    held = [experiment, place]
    flow_fn = _flow(lambda **shown: _experiment_flow(*held, **shown))
    try:
        return flow_fn.with_options(flow_run_name=f"{experiment.name}-{time.strftime('%Y%m%d-%H%M%S')}")(
            trainable=experiment.trainable_name,
            num_trials=experiment.sampler.total,
            metric=experiment.metric,
            mode=experiment.mode,
            scheduler=repr(experiment.scheduler),
            search=experiment.search,
        )
    finally:
        held.clear()


def _wanted_metrics(experiment: TuneRequest) -> dict[str, str | None]:
    """The metrics the trials must report, by where the script named them: a scheduler's own first (the
    experiment's metric is the scheduler's when the script named it there only)."""
    scheduler_metric = getattr(experiment.scheduler, "metric", None)
    wanted = {"the scheduler's metric": scheduler_metric}
    if experiment.metric != scheduler_metric:
        wanted["metric"] = experiment.metric
    return wanted


def _check_on_cluster(experiment: TuneRequest, scheduler_address: str) -> None:
    """Before the flow run starts: the cluster's workers import the trainable, and it can hold a trial (and as
    many at once as the scheduler needs), else one sentence naming the setting."""
    # Imported here, as _experiment_flow imports run_experiment: `import sweepflow.tune` loads no lifecycle.
    from sweepflow.flows.preflight import check_script_workers
    from sweepflow.tasks.sweep.placement import fit_trials
    from sweepflow.tasks.training.function import driver_script_dir

    with cluster_client(scheduler_address) as client:
        template = experiment.template
        check_script_workers(client, users_code(template), template.import_dir or driver_script_dir())
        # No log: the lifecycle's place() checks again inside the flow run and says it there, once.
        fit_trials(
            client,
            template,
            _placement(experiment, scheduler_address),
            experiment.scheduler,
            trials=experiment.sampler.total,
            max_concurrent_trials=experiment.max_concurrent_trials,
        )


def results_of(experiment: TuneRequest) -> tuple[list[TrialResult], ExperimentRecord]:
    """The trials of the experiment's newest run (same name, same settings) as MLflow holds them, read without
    running or changing anything (``Tuner.get_results``), and where it is recorded."""
    from mlflow.tracking import MlflowClient

    from sweepflow.tasks.sweep.resume import find_parent, read_trials

    settings = experiment.settings
    chosen = use_run_services(
        settings, settings.home, tracking_uri=experiment.tracking_uri, use_gpu=experiment.template.use_gpu
    )
    client = MlflowClient(chosen.tracking_uri)
    mlflow_experiment = client.get_experiment_by_name(experiment.mlflow_experiment_name)
    experiment_id = mlflow_experiment and mlflow_experiment.experiment_id
    parent = find_parent(client, experiment_id, _experiment_key(experiment), ended="yes")
    if parent is None:
        raise ValueError(
            f"Tuner.get_results: experiment {experiment.name!r} has no run with these settings in the MLflow "
            "tracking server this process uses: fit() it first, or point MLFLOW_TRACKING_URI (and SWEEPFLOW_HOME) "
            "at the services it ran on"
        )
    trials = read_trials(
        client, experiment_id, parent, metric=experiment.metric or "", mode=experiment.mode or "max"
    )
    record = ExperimentRecord(
        tracking_uri=chosen.tracking_uri,
        scheduler_address=chosen.scheduler_address,
        state_dir=settings.home,
        experiment_path=experiment_path(experiment, settings.home),
        experiment_id=experiment_id,
        parent_run_id=parent,
    )
    return trials, record


RESTORE_STATE_FILE = "tuner.pkl"


def experiment_path(exp: TuneRequest, home: str) -> str:
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


def parent_params(exp: TuneRequest) -> dict[str, Any]:
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


def _experiment_key(exp: TuneRequest) -> dict[str, Any]:
    """The settings a resumed Tune experiment must share with the interrupted one (as the pipeline's
    ``sweep.resume.resume_key`` for a pipeline config)."""
    return json.loads(json.dumps({**parent_params(exp), "search_space": exp.search_space}, default=str))


def _interrupted_run(tracking_uri: str, exp: TuneRequest) -> str | None:
    """The interrupted run of this experiment (same name, same settings) to resume; checked before any work."""
    from mlflow.tracking import MlflowClient

    from sweepflow.tasks.sweep.resume import find_parent

    client = MlflowClient(tracking_uri)
    mlflow_experiment = client.get_experiment_by_name(exp.mlflow_experiment_name)
    found = find_parent(
        client,
        mlflow_experiment and mlflow_experiment.experiment_id,
        _experiment_key(exp),
        ended="fallback" if exp.resume == "restore" else "no",
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


def _experiment_flow(exp: TuneRequest, place: ExperimentRecord, **shown: Any) -> tuple[SweepResult, ExperimentRecord]:
    """The experiment's flow run (``shown``: its parameters as the UI shows them, all from ``exp``): the request
    lowered to the one ``Experiment`` both faces run, run by the one lifecycle."""
    from prefect import get_run_logger
    from prefect.runtime import flow_run

    from sweepflow.flows.experiment import run_experiment

    log = get_run_logger().info
    log(f"Experiment path: {place.experiment_path} (Tuner.restore(path, trainable) picks the experiment up from here)")
    run = run_experiment(lowered(exp, place, run_name=flow_run.get_name() or exp.name), log=log)
    recorded = replace(
        place,
        experiment_id=run.experiment_id,
        parent_run_id=run.parent_run_id,
        prefect_flow_run_id=str(flow_run.get_id() or ""),
    )
    return run.sweep, recorded


def lowered(exp: TuneRequest, place: ExperimentRecord, *, run_name: str) -> sweep_experiment.Experiment:
    """The Tune request as the one ``Experiment`` both faces run: its stop rules folded into the scheduler, its
    ranking and retention into the trial template, recorded as a Tune run under ``place``."""
    ends_at = exp.scheduler.max_t or max_reports(exp.stop)
    reuse_token = None
    template = exp.template
    if isinstance(template.train_fn, ClassTrainableRun):  # checkpoint_at_end: the step trials end on
        run = _checkpointed_for(exp.scheduler, template.train_fn.ending_at(ends_at))
        if exp.reuse_actors:
            reuse_token = uuid.uuid4().hex
            run = replace(run, reuse_token=reuse_token)
        template = replace(template, train_fn=run)
    template = replace(
        template,
        selection_metric=exp.metric,
        selection_mode=exp.mode or "max",
        max_reports=ends_at,
        varying_names=exp.varying_names,
        max_failures=exp.max_failures,
        **_retention(exp.checkpoint_config),
    )
    params = parent_params(exp)
    root = place.experiment_path
    return sweep_experiment.Experiment(
        name=exp.name,
        sampler=exp.sampler,
        scheduler=_StopCriteria(exp.scheduler, exp.stop) if exp.stop else exp.scheduler,
        template=template,
        search_space=exp.search_space,
        search_label=f"{exp.search} search",
        placement=_placement(exp, place.scheduler_address),
        recording=sweep_experiment.Recording(
            tracking_uri=place.tracking_uri,
            experiment_name=exp.mlflow_experiment_name,
            run_name=run_name,
            kind="tune",
            params=params,
            settings={
                **params,
                "search_space": exp.search_space,
                "stop": repr(exp.stop),
                "max_failures": exp.max_failures,
            },
            settings_file="tune_experiment.json",
            resume_key=_experiment_key(exp),
            title=f"Tune experiment {exp.name}",
            artifact_root=os.path.join(root, "mlartifacts") if place.tracking_uri.startswith("sqlite:") else None,
        ),
        root_dir=root,
        max_concurrent_trials=exp.max_concurrent_trials,
        time_budget_s=exp.time_budget_s,
        fail_fast=bool(exp.fail_fast),
        resume=sweep_experiment.Resume(place.resume_from, errored=exp.errored) if place.resume_from else None,
        observer=exp.observer,
        on_cluster=functools.partial(_on_cluster, reuse_token=reuse_token),
        objectives=exp.objectives,  # recorded with the sweep (its Pareto front), as the sweep report draws it
    )


@contextlib.contextmanager
def _on_cluster(
    client: Any, template: TrialTemplate, log: Callable[[str], None], *, reuse_token: str | None
) -> Iterator[TrialTemplate]:
    """Around the sweep: ``tune.with_parameters`` objects on every worker once; with ``reuse_actors``, the
    trainable objects the workers kept cleaned up at the end."""
    with _shared_parameters(client, template) as shared, contextlib.ExitStack() as stack:
        if reuse_token is not None:
            stack.callback(_release_reused, client, reuse_token, log)
        yield shared


def _release_reused(client: Any, token: str, log: Callable[[str], None]) -> None:
    """reuse_actors: the objects the workers kept for the experiment's next trials are cleaned up."""
    from sweepflow.tune.class_trainable import release_idle

    released = sum(client.run(release_idle, token).values())
    log(f"reuse_actors: {released} trainable object(s) kept on the workers cleaned up")


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


def _placement(exp: TuneRequest, scheduler_address: str | None) -> sweep_experiment.Placement:
    """How a Tune experiment's trials are fitted onto the cluster: Ray's rule of shared cores on one host, and
    the setting a refusal names."""
    return sweep_experiment.Placement(
        scheduler_address=scheduler_address,
        use_gpu=exp.template.use_gpu,
        share_cores=True,
        asked_by=_asked_by(exp.template),
    )


def _asked_by(template: TrialTemplate) -> str:
    asked = {name.lower(): v for name, v in template.resources_per_rank.items()}
    return f"resources_per_trial / the trainable's resources {asked}"


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
