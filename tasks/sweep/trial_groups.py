"""One trial's DDP groups, from its first report to its MLflow run's end (``TrialGroups``): the train loop that
carries out what the trial's life (``trial_life``: pure) decides after each report. It runs ``TorchTrainer.fit()``
with the trial's report callbacks (``trial_reports``: each report logged to MLflow, the sweep's scheduler asked
whether to go on); one group, or several when PBT continues the trial from another's checkpoint
(``trial_exploits``) or HyperBand pauses it (``trial_pauses``). Checkpoints are written straight into the child
run's artifact location when trainers can reach it (local store, or s3:// artifact roots), so there is no second
copy.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from prefect.artifacts import create_link_artifact
from prefect.runtime.task_run import get_id as prefect_task_run_id
from prefect.settings import PREFECT_API_URL

import ddp_runtime as train
from ddp_runtime.checkpoint import RunStorage
from sweepflow.tasks.datasets.uris import redact
from sweepflow.tasks.sweep.naming import trial_card
from sweepflow.tasks.sweep.results import ResourceUsage, TrialResult, TrialStatus
from sweepflow.tasks.sweep.resume import scheduler_keys
from sweepflow.tasks.sweep.runtime import SweepRuntime
from sweepflow.tasks.sweep.slots import HeldSlot
from sweepflow.tasks.sweep.template import SweepTrial
from sweepflow.tasks.sweep.trial_exploits import PbtExploits
from sweepflow.tasks.sweep.trial_life import reports_up_to
from sweepflow.tasks.sweep.trial_pauses import resume_after_pause
from sweepflow.tasks.sweep.trial_reports import MetricNotReported, TrialReports
from sweepflow.tasks.sweep.trial_state import RunningTrial
from sweepflow.tasks.tracking.credentials import tracking_auth_env
from sweepflow.tasks.tracking.links import (
    DESCRIPTION_TAG,
    MlflowLinks,
    markdown_link,
    prefect_task_run,
    prefect_ui_url,
)
from sweepflow.tasks.tracking.runs import direct_storage_uri
from sweepflow.tasks.tracking.writers import RunWriter
from sweepflow.tasks.training.function import SystemMetrics, TrainFunction, TrialRun

TAG_DIRNAME = "sweepflow.trial_dirname"  # its directory's name, when given one (trial_dirname_creator)
__all__ = ["TAG_DIRNAME", "MetricNotReported", "TrialGroups", "prefect_task_run_tags", "show_outcome"]


def prefect_task_run_tags() -> dict[str, str]:
    """The trial's Prefect task run, on its MLflow run: an id tag, and a link in the run's description."""
    task_run_id = prefect_task_run_id()
    if not task_run_id:
        return {}
    url = prefect_task_run(prefect_ui_url(PREFECT_API_URL.value()), task_run_id)
    return {
        "prefect.task_run_id": task_run_id,
        DESCRIPTION_TAG: f"Prefect task run: {markdown_link(task_run_id, url)}",
    }


def show_outcome(spec: SweepTrial, rt: SweepRuntime, writer: RunWriter, result: TrialResult) -> None:
    """How the trial ended, where a user looks: its MLflow run's description (the outcome and best value above
    the Prefect link, not only a tag chip), and its Prefect task run's link artifact (``trial_card``)."""
    metric = spec.template.selection_metric
    best = (
        f"; best {metric} {result.best:.4g} at epoch {result.best_epoch}"
        if metric and result.best is not None
        else ""
    )
    summary = f"{spec.name}: {result.outcome()}{best}"
    prefect = prefect_task_run_tags().get(DESCRIPTION_TAG)
    writer.set_tags({DESCRIPTION_TAG: "\n\n".join(p for p in (f"**Outcome:** {summary}", prefect) if p)})
    url = MlflowLinks.for_tracking_uri(rt.tracker.tracking_uri).run(rt.tracker.experiment_id, writer.run_id)
    if url and prefect_task_run_id():
        key, description = trial_card(spec.trial_id, spec.name, result, metric)
        create_link_artifact(key=key, link=url, link_text=f"{spec.name} in MLflow", description=description)


class TrialGroups:
    """One trial's DDP groups, from its first report to its MLflow run's end: the train loop over its groups,
    and its end (result, MLflow run, scheduler)."""

    def __init__(
        self, spec: SweepTrial, rt: SweepRuntime, writer: RunWriter, slot: HeldSlot, logger: Any
    ) -> None:
        self.trial = RunningTrial.start(spec, rt, writer, slot, logger)
        self.rt, self.writer, self.logger, self.life = rt, writer, logger, self.trial.life
        self.exploits = PbtExploits(self.trial)
        self.reports = TrialReports(self.trial, self.exploits)
        self.scheduler_told = False  # the scheduler heard of the trial's end (once, on every path)

    @property
    def spec(self) -> SweepTrial:
        """The trial with the config it trains with now (PBT changes it)."""
        return self.trial.spec

    @property
    def slot(self) -> HeldSlot:
        """The slot the trial holds now (a paused trial gets another)."""
        return self.trial.slot

    def end_in_scheduler(self, *, failed: bool, metrics: Mapping[str, Any] | None = None) -> None:
        """Tell the scheduler the trial ended, once, whichever way it ends: a trial it still counts as running
        would hold the others for ever where they wait for it (synchronous PBT's sync point, HyperBand's rung)."""
        if self.scheduler_told:
            return
        self.scheduler_told = True
        if failed:
            self.rt.scheduler.on_trial_error(self.spec.trial_id)
        else:
            self.rt.scheduler.on_trial_complete(self.spec.trial_id, metrics)

    def train(self, artifact_uri: str) -> TrialResult:
        spec, rt, writer = self.spec, self.rt, self.writer
        storage = direct_storage_uri(artifact_uri, rt.artifacts_destination)
        proxied = (
            storage is None
        )  # the tracking server stores artifacts: stage checkpoints, upload at the end
        if proxied:
            storage = os.path.join(rt.staging_dir, spec.dirname or writer.run_id)
        elif spec.dirname:
            self.logger.warning(
                "%s: its directory name %r (trial_dirname_creator) names no directory: the trial writes straight "
                "into its MLflow run's artifact location %s, which MLflow names; the name is the run's %s tag",
                spec.name,
                spec.dirname,
                redact(storage),
                TAG_DIRNAME,
            )
        rt.storages[spec.trial_id] = storage
        resume_from = self._resume_point(storage) if spec.resume is not None else None
        self.life.resumed_reports = len(self.life.covered)
        rt.progress.update(spec.trial_id)
        rt.notify("trial_started", spec, writer.run_id, storage)
        fit_started = time.perf_counter()
        while True:  # one group, or (PBT) one per exploit: each continues from the donor's checkpoint
            try:
                fit = self._trainer(storage, resume_from).fit()
                error = None
            except train.TrainingFailedError as exc:
                fit, error = exc.result, exc.result.error
            except BaseException:
                # Not a training failure (e.g. the cluster can never fit the trial): close the child run, then fail.
                self.end_in_scheduler(failed=True)
                writer.finish(TrialStatus.FAILED.mlflow_status)
                raise
            if error is not None or rt.aborted or (self.exploits.planned is None and not self.life.paused):
                break
            if self.life.paused:
                resume_from = resume_after_pause(self.trial, storage, fit)
                if resume_from is False:
                    break  # its bracket stopped it
            else:
                resume_from = self.exploits.continue_from_donor(storage, fit)
        spec = self.spec  # with the config it ended with (PBT)
        fit = _over_groups(fit, self.trial.earlier_groups)
        fit_s = time.perf_counter() - fit_started
        result = self._result(fit, error)
        self.end_in_scheduler(failed=result.status is TrialStatus.FAILED, metrics=fit.metrics)
        if result.status is TrialStatus.FAILED:
            self.logger.error("%s failed: %s", spec.name, result.error)
        if proxied and os.path.isdir(os.path.join(storage, "checkpoints")):
            writer.log_artifacts(os.path.join(storage, "checkpoints"), "checkpoints")
        summary = result.summary_metrics(spec.template.selection_metric)
        best_so_far = self.life.best_so_far
        if best_so_far is not None and summary.get(f"best_{spec.template.selection_metric}") == best_so_far:
            del summary[f"best_{spec.template.selection_metric}"]  # logged with the report that reached it
        writer.log({**result.usage.metrics(), **summary}, step=max(result.epochs, 0))
        self.reports.own_metrics_logged()  # a trial that never reported: its samples after its summary
        writer.set_tags(result.summary_tags())
        show_outcome(spec, rt, writer, result)
        # Stopped by the sweep's own abort (an error elsewhere): KILLED, not a normal early stop.
        aborted = (
            result.status is TrialStatus.STOPPED
            and self.rt.aborted is not None
            and self.rt.killed
            and result.stop_reason == self.rt.aborted
        )
        writer.finish("KILLED" if aborted else result.status.mlflow_status)
        # The trial's best value, not its last: the progress line's "best" is the value the summary will name.
        best = {spec.template.selection_metric: result.best} if result.best is not None else fit.metrics
        rt.progress.update(spec.trial_id, metrics=best, status=result.status)
        phases = {
            "group_overhead": round(fit_s - fit.train_time_s, 4),  # reserve, launch, rendezvous, teardown
            "mlflow_end": round(
                time.perf_counter() - fit_started - fit_s, 4
            ),  # queued: written in the background
        }
        return replace(result, phases_s=phases)

    def _resume_point(self, storage: str) -> train.Checkpoint | None:
        """Where a resumed trial continues: its latest committed checkpoint. The reports up to it are kept
        (``covered``) and told to the scheduler again; a report whose checkpoint was committed but which never
        reached MLflow (the process died before its write) is logged now. Without a checkpoint the trial starts
        over in its run."""
        spec, resume = self.spec, self.spec.resume
        assert resume is not None
        committed = RunStorage(storage, "checkpoints", self.rt.storage_options).list_committed()
        if not committed:
            self.logger.warning("%s: no committed checkpoint; it starts over", spec.name)
            return None
        latest = committed[-1]
        kept = self.life.resume(reports_up_to(latest.metrics, list(resume.history)))
        if len(kept) > len(resume.history):
            missing = kept[-1]
            self.writer.log(missing, step=int(missing.get("epoch", missing["training_iteration"])))
        for report in kept:
            if all(name in report for name in scheduler_keys(self.rt.scheduler)):
                self.rt.scheduler.on_trial_result(spec.trial_id, report)  # its verdicts were given before
        self.logger.info(
            "%s: continues from its checkpoint after report %d (%s)",
            spec.name,
            len(kept),
            latest.checkpoint.path,
        )
        return latest.checkpoint

    def _system_metrics(self) -> SystemMetrics | None:
        """The system-metrics sampler on rank 0; its samples come back with the reports (``on_side``)."""
        interval_s = self.spec.template.system_metrics_interval_s
        return SystemMetrics(interval_s) if interval_s > 0 else None

    def _trial_run(self) -> TrialRun:
        """The trial's MLflow run as its ranks reach it (``setup_mlflow`` binds ``mlflow`` to it)."""
        tracker = self.rt.tracker
        return TrialRun(
            tracking_uri=tracker.tracking_uri,
            experiment_id=tracker.experiment_id,
            experiment_name=tracker.experiment_name,
            run_id=self.writer.run_id,
            trial_id=self.spec.trial_id,
            run_name=self.spec.run_name or self.spec.trial_id,
            auth_env=tracking_auth_env(),
        )

    def _trainer(self, storage: str, resume_from: train.Checkpoint | None = None) -> Any:
        spec = self.spec  # its config may have changed since the trial started (PBT)
        return self.rt.trainer(
            TrainFunction(
                spec.template.train_fn,
                system_metrics=self._system_metrics(),
                trial_run=self._trial_run(),
                script_dir=spec.template.import_dir,
            ),
            train_loop_config=spec.train_loop_config,
            scaling_config=train.ScalingConfig(
                num_workers=spec.template.num_ranks,
                use_gpu=spec.template.use_gpu,
                resources_per_worker=spec.template.resources_per_rank or None,
                threads_per_worker=spec.template.threads_per_rank,
            ),
            run_config=train.RunConfig(
                name="checkpoints",
                storage_path=storage,
                storage_options=self.rt.storage_options,
                checkpoint_config=train.CheckpointConfig(
                    num_to_keep=spec.template.checkpoints_to_keep,  # plus the latest, always kept
                    checkpoint_score_attribute=spec.template.checkpoint_score
                    or spec.template.selection_metric,
                    checkpoint_score_order=spec.template.checkpoint_score_mode
                    or spec.template.selection_mode,
                ),
                failure_config=train.FailureConfig(max_failures=spec.template.max_failures),
            ),
            torch_config=train.TorchConfig(hang_timeout_s=spec.template.hang_timeout_s),
            client=self.rt.client,
            datasets=spec.template.datasets or None,
            dataset_config=spec.template.dataset_config,
            on_report=self.reports.on_report,
            on_side=self.reports.on_side,
            resume_from_checkpoint=resume_from,
        )

    def _result(self, fit: train.Result, error: BaseException | None) -> TrialResult:
        spec, life = self.spec, self.life
        if error is None and life.diverged:
            error = ValueError(
                f"the training diverged: non-finite {life.diverged}; lower the learning rate or clip gradients"
            )
        status = life.status(failed=error is not None, stopped_early=fit.stopped_early)
        history = life.history(fit.metrics_history)
        epochs = len(history)
        trained = epochs - life.resumed_reports  # the reports this task's groups made
        usage = ResourceUsage(
            ranks=spec.template.num_ranks,
            gpus_per_rank=spec.template.gpus_per_rank,
            group_seconds=fit.held_s,
            startup_seconds=fit.startup_s,  # a cold worker's first imports: not the trial's
            # What early stopping spared: the epochs up to max_t this trial did not train, at its own pace.
            saved_epochs=life.saved_epochs(status, epochs),
            epoch_seconds=fit.train_time_s / trained if trained > 0 else 0.0,
        )
        return TrialResult.from_history(
            history,
            metric=spec.template.selection_metric,
            mode=spec.template.selection_mode,
            **spec.identity(),
            status=status,
            run_id=self.writer.run_id,
            best_checkpoint=fit.best_checkpoints[0][0].path if fit.best_checkpoints else None,
            checkpoint=fit.checkpoint.path if fit.checkpoint is not None else None,
            error=str(error) if error is not None else None,
            started_at=fit.started_at,
            ended_at=fit.ended_at,
            train_time_s=fit.train_time_s,
            rank0_worker=fit.rank0_worker,
            usage=usage,
            restarts=fit.num_failures if error is None else max(fit.num_failures - 1, 0),
            stop_reason=life.stop_reason if status is TrialStatus.STOPPED else None,
            config_history=tuple(self.exploits.config_history),
        )


def _over_groups(last: train.Result, earlier: list[train.Result]) -> train.Result:
    """The trial's last group's result with the cost of its earlier groups (PBT exploits) added in."""
    if not earlier:
        return last
    return replace(
        last,
        train_time_s=last.train_time_s + sum(r.train_time_s for r in earlier),
        held_s=last.held_s + sum(r.held_s for r in earlier),
        startup_s=last.startup_s + sum(r.startup_s for r in earlier),
        num_failures=last.num_failures + sum(r.num_failures for r in earlier),
        started_at=earlier[0].started_at or last.started_at,
    )
