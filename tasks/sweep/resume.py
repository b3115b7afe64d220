"""Resuming an interrupted sweep from MLflow and storage alone: no pickled driver state.

A pipeline's parent run records what its trials depend on (``resume_key``: every setting that changes which
trials run or what they compute, digested into a tag). Each trial's child run records its number, its sampled
config and, once it ends, its status and summary (``results.py``); its checkpoints are committed in storage.
That is enough to pick up where a dead flow process stopped:

- trials that ended (completed, stopped early, failed) are read back (``TrialResult.from_mlflow``), not run;
- trials that were running continue in the same child run from their latest committed checkpoint (so do failed
  ones a restore resumes: their run's tags of how it ended, ``ENDED_TAGS``, are removed as it reopens, so an
  earlier error does not outlive the trial's new end);
- trials never started start; the sampler regenerates them in the same order (TPE is re-told the results).

    prior = load_prior_sweep(tracker, parent_run_id, metric="val_loss", mode="min")
    prior.trials[3].result        # a TrialResult if trial 3 ended, else None (it continues)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sweepflow.tasks.compat import read_run_artifact
from sweepflow.tasks.sweep.results import (
    ENDED_TAGS,
    TAG_CONFIG,
    TAG_STATUS,
    TAG_TRIAL_ID,
    TAG_TRIAL_INDEX,
    TrialResult,
    TrialStatus,
    history_from_mlflow,
)
from sweepflow.tasks.tracking.runs import PARENT_TAG, RunTracker

TAG_RESUME_KEY = "sweepflow.resume_key"  # digest of the settings a resumed run must share
TAG_RESUMES = "sweepflow.resumes"  # how many times the run (parent or trial) was picked up again
RESUME_KEY_ARTIFACT = "sweepflow/resume_key.json"  # the settings themselves, to name what differs

# The settings that decide which trials run and what they compute. Where the trials run (Dask, MLflow
# addresses, state dir), how many run at once and the time budget may change between the two runs.
_SWEEP_IRRELEVANT = {"max_concurrent_trials", "time_budget_s"}
# What only the stages after the sweep read (building, judging the registered model): the fix of a run that
# failed there may change them, and its resume trains nothing again. (evaluation.* is not in the key at all.)
_AFTER_THE_SWEEP = (("training", "model_fn"), ("selection", "champion_metric"), ("selection", "champion_mode"))


@dataclass(frozen=True)
class ResumeFrom:
    """Where a trial that was running when its sweep died continues (plain data: part of its task's spec)."""

    run_id: str
    artifact_uri: str
    history: tuple[dict[str, Any], ...]  # the reports its child run holds, in order
    resumes: int  # times it was picked up before
    system_steps: int = 0  # system-metric samples its run holds (the next one's step)
    # its run's tags of how it ended before (a failed trial resumed): removed as the run reopens
    ended_tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class PriorTrial:
    index: int
    run_id: str
    artifact_uri: str
    config: dict[str, Any]
    result: TrialResult | None  # it ended: read back, not trained again
    history: tuple[dict[str, Any], ...] = ()
    resumes: int = 0
    restart: bool = False  # it failed and starts over in a new run (``Tuner.restore(restart_errored=True)``)
    system_steps: int = 0
    ended_tags: tuple[str, ...] = ()  # see ResumeFrom

    def resume_from(self) -> ResumeFrom:
        return ResumeFrom(
            self.run_id, self.artifact_uri, self.history, self.resumes, self.system_steps, self.ended_tags
        )


@dataclass(frozen=True)
class PriorSweep:
    parent_run_id: str
    trials: dict[int, PriorTrial]  # by trial number

    @property
    def ended(self) -> list[PriorTrial]:
        return [t for t in self.trials.values() if t.result is not None]

    @property
    def interrupted(self) -> list[PriorTrial]:
        return [t for t in self.trials.values() if t.result is None]


def resume_key(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The flat settings a resumed run must share with the interrupted one, from a pipeline config dump
    (credential-free: the flow's public parameters)."""
    from sweepflow.tasks.tracking.params import flatten, public_params

    sections = ("data", "sweep", "scheduler", "training", "resources", "selection")
    kept = {name: dict(settings.get(name) or {}) for name in sections}
    for name in _SWEEP_IRRELEVANT:
        kept["sweep"].pop(name, None)
    for section, name in _AFTER_THE_SWEEP:
        kept[section].pop(name, None)
    kept["data"].pop("cache_dir", None)  # where the download is kept, not what it is
    flat = public_params(flatten("", kept))
    return {key: json.loads(json.dumps(value, default=str)) for key, value in sorted(flat.items())}


def digest(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_resumable(client: Any, experiment_id: str | None, parent_run_id: str, key: Mapping[str, Any]) -> None:
    """Refuse (``PreflightError``: the reason and the fix) a run id that is not an unfinished pipeline run of
    this experiment (``experiment_id``; None: it does not exist) with these settings. ``client``: an
    MlflowClient. Reads the parent run (and its settings artifact when they differ); writes nothing."""
    from mlflow.exceptions import MlflowException

    from sweepflow.tasks.checks import PreflightError

    def refuse(problem: str, fix: str) -> PreflightError:
        return PreflightError("resume", parent_run_id, problem, fix)

    fix = "pass the parent run id `sweepflow run` printed (`parent run ...`), which has a sweepflow.resume_key tag"
    try:
        run = client.get_run(parent_run_id)
    except MlflowException:
        raise refuse("no such MLflow run", fix) from None
    tags = run.data.tags
    if run.info.experiment_id != experiment_id:
        raise refuse(
            f"the run belongs to experiment {run.info.experiment_id}, not to this configuration's",
            "set mlflow.experiment_name to the interrupted run's experiment",
        )
    if TAG_RESUME_KEY not in tags or PARENT_TAG in tags:
        raise refuse("it is not a sweepflow pipeline's parent run", fix)
    if run.info.status == "FINISHED":
        raise refuse("that pipeline run finished: there is nothing to resume", "start a new run without --resume")
    if tags[TAG_RESUME_KEY] != digest(key):
        raise refuse(
            f"the configuration differs from the interrupted run's: {_differences(client, parent_run_id, key)}",
            "resume with the same settings (only where things run, sweep.max_concurrent_trials and "
            "sweep.time_budget_s may change), or start a new run",
        )


def _differences(client: Any, parent_run_id: str, key: Mapping[str, Any]) -> str:
    # Read without MLflow's download progress bar: stderr noise in front of a one-sentence error.
    old = json.loads(read_run_artifact(client, parent_run_id, RESUME_KEY_ARTIFACT))
    changed = [
        f"{name} was {old.get(name, '<unset>')!r}, now {key.get(name, '<unset>')!r}"
        for name in sorted(set(old) | set(key))
        if old.get(name) != key.get(name)
    ]
    return "; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")


def find_parent(
    client: Any,
    experiment_id: str | None,
    key: Mapping[str, Any],
    *,
    flow_run_id: str | None = None,
    ended: Literal["no", "fallback", "yes"] = "no",
) -> str | None:
    """The one resume lookup, for either face: the newest sweep parent run of the experiment (``experiment_id``;
    None: it does not exist) recorded with these settings (``key``, the resume key both faces record), or None.
    ``flow_run_id``: only a parent that this Prefect flow run's earlier attempt left (a retry resumes it).
    ``ended``: "no", an unfinished one only (a Prefect retry of the pipeline's flow run, a Tune run with
    ``resume``); "fallback", that, else the newest that ended (``Tuner.restore`` of an experiment that ended
    reads its trials back); "yes", the newest whether it ended or not (``Tuner.get_results``). A run id given by
    the user is checked instead (``check_resumable``). ``client``: an MlflowClient."""
    if experiment_id is None:
        return None
    query = f"tags.`{TAG_RESUME_KEY}` = '{digest(key)}'"
    if flow_run_id is not None:
        query += f" and tags.`prefect.flow_run_id` = '{flow_run_id}'"
    runs = client.search_runs(
        [experiment_id], filter_string=query, order_by=["attributes.start_time DESC"], max_results=20
    )
    parents = [r for r in runs if PARENT_TAG not in r.data.tags]  # a trial's run is no sweep's parent
    unfinished = [r for r in parents if r.info.status != "FINISHED"]
    if ended == "yes":
        chosen = parents
    elif ended == "fallback":
        chosen = unfinished or parents
    else:
        chosen = unfinished
    return chosen[0].info.run_id if chosen else None


#: What a resumed sweep does with its failed trials: read them back as failed, continue them from their latest
#: checkpoint in the same run, or start them over in a new run (``Tuner.restore``'s resume_/restart_errored).
ERRORED_KEEP, ERRORED_RESUME, ERRORED_RESTART = "keep", "resume", "restart"
TAG_RESTARTED = "sweepflow.restarted"  # on a failed trial's run that a restore started over in a new run


def read_trials(client: Any, experiment_id: str, parent_run_id: str, *, metric: str, mode: str) -> list[TrialResult]:
    """The trials of a sweep as MLflow holds them, changing nothing (``load_prior_sweep`` is the resume's
    read, which closes what a dead process left open): the ended ones as they ended, the ones its process left
    running as ``INTERRUPTED`` with their reports so far. In trial order; a failed attempt a restore started
    over is left out (the trial's newer run counts)."""
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'", max_results=50000
    )
    trials: dict[int, TrialResult] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time):
        tags = run.data.tags
        if TAG_TRIAL_INDEX not in tags or TAG_RESTARTED in tags:
            continue
        if TAG_STATUS in tags:
            result = TrialResult.from_mlflow(client, run.info.run_id, metric=metric, mode=mode)
        else:
            result = TrialResult.from_history(
                history_from_mlflow(client, run.info.run_id, run.data.metrics, metric),
                metric=metric,
                mode=mode,
                trial_id=tags[TAG_TRIAL_ID],
                index=int(tags[TAG_TRIAL_INDEX]),
                name=tags.get("sweepflow.trial_name", run.info.run_name),
                config=json.loads(tags.get(TAG_CONFIG, "{}")),
                status=TrialStatus.INTERRUPTED,
                run_id=run.info.run_id,
            )
        trials[int(tags[TAG_TRIAL_INDEX])] = result
    return [trials[i] for i in sorted(trials)]


def load_prior_sweep(
    tracker: RunTracker, parent_run_id: str, *, metric: str, mode: str, errored: str = ERRORED_KEEP
) -> PriorSweep:
    """Every trial the interrupted sweep created, by number; runs its dead process left open that had ended
    (summary tags written, end not) are closed with their status. ``errored``: what becomes of failed trials."""
    client = tracker.client
    runs = client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'", max_results=50000
    )
    trials: dict[int, PriorTrial] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time):
        tags = run.data.tags
        if TAG_TRIAL_INDEX not in tags:
            continue  # not a trial (the test evaluation's run, say)
        index = int(tags[TAG_TRIAL_INDEX])
        resumes = int(tags.get(TAG_RESUMES, 0))
        config = json.loads(tags.get(TAG_CONFIG, "{}"))
        if TAG_RESTARTED in tags:
            continue  # a failed attempt a restore started over: the trial's newer run is the one that counts
        if TAG_STATUS in tags:
            result = TrialResult.from_mlflow(client, run.info.run_id, metric=metric, mode=mode)
            if run.info.status in ("RUNNING", "SCHEDULED"):  # died between its summary and its end
                tracker.end_run(run.info.run_id, result.status.mlflow_status)
            if result.status is TrialStatus.FAILED and errored == ERRORED_RESTART:
                # Its run stays (failed, tagged), out of the sweep's trials; the trial starts over in a new one.
                tracker.set_tags(run.info.run_id, {TAG_RESTARTED: "true"})
                trials[index] = PriorTrial(index, run.info.run_id, run.info.artifact_uri, config, None, restart=True)
                continue
            if result.status is TrialStatus.FAILED and errored == ERRORED_RESUME:
                trials[index] = _to_resume(client, run, index, config, resumes, metric)
                continue
            trials[index] = PriorTrial(index, run.info.run_id, run.info.artifact_uri, config, result)
        else:
            trials[index] = _to_resume(client, run, index, config, resumes, metric)
    return PriorSweep(parent_run_id, trials)


def _to_resume(client: Any, run: Any, index: int, config: dict[str, Any], resumes: int, metric: str) -> PriorTrial:
    """A trial picked up in its own run where it stopped: its reports so far, its system-metric samples, and the
    tags of how it ended that its run holds (a failed trial resumed), which go when it reopens."""
    history = tuple(_history(client, run.info.run_id, run.data.metrics, metric))
    return PriorTrial(
        index,
        run.info.run_id,
        run.info.artifact_uri,
        config,
        None,
        history,
        resumes,
        system_steps=_system_steps(run),
        ended_tags=tuple(key for key in ENDED_TAGS if key in run.data.tags),
    )


def _system_steps(run: Any) -> int:
    """The system-metric samples a run holds: the step after its latest (MLflow keeps a metric's highest step;
    every metric of a sample has the sample's step)."""
    latest = run.data._metric_objs  # {key: value} lacks the steps
    return max((m.step for m in latest if m.key.startswith("system/")), default=-1) + 1


def _history(client: Any, run_id: str, latest: Mapping[str, float], metric: str) -> list[dict[str, Any]]:
    from sweepflow.tasks.sweep.results import history_from_mlflow

    return history_from_mlflow(client, run_id, latest, metric)


def scheduler_keys(scheduler: Any) -> list[str]:
    """What a report needs for the scheduler to judge it (ASHA: its metric and time attribute)."""
    return [k for k in (scheduler.metric, scheduler.time_attr) if k]


def replay(scheduler: Any, result: TrialResult) -> None:
    """Tell a scheduler (ASHA) an ended trial's reports, so the trials still to come are compared with it as
    in the interrupted run. Its verdicts are moot: the trial already ended."""
    needed = scheduler_keys(scheduler)
    scheduler.on_trial_add(result.trial_id)
    for report in result.history:
        if all(name in report for name in needed):
            scheduler.on_trial_result(result.trial_id, report)
    if result.status is TrialStatus.FAILED:
        scheduler.on_trial_error(result.trial_id)
    else:
        scheduler.on_trial_complete(result.trial_id, result.history[-1] if result.history else None)
