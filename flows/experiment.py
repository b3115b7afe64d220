"""The one lifecycle of an experiment, run inside either entry flow (``training-pipeline``, ``tune-experiment``):

    cluster -> placement (a trial that cannot fit is refused) -> MLflow parent run (new, or the interrupted one
    reopened) -> the sweep -> its record (leaderboard, report, totals) -> the best trial named -> evaluated and
    registered when asked -> the views published

Each step is a library object or task from ``sweepflow.tasks``; this module pairs the set-up and tear-down of
the experiment's resources (the Dask client, the parent run) and times the stages.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddp_runtime.cluster import cluster_client
from sweepflow.tasks.finalize import (
    evaluate_best,
    log_confusion_matrix,
    mark_winner,
    register_best,
    warm_finalizer,
)
from sweepflow.tasks.recording import ParentRun, SweepRecord, parent_run, record_sweep
from sweepflow.tasks.sweep.driver import Sweep
from sweepflow.tasks.sweep.experiment import Experiment, Finalize
from sweepflow.tasks.sweep.placement import fit_trials
from sweepflow.tasks.sweep.results import SweepResult, TrialResult
from sweepflow.tasks.sweep.resume import PriorSweep, load_prior_sweep
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tasks.tracking.runs import RunTracker, TrackingServerError, TrackingServerUnavailable

#: A tracking server's own failure during the stages after the sweep: said as the service's, not the project's.
_SERVICE_ERRORS = (TrackingServerError, TrackingServerUnavailable)


@dataclass(frozen=True)
class ExperimentRun:
    """What an experiment's run produced, and where it is recorded."""

    sweep: SweepResult
    experiment_id: str
    parent_run_id: str
    best: TrialResult | None  # None: no trial reported the metric (or the experiment ranks by none)
    board: Any  # the leaderboard (a DataFrame, best first)
    report_url: str | None
    views: dict[str, str | None]  # the MLflow views the flow run's artifact links, by label
    timings: dict[str, float]  # seconds per stage
    evaluation: dict[str, Any] | None = None  # Finalize: the test-set metrics
    registration: dict[str, Any] | None = None  # Finalize: the registered model version
    view_key: str | None = None  # the sweep's saved view of MLflow's runs page (links.sweep_view_state)




class AfterSweepFailed(RuntimeError):
    """A stage after the sweep (evaluation, building the model, registration) failed: the sweep's trials are
    recorded under ``parent_run_id``, and resuming that run finishes it without training again. ``str()`` is
    one sentence: the stage, the function, what went wrong and the fix; ``finish(command)`` ends it with the
    command that resumes."""

    def __init__(self, stage: str, problem: str, parent_run_id: str, trials: int) -> None:
        self.stage, self.problem, self.parent_run_id, self.trials = stage, problem, parent_run_id, trials
        super().__init__(self.finish(f"sweepflow run --resume {parent_run_id} (same settings)"))

    def finish(self, command: str) -> str:
        return (
            f"{self.stage} failed after the sweep: {self.problem.rstrip('.')}; the sweep's {self.trials} trial(s) "
            f"are recorded in MLflow run {self.parent_run_id}: fix it, then finish the run without training "
            f"again: {command}"
        )


def _failure(what: str, exc: BaseException, project_dir: str | None) -> str:
    """What went wrong in one clause: a message that names the function already (ours) as it is, anything else
    as ``<what> raised <type>: <message> (<file>:<line> of the project's code, where it was raised)``."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if text.startswith(("training.model_fn=", "evaluation.evaluate_fn=")):
        return text
    where = _raised_at(exc, project_dir)
    return f"{what} raised {type(exc).__name__}: {text}" + (f" ({where})" if where else "")


def _raised_at(exc: BaseException, project_dir: str | None) -> str | None:
    """``file:line`` of the innermost frame of ``exc``'s traceback in the project's directory, if any."""
    import traceback

    if not project_dir:
        return None
    root = os.path.realpath(project_dir)
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if os.path.realpath(f.filename).startswith(root + os.sep)
    ]
    if not frames:
        return None
    return f"{os.path.relpath(os.path.realpath(frames[-1].filename), root)}:{frames[-1].lineno}"


class EvaluationMismatch(AfterSweepFailed, ValueError):
    """The evaluation did not report the metric that decides the champion: nothing is registered (a setting to
    change: the command exits 2)."""


class NoBestTrial(RuntimeError):
    """No trial reported the selection metric: there is nothing to evaluate or register."""


def tracker_for(exp: Experiment) -> RunTracker:
    rec = exp.recording
    return RunTracker(rec.tracking_uri, rec.experiment_name, artifact_root=rec.artifact_root)


def run_experiment(exp: Experiment, *, log: Callable[[str], None]) -> ExperimentRun:
    """Run ``exp`` from its cluster to its published record; see the module's docstring. ``log``: the flow
    run's logger."""
    stages = StageTimer()
    tracker = tracker_for(exp)
    with cluster_client(
        exp.placement.scheduler_address,
        use_gpu=exp.placement.use_gpu,
        n_workers=exp.placement.n_workers,
        preload=list(exp.placement.preload) or None,
    ) as client:
        stages.lap("dask_start_s")
        template, at_once = place(exp, client, log=log)  # before the parent run: a refusal leaves none behind
        with parent_run(tracker, parent_spec(exp), resume_from=exp.resume and exp.resume.parent_run_id) as parent:
            log(f"MLflow parent run {parent}" + (f" ({exp.recording.resume_hint.format(parent=parent)})" if exp.recording.resume_hint else ""))
            stages.lap("mlflow_setup_s")
            prior = prior_sweep(tracker, parent, exp, log=log) if exp.resume else None
            with on_cluster(exp, client, template, log=log) as template:  # e.g. objects every worker holds once
                sweep = sweep_on(exp, client, tracker, parent, template, at_once, prior=prior, log=log).run()
            stages.lap("sweep_s")
            if exp.finalize is not None:
                warm_finalizer(client)  # unless the sweep's tail started them: behind the report and evaluation
            board, leaderboard = record_sweep(sweep, tracker, parent, sweep_record(exp), log=log)
            stages.lap("report_s")  # the leaderboard, the report, the parent run's sweep record (Pareto front too)
            best = name_best(sweep, tracker, parent, exp)
            evaluation = registration = None
            try:
                if exp.finalize is not None:
                    if best is None:
                        raise NoBestTrial(
                            f"no trial reported {exp.metric} ({len(sweep.failed)} of {len(sweep.trials)} failed); "
                            "see the MLflow child runs' sweepflow.error tags"
                        )
                    evaluation, registration = finalize(
                        exp.finalize, best, tracker, parent, client, stages, trials=len(sweep.trials), log=log
                    )
            finally:
                # Once per flow run, however the stages after the sweep ended: the trials are recorded, and the
                # best trial and the registered version are linked when there are ones.
                views = leaderboard.publish(
                    best_run_id=best.run_id if best is not None else None,
                    registered=(registration["name"], registration["version"]) if registration else None,
                )
            stages.lap("publish_s")  # the winner's tags, the artifact with its links
    return ExperimentRun(
        sweep,
        tracker.experiment_id,
        parent,
        best,
        board,
        leaderboard.report_url,
        views,
        stages.timings,
        evaluation=evaluation,
        registration=registration,
        view_key=leaderboard.view_key,
    )


def place(exp: Experiment, client: Any, *, log: Callable[[str], None]) -> tuple[TrialTemplate, int]:
    """The experiment's template placed on ``client``'s cluster (``fit_trials``), and how many trials run at
    once, said in the sweep's log line."""
    template, at_once, fits = fit_trials(
        client,
        exp.template,
        exp.placement,
        exp.scheduler,
        trials=exp.sampler.total,
        max_concurrent_trials=exp.max_concurrent_trials,
        log=log,
    )
    log(
        f"sweep: {exp.sampler.total} trials ({exp.search_label}), {min(at_once, exp.sampler.total)} at a "
        f"time (cluster fits {fits}), {template.num_ranks} rank(s) each"
    )
    return template, at_once


def on_cluster(
    exp: Experiment, client: Any, template: TrialTemplate, *, log: Callable[[str], None]
) -> contextlib.AbstractContextManager[TrialTemplate]:
    """What the experiment's face prepares on the cluster around its sweep; the template the trials run."""
    if exp.on_cluster is None:
        return contextlib.nullcontext(template)
    return exp.on_cluster(client, template, log)


def sweep_on(
    exp: Experiment,
    client: Any,
    tracker: RunTracker,
    parent_run_id: str,
    template: TrialTemplate,
    at_once: int,
    *,
    prior: PriorSweep | None = None,
    log: Callable[[str], None] = print,
) -> Sweep:
    """The experiment's ``Sweep``: ``template``'s trials on ``client``'s cluster, ``at_once`` at a time, nested
    under the parent run (``prior``: the trials of the interrupted sweep it resumes)."""
    return Sweep(
        sampler=exp.sampler,
        template=template,
        cluster=client,
        tracker=tracker,
        parent_run_id=parent_run_id,
        scheduler=exp.scheduler,
        concurrency=at_once,
        staging_dir=os.path.join(exp.root_dir, "staging"),
        time_budget_s=exp.time_budget_s,
        artifacts_destination=exp.recording.artifacts_destination,
        prior=prior,
        fail_fast=exp.fail_fast,
        log=log,
        observer=exp.observer,
        # The sweep's tail: a worker stays idle, so registration's imports start there, not after the sweep.
        on_tail=(lambda: warm_finalizer_quietly(client, log)) if exp.finalize is not None else None,
    )


def warm_finalizer_quietly(client: Any, log: Callable[[str], None]) -> None:
    """``warm_finalizer`` from the sweep's driver loop: a lost scheduler is said, not raised (the sweep's own
    calls meet it too, and registration imports what it needs itself)."""
    try:
        warm_finalizer(client)
    except (OSError, TimeoutError) as exc:
        log(f"registration's imports not started early: {type(exc).__name__}: {exc}")


def parent_spec(exp: Experiment) -> ParentRun:
    rec = exp.recording
    return ParentRun(
        name=rec.run_name,
        params=dict(rec.params),
        tags={"sweepflow.kind": rec.kind, **rec.tags},
        settings=dict(rec.settings),
        settings_file=rec.settings_file,
        resume_key=dict(rec.resume_key),
        scratch_dir=os.path.join(exp.root_dir, "tmp"),
        same_on_resume=dict(rec.same_on_resume),
        artifacts_destination=rec.artifacts_destination,
    )


def sweep_record(exp: Experiment) -> SweepRecord:
    return SweepRecord(
        metric=exp.metric,
        mode=exp.mode,
        search_space=exp.search_space,
        title=exp.recording.title,
        tracking_uri=exp.recording.tracking_uri,
        scratch_dir=os.path.join(exp.root_dir, "tmp"),
        objectives=exp.objectives,
    )


def prior_sweep(tracker: RunTracker, parent: str, exp: Experiment, *, log: Callable[[str], None]) -> PriorSweep:
    """The trials of the interrupted sweep this run resumes."""
    assert exp.resume is not None
    prior = load_prior_sweep(tracker, parent, metric=exp.metric or "", mode=exp.mode, errored=exp.resume.errored)
    restarted = sum(1 for t in prior.interrupted if t.restart)
    log(
        f"resuming {exp.recording.kind} run {parent}: {len(prior.ended)} trial(s) ended (read back), "
        f"{len(prior.interrupted) - restarted} continue from their checkpoints"
        + (f", {restarted} failed one(s) start over" if restarted else "")
    )
    return prior


def name_best(sweep: SweepResult, tracker: RunTracker, parent: str, exp: Experiment) -> TrialResult | None:
    """The sweep's best trial, named on the parent run (None when the experiment ranks by no metric, or no
    trial reported it)."""
    best = sweep.best() if exp.metric else None
    if best is not None:
        tracker.set_tags(parent, {"sweepflow.best_trial": best.trial_id, "sweepflow.best_run_id": best.run_id})
    return best


def finalize(
    stage: Finalize,
    best: TrialResult,
    tracker: RunTracker,
    parent: str,
    client: Any,
    stages: StageTimer,
    *,
    trials: int = 0,
    log: Callable[[str], None],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The best trial's best checkpoint evaluated on the test split (metrics on the parent and the trial's
    run), then registered: its test metric decides whether it becomes the champion, and the trial's run is
    tagged the winner. The evaluation's confusion matrix is drawn while a worker registers the model. The one
    finalize of both faces: the pipeline's flow runs it on the sweep's cluster (``client``), and
    ``tune.register_best`` in the script's process (``client`` None), without an evaluation when it has no
    ``evaluate_fn`` (``stage.evaluate``: the trial's reported metrics decide the champion).

    A failure of either (the project's function, the export, the registry's refusal) raises
    ``AfterSweepFailed``: one sentence with the fix, the ``trials`` recorded, and the run to resume. A tracking
    server's own error stays what it is (a service's failure, not the project's)."""
    runs = [run for run in (parent, best.run_id) if run]
    checkpoint = best.best_checkpoint or best.checkpoint or ""
    if stage.evaluate:
        evaluation = _evaluate(stage, checkpoint, tracker, runs, client, parent, trials)
    else:
        evaluation = {"metrics": {k: float(v) for k, v in best.last.items() if _is_number(v)}}
    check_champion_metric(stage, evaluation["metrics"], parent=parent, trials=trials)
    stages.lap("evaluate_s")
    try:
        registration = _register(stage, best, checkpoint, tracker, evaluation, runs, client)
    except _SERVICE_ERRORS:
        raise
    except Exception as exc:  # re-raised as the run's one sentence; the cause (and traceback) chained
        builder = f"training.model_fn={_shown(stage.model_fn)!r}" if stage.model_fn else "the built-in model"
        raise AfterSweepFailed(
            "the registration", _failure(builder, exc, stage.project_dir), parent, trials
        ) from exc
    if "input_example" in registration:  # a project's model_fn: where its signature's example came from
        log(f"registered model's input example: {registration['input_example']}")
    mark_winner(tracker, tracker.tracking_uri, best.run_id, registration)
    stages.lap("register_s")
    return evaluation, registration


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(fn: str | Callable[..., Any] | None) -> str:
    return fn if isinstance(fn, str) else getattr(fn, "__qualname__", repr(fn))


def _evaluate(
    stage: Finalize, checkpoint: str, tracker: RunTracker, runs: list[str], client: Any, parent: str, trials: int
) -> dict[str, Any]:
    """The test-set evaluation of ``checkpoint``, its metrics logged on ``runs``."""
    evaluator = f"evaluation.evaluate_fn={_shown(stage.evaluate_fn)!r}" if stage.evaluate_fn else "the built-in evaluation"
    try:
        run = evaluate_best if client is not None else evaluate_best.fn  # no client: in this process, no task run
        return run(
            checkpoint,
            stage.data_path or "",
            tracker,
            runs,
            client,
            evaluate_fn=stage.evaluate_fn,
            project_dir=stage.project_dir,
        )
    except _SERVICE_ERRORS:
        raise
    except Exception as exc:  # re-raised as the run's one sentence; the cause (and traceback) chained
        raise AfterSweepFailed("the evaluation", _failure(evaluator, exc, stage.project_dir), parent, trials) from exc


def _register(
    stage: Finalize,
    best: TrialResult,
    checkpoint: str,
    tracker: RunTracker,
    evaluation: dict[str, Any],
    runs: list[str],
    client: Any,
) -> dict[str, Any]:
    """The best trial's model registered on a worker while this process draws the evaluation's confusion
    matrix; the registration's outcome. No client: in this process, then the matrix."""
    tags = {"sweepflow.best_trial": best.trial_id}
    if stage.data_checksum:
        tags["sweepflow.data_checksum"] = stage.data_checksum
    arguments: dict[str, Any] = {
        "client": client,
        "tracking_uri": tracker.tracking_uri,
        "run_id": best.run_id,  # the version's source run is the trial that trained it
        "registered_model_name": stage.registered_model_name,
        "metric_name": stage.champion_metric,
        "metric_value": evaluation["metrics"][stage.champion_metric],
        "higher_is_better": stage.champion_mode == "max",
        "tags": tags,
        "model_fn": stage.model_fn,
        "project_dir": stage.project_dir,
    }
    if client is None:
        registration = register_best.fn(checkpoint, stage.data_path, **arguments)
        log_confusion_matrix(evaluation, tracker, runs)
        return registration
    registering = register_best.submit(checkpoint, stage.data_path, **arguments)
    try:
        log_confusion_matrix(evaluation, tracker, runs)
    finally:  # a registration is never left running behind a failed flow
        registering.wait()
    return registering.result()


def check_champion_metric(stage: Finalize, metrics: dict[str, float], *, parent: str = "", trials: int = 0) -> None:
    """Before registering: the champion metric is one the evaluation (or, with none, the trial) reported."""
    if stage.champion_metric not in metrics:
        reported = "the evaluation's metrics" if stage.evaluate else "the best trial's reported metrics"
        fix = "what evaluate_fn returns, prefixed test_" if stage.evaluate else "one the trial reports"
        raise EvaluationMismatch(
            "the evaluation" if stage.evaluate else "the registration",
            f"{stage.champion_setting}={stage.champion_metric!r} is not among {reported} "
            f"{sorted(metrics)}: name one of them ({fix}); nothing was registered",
            parent,
            trials,
        )


class StageTimer:
    """Seconds per stage: each ``lap`` closes the stage that ended now."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self._mark, 3)
        self._mark = now
