"""One trial's DDP groups, from its first report to its MLflow run's end (``TrialGroups``): the adapter that
carries out what the trial's life (``trial_life``: pure) decides after each report. It runs ``TorchTrainer.fit()``
with an ``on_report`` callback that logs each report to MLflow and asks the sweep's scheduler whether to go on;
one group, or several when PBT continues the trial from another's checkpoint or HyperBand pauses it. Checkpoints
are written straight into the child run's artifact location when trainers can reach it (local store, or s3://
artifact roots), so there is no second copy.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from prefect.artifacts import create_link_artifact
from prefect.runtime.task_run import get_id as prefect_task_run_id
from prefect.settings import PREFECT_API_URL

import ddp_runtime as train
from ddp_runtime.checkpoint import RunStorage, StoredCheckpoint
from ddp_runtime.torch import Verdict
from sweepflow.tasks.datasets.uris import redact
from sweepflow.tasks.sweep.naming import trial_card
from sweepflow.tasks.sweep.pbt import Exploit
from sweepflow.tasks.sweep.results import (
    ResourceUsage,
    TrialResult,
    TrialStatus,
    flat_config,
)
from sweepflow.tasks.sweep.resume import scheduler_keys
from sweepflow.tasks.sweep.runtime import SweepRuntime
from sweepflow.tasks.sweep.slots import HeldSlot
from sweepflow.tasks.sweep.template import SweepTrial
from sweepflow.tasks.sweep.trial_life import Step, TrialLife, reports_up_to
from sweepflow.tasks.sweep.trial_scheduler import Decision
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
TAG_EXPLOITS = "sweepflow.pbt.exploits"  # how many times the trial continued from another's checkpoint (PBT)
TAG_LAST_EXPLOIT = "sweepflow.pbt.last_exploit"  # the latest: "copied trial_0003 at report 8; lr=0.012"
PBT_HISTORY_ARTIFACT = "pbt"  # its config_history.json: the trial's configs over time, who it copied


class MetricNotReported(ValueError):
    """The training function's first report lacks a metric the sweep selects or schedules by: every trial would
    be the same mistake, so the sweep stops at once with this message."""


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
    """One trial's DDP group, from its first report to its MLflow run's end."""

    def __init__(
        self, spec: SweepTrial, rt: SweepRuntime, writer: RunWriter, slot: HeldSlot, logger: Any
    ) -> None:
        self.spec, self.rt, self.writer, self.slot, self.logger = spec, rt, writer, slot, logger
        # What happens after each report, across the trial's groups (trial_life: pure, unit-tested); this class
        # carries its steps out (MLflow, the slot, the logs, the next group).
        self.life = TrialLife(
            selection_metric=spec.template.selection_metric,
            selection_mode=spec.template.selection_mode,
            scheduler_metric=rt.scheduler.metric,
            max_reports=spec.template.max_reports,
        )
        self.started = time.time()  # the scheduler's ``time_total_s`` counts from here (across groups)
        # PBT: the exploit this trial's group stopped for, what its earlier groups cost, and its configs over time.
        self.exploit: tuple[Exploit, StoredCheckpoint] | None = None
        self.earlier_groups: list[train.Result] = []
        self.config_history: list[dict[str, Any]] = []
        self.scheduler_told = False  # the scheduler heard of the trial's end (once, on every path)
        # System metrics from rank 0 (``on_side``): held until the run has a report of its own, numbered on from
        # the run's earlier ones (a resumed trial's) across the trial's groups.
        self.own_metrics = bool(spec.resume and spec.resume.history)
        self.system_held: list[dict[str, Any]] = []
        self.system_step = spec.resume.system_steps if spec.resume else 0

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

    def on_side(self, payload: Any) -> None:
        """Rank 0's system-metrics samples, as they come with its reports (``TorchTrainer(on_side=...)``)."""
        if isinstance(payload, dict) and "system" in payload:
            if self.own_metrics:
                self._log_system(payload)
            else:  # MLflow's compare view opens on the metric a run logged first: the trial's own go first
                self.system_held.append(payload)

    def _log_system(self, sample: dict[str, Any]) -> None:
        metrics = {f"system/{name}": value for name, value in sample["system"].items()}
        self.writer.log(metrics, step=self.system_step, timestamp_ms=sample["time_ms"])
        self.system_step += 1

    def _own_metrics_logged(self) -> None:
        """The run has a metric of its own now (or never will): the samples held back go out after it."""
        self.own_metrics = True
        for sample in self.system_held:
            self._log_system(sample)
        self.system_held.clear()

    def on_report(self, metrics: dict[str, Any]) -> bool | Verdict:
        """Log the report; True stops the group at it (the scheduler's verdict, or the time budget). The sweep's
        observer hears of the report after the scheduler has decided on it (as Ray's callbacks do), and may ask
        for a checkpoint of it (a Tune callback's ``should_checkpoint``): rank 0 saves one if its function can."""
        stop = self._take_report(metrics)
        if self.rt.notify("trial_result", self.spec, self._as_scheduled(metrics)):
            return Verdict(stop=stop, checkpoint=True)
        return stop

    def _take_report(self, metrics: dict[str, Any]) -> bool:
        spec, life = self.spec, self.life
        if life.number(metrics):
            self._check_metrics(metrics)
        step = int(metrics.get("epoch", metrics["training_iteration"]))
        # The best value so far goes first: the runs table can sort trials by it while they train, and MLflow's
        # compare view opens its parallel-coordinates plot on the metric a run logged first.
        self.writer.log({**life.best(metrics), **metrics}, step=step)
        if not self.own_metrics:
            self._own_metrics_logged()
        next_step = life.screen(metrics, aborted=self.rt.aborted)
        if next_step is None:
            decision = self.rt.scheduler.on_trial_result(spec.trial_id, self._as_scheduled(metrics))
            next_step = life.verdict(
                metrics,
                decision,
                out_of_time=self.rt.out_of_time(),
                scheduler_reason=self.rt.scheduler.stop_reason,
            )
        if next_step is Step.CONTINUE:
            return False
        if (
            next_step is Step.EXPLOIT
        ):  # the group stops and the trial goes on from the donor's: it keeps its slot
            return self._plan_exploit(metrics["training_iteration"])
        if next_step is Step.DIVERGED:  # FAILED now, and never shown to the scheduler (no promotion)
            self.logger.error("%s: stopping as failed: non-finite %s", spec.name, life.diverged)
        elif next_step is Step.ABORTED:
            self.logger.warning("%s: stopping at report %s (%s)", spec.name, step, life.stop_reason)
        elif next_step is Step.STOP_ALL:
            self.rt.end_early(f"the experiment's stopper ended it at {spec.name}'s report {step}")
        elif next_step is Step.PRUNED:
            self.logger.info("%s: stopping at report %s (%s)", spec.name, step, life.stop_reason)
        elif next_step is Step.PAUSE:
            # It waits for the others (HyperBand's milestone) without holding workers: they may start meanwhile.
            self.logger.info("%s: paused at report %s until its bracket is decided", spec.name, step)
        self.slot.release()  # the group only tears down from here: the next trial may start
        return True

    def _as_scheduled(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The report as schedulers see it: with Ray's ``time_total_s`` (seconds since the trial started, across
        its groups) when the trainable does not report one (it is not logged: MLflow has the run's times)."""
        return (
            metrics if "time_total_s" in metrics else {**metrics, "time_total_s": time.time() - self.started}
        )

    def _plan_exploit(self, iteration: int) -> bool:
        """PBT put this trial in the bottom quantile: stop its group (True) to continue from the donor's latest
        checkpoint, or go on (False) when the donor has none yet."""
        plan = self.rt.scheduler.take_exploit(self.spec.trial_id)
        if plan is None:
            return False
        donor = self._latest_checkpoint_of(plan.donor)
        if donor is None:
            self.logger.warning(
                "%s: PBT would continue it from %s, which has no checkpoint yet, so it goes on as it is; report a "
                "checkpoint at least every perturbation_interval (tune.report(..., checkpoint=...))",
                self.spec.name,
                plan.donor,
            )
            return False
        self.exploit = (plan, donor)
        self.logger.info(
            "%s: exploits %s at report %d (%s %.4g vs its %.4g); continues from its checkpoint with %s",
            self.spec.name,
            plan.donor,
            iteration,
            self.rt.scheduler.metric or "metric",  # what PBT ranked them by
            plan.donor_score,
            plan.score,
            plan.config,
        )
        return True

    def _latest_checkpoint_of(self, trial_id: str) -> StoredCheckpoint | None:
        root = self.rt.storages.get(trial_id)
        if root is None:
            return None
        committed = RunStorage(root, "checkpoints", self.rt.storage_options).list_committed()
        return committed[-1] if committed else None

    def _resume_after_pause(self, storage: str, fit: train.Result) -> train.Checkpoint | None | bool:
        """Wait for the paused trial's verdict. Stopped: False (the last group's result is the trial's). Going
        on: a slot again (ahead of trials not started), and the trial's latest checkpoint to continue from (None:
        it reported none, so it starts over)."""
        self.life.paused = False
        verdict = self.rt.scheduler.wait_to_resume(
            self.spec.trial_id, give_up=lambda: self.rt.aborted is not None or self.rt.out_of_time()
        )
        if verdict is not Decision.CONTINUE:
            self.life.stop_reason = self.rt.aborted or self.rt.scheduler.stop_reason
            self.logger.info("%s: stopped while paused (%s)", self.spec.name, self.life.stop_reason)
            return False
        self._keep_history(fit)
        self.slot = self.rt.slots.reacquire()
        self.rt.progress.holds_slot(self.spec.trial_id, self.slot)
        latest = RunStorage(storage, "checkpoints", self.rt.storage_options).list_committed()
        if not latest:
            self.logger.warning(
                "%s: goes on after its pause without a checkpoint, so it starts over: report checkpoints "
                "(tune.report(..., checkpoint=...)) to go on where it paused",
                self.spec.name,
            )
        self.logger.info("%s: goes on from report %d", self.spec.name, len(self.life.covered))
        return latest[-1].checkpoint if latest else None

    def _keep_history(self, fit: train.Result) -> None:
        """A group of the trial ended and another follows: its reports join the ones kept, numbered on."""
        self.life.keep_history(fit.metrics_history)
        self.earlier_groups.append(fit)

    def _continue_from_donor(self, storage: str, fit: train.Result) -> train.Checkpoint:
        """Carry out the exploit the last group stopped for: the donor's latest checkpoint copied into this trial's
        storage (its own from then on: the donor may delete its copy), the explored config taken on, and both
        recorded in the trial's MLflow run. Returns the copy, which the next group starts from."""
        assert self.exploit is not None
        plan, seen = self.exploit
        self.exploit = None
        self._keep_history(fit)
        copied, source = copy_latest(
            RunStorage(self.rt.storages[plan.donor], "checkpoints", self.rt.storage_options),
            RunStorage(storage, "checkpoints", self.rt.storage_options),
            seen,
        )
        spec = self.spec
        config = self.rt.scheduler.on_trial_config(spec.trial_id, plan.config)
        if not self.config_history:
            self.config_history.append({"iteration": 0, "config": spec.params})
        self.config_history.append(
            {
                "iteration": len(self.life.covered),
                "donor": plan.donor,
                "donor_checkpoint": source.index,
                "score": plan.score,
                "donor_score": plan.donor_score,
                "config": config,
            }
        )
        self.spec = replace(spec, params=config)
        self._record_exploit(plan.donor, config)
        return copied

    def _record_exploit(self, donor: str, config: dict[str, Any]) -> None:
        """The exploit in the trial's MLflow run: a count and the latest as tags, the numeric hyperparameters as
        ``hparam/<name>`` metrics over the reports (MLflow charts them), the whole history as an artifact."""
        iteration = len(self.life.covered)
        last = self.life.covered[-1] if self.life.covered else {}
        step = int(last.get("epoch", iteration))
        exploits = len(self.config_history) - 1
        before = flat_config(self.config_history[-2]["config"])
        changed = {k: v for k, v in flat_config(config).items() if before.get(k) != v}
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in changed.items())
        self.writer.set_tags(
            {
                TAG_EXPLOITS: exploits,
                TAG_LAST_EXPLOIT: f"copied {donor} at report {iteration}" + (f"; {shown}" if shown else ""),
            }
        )
        if exploits == 1:  # the values it started with, at step 0
            self.writer.log(_numeric_hparams(self.config_history[0]["config"]), step=0)
        self.writer.log(_numeric_hparams(config), step=step)
        history_dir = os.path.join(self.rt.staging_dir, f"pbt-{self.writer.run_id}")
        os.makedirs(history_dir, exist_ok=True)
        with open(os.path.join(history_dir, "config_history.json"), "w") as f:
            json.dump(self.config_history, f, indent=1, default=str)
        self.writer.log_artifacts(history_dir, PBT_HISTORY_ARTIFACT)

    def _check_metrics(self, metrics: dict[str, Any]) -> None:
        wanted = {
            "the selection metric": self.spec.template.selection_metric,
            "the scheduler's metric": self.rt.scheduler.metric,
        }
        for role, name in wanted.items():
            if name and name not in metrics:
                reported = sorted(k for k in metrics if k != "training_iteration")
                raise MetricNotReported(
                    f"the training function never reports {name!r}, {role} (its first report has {reported}): "
                    f"report {name!r}, or select/schedule by one of {reported}"
                )

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
            if error is not None or rt.aborted or (self.exploit is None and not self.life.paused):
                break
            if self.life.paused:
                resume_from = self._resume_after_pause(storage, fit)
                if resume_from is False:
                    break  # its bracket stopped it
            else:
                resume_from = self._continue_from_donor(storage, fit)
        spec = self.spec  # with the config it ended with (PBT)
        fit = _over_groups(fit, self.earlier_groups)
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
        self._own_metrics_logged()  # a trial that never reported: its samples after its summary
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
            on_report=self.on_report,
            on_side=self.on_side,
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
            config_history=tuple(self.config_history),
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


def copy_latest(
    source: RunStorage, target: RunStorage, seen: StoredCheckpoint
) -> tuple[train.Checkpoint, StoredCheckpoint]:
    """Copy ``source``'s latest committed checkpoint into ``target`` as its next one (committed there the same
    way). The donor keeps training meanwhile, and its retention may delete the checkpoint being copied: a copy
    counts only if the checkpoint was still committed once all its files were read (a deletion takes the marker
    first), else the newer one is taken. ``seen``: the latest when the exploit was decided (the floor)."""
    for _ in range(5):
        committed = [c for c in source.list_committed() if c.index >= seen.index]
        if not committed:
            break
        latest = committed[-1]
        own = target.list_committed()
        index = own[-1].index + 1 if own else 0
        with tempfile.TemporaryDirectory(prefix="sweepflow-exploit-") as copy:
            try:
                latest.checkpoint.to_directory(copy)
            except FileNotFoundError:
                if source.is_committed(latest):
                    raise  # not the donor's retention: a real error
                continue
            if not source.is_committed(latest):
                continue  # deleted while being read: the copy may lack files
            return target.persist(copy, index, latest.metrics), latest
    raise RuntimeError(
        f"PBT could not copy a checkpoint from {source.uri}: its checkpoints kept disappearing while being copied; "
        "keep more of them (CheckpointConfig(num_to_keep=...) / keep_checkpoints_num)"
    )


def _numeric_hparams(config: dict[str, Any]) -> dict[str, float]:
    """A config's numeric values as ``hparam/<name>`` metrics (nested names joined by '/')."""
    return {
        f"hparam/{name}": float(value)
        for name, value in flat_config(config).items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
