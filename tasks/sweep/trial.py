"""The ``train-trial`` Prefect task: one trial = one task run that drives the trial's DDP groups on Dask
(``trial_groups.TrialGroups``).

The sweep takes a slot for the trial, then submits the task; the task opens the trial's MLflow child run, lets
``TrialGroups`` train it, and ends with a Prefect state saying how the trial ended. Live objects (the Dask client,
the scheduler, the tracker) travel as the sweep's ``SweepRuntime`` (``runtime.py``), a parameter Prefect neither
inspects nor caches.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from sweepflow.tasks.sweep.results import (
    TAG_CONFIG,
    TAG_TRIAL_ID,
    TAG_TRIAL_INDEX,
    TrialResult,
    TrialStatus,
)
from sweepflow.tasks.sweep.resume import TAG_RESUMES
from sweepflow.tasks.sweep.runtime import SweepRuntime
from sweepflow.tasks.sweep.template import SweepTrial
from sweepflow.tasks.sweep.trial_groups import (
    TAG_DIRNAME,
    MetricNotReported,
    TrialGroups,
    prefect_task_run_tags,
)
from sweepflow.tasks.tracking.links import (
    MlflowLinks,
)
from sweepflow.tasks.tracking.writers import RunWriter
from sweepflow.tasks.training.function import TrainFunction

__all__ = ["MetricNotReported", "SweepRuntime", "final_state", "run_trial", "train_trial"]

TAG_QUEUED_S = "sweepflow.queued_s"  # seconds the trial waited for a slot before its run started


def _task_run_name(parameters: dict[str, Any]) -> str:
    """A trial's task run is named for the trial (``trial_0003-l1=16,lr=0.01``): the name is taken as it is, not
    as a format string (a sampled value may hold braces), and no Task is copied per trial (``with_options``)."""
    return parameters["spec"].name


@task(name="train-trial", cache_policy=NO_CACHE, retries=0, task_run_name=_task_run_name)
def run_trial(spec: SweepTrial, rt: SweepRuntime) -> TrialResult:
    """Train one trial as a DDP group; returns its result (status, metrics, best checkpoint, MLflow run, cost).

    The sweep submits a trial once it has taken a slot for it, so this task run, and the MLflow run it opens,
    start when the trial can train; its wait for the slot is the run's ``sweepflow.queued_s`` tag."""
    result = train_trial(spec, rt, get_run_logger())
    return result if result.status is TrialStatus.NOT_STARTED else final_state(result)


def train_trial(spec: SweepTrial, rt: SweepRuntime, logger: Any) -> TrialResult:
    """The trial's work, whoever runs it (the ``train-trial`` task, or a thread: ``launch.py``): take the slot the
    sweep granted it, open its MLflow run, let ``TrialGroups`` train it, give the slot back."""
    slot, queued_s = rt.take_grant(spec.index)
    try:
        if rt.aborted:
            logger.warning("%s: not started (%s)", spec.name, rt.aborted)
            rt.scheduler.on_trial_error(spec.trial_id)  # the sweep added it when it submitted this task
            return TrialResult(**spec.identity(), status=TrialStatus.NOT_STARTED)
        opened = time.perf_counter()
        try:
            writer, artifact_uri = _open_run(spec, rt, queued_s, logger)
        except BaseException:
            rt.scheduler.on_trial_error(spec.trial_id)
            raise
        mlflow_start_s = time.perf_counter() - opened
        trial_run = TrialGroups(spec, rt, writer, slot, logger)
        try:
            result = trial_run.train(artifact_uri)
            if rt.fail_fast and result.status is TrialStatus.FAILED:  # before its slot frees: none starts
                rt.end_early(f"fail_fast: {spec.name} failed")
        except BaseException:
            # An error of ours, not the training's (those end as a FAILED result), e.g. while copying a PBT donor's
            # checkpoint: the scheduler hears of it and the run ends FAILED before the error goes on, or the
            # others (synchronous PBT) and the sweep's join of its writers would wait for this trial for ever.
            trial_run.end_in_scheduler(failed=True)
            writer.finish(TrialStatus.FAILED.mlflow_status)
            raise
        finally:
            trial_run.slot.release()  # the one it holds now (a paused trial gets another)
    finally:
        slot.release()
    return replace(
        result,
        slot_wait_s=queued_s,
        phases_s={"mlflow_start": round(mlflow_start_s, 4), **result.phases_s},
    )


def _open_run(spec: SweepTrial, rt: SweepRuntime, queued_s: float, logger: Any) -> tuple[RunWriter, str]:
    """The trial's MLflow child run, and its artifact location. One round trip to MLflow; every other write of
    the run (params, metrics, tags, status, end) goes through its background writer, in order. A resumed
    trial reopens its run instead, and counts the resume; a failed one's tags of how it ended (its error, its
    outcome) go, the run is running again and its new end writes them. ``queued_s``: its wait for a slot, as a
    tag."""
    queued = {TAG_QUEUED_S: f"{queued_s:.1f}"}
    if spec.resume is not None:
        writer = RunWriter(rt.tracker, spec.resume.run_id, on_error=rt.writer_failed)
        rt.writers.add(writer)
        writer.delete_tags(spec.resume.ended_tags)
        writer.set_tags({TAG_RESUMES: spec.resume.resumes + 1, **queued})
        writer.set_status("RUNNING")
        return writer, spec.resume.artifact_uri
    run_id, artifact_uri = rt.tracker.create_run(
        # short, so the runs table shows it whole (the sampled values are its params); or the name given it
        spec.run_name or spec.trial_id,
        parent_run_id=rt.parent_run_id,
        tags={
            **spec.template.run_tags,  # the user's (not one of ours: refused by whoever set them)
            TAG_TRIAL_ID: spec.trial_id,
            "sweepflow.trial_name": spec.name,
            TAG_TRIAL_INDEX: str(spec.index),
            TAG_CONFIG: json.dumps(spec.params, sort_keys=True, default=str),
            "sweepflow.train_fn": TrainFunction(spec.template.train_fn).path,
            **({TAG_DIRNAME: spec.dirname} if spec.dirname else {}),
            **queued,
            **prefect_task_run_tags(),
        },
    )
    writer = RunWriter(rt.tracker, run_id, on_error=rt.writer_failed)
    rt.writers.add(writer)
    try:
        url = MlflowLinks.for_tracking_uri(rt.tracker.tracking_uri).run(rt.tracker.experiment_id, run_id)
        # The task run's first log line: where the trial's MLflow run is, one click from Prefect.
        logger.info("%s: MLflow run %s", spec.name, url or run_id)
    except BaseException:
        writer.finish(TrialStatus.FAILED.mlflow_status)  # or the writers' join waits for its end for ever
        raise
    writer.log_params(
        {
            **spec.params,
            "num_ranks": spec.template.num_ranks,
            "gpus_per_rank": spec.template.gpus_per_rank,
            "resources_per_rank": spec.template.resources_per_rank,
        }
    )
    return writer, artifact_uri


def final_state(result: TrialResult) -> Any:
    """The trial task's final Prefect state: Completed (the sweep goes on), named "Stopped early" for an
    early stop, with how the trial ended as its message; its data is the result."""
    from prefect.states import Completed

    name = "Stopped early" if result.status is TrialStatus.STOPPED else "Completed"
    return Completed(data=result, name=name, message=f"{result.name}: {result.outcome()}")
