"""A trial's reports as they come from its group's rank 0 (``TrialReports``): each logged to the trial's MLflow
run, screened by the trial's life, shown to the sweep's scheduler, and answered (go on, or stop the group here);
rank 0's system-metrics samples, logged after the run's own first metric."""

from __future__ import annotations

import time
from typing import Any

from ddp_runtime.torch import Verdict
from sweepflow.tasks.sweep.trial_exploits import PbtExploits
from sweepflow.tasks.sweep.trial_life import Step
from sweepflow.tasks.sweep.trial_state import RunningTrial


class MetricNotReported(ValueError):
    """The training function's first report lacks a metric the sweep selects or schedules by: every trial would
    be the same mistake, so the sweep stops at once with this message."""


class TrialReports:
    """The ``on_report`` and ``on_side`` callbacks of a trial's groups (``TorchTrainer(on_report=, on_side=)``)."""

    def __init__(self, trial: RunningTrial, exploits: PbtExploits) -> None:
        self.trial, self.exploits = trial, exploits
        spec = trial.spec
        # System metrics from rank 0 (``on_side``): held until the run has a report of its own, numbered on from
        # the run's earlier ones (a resumed trial's) across the trial's groups.
        self.own_metrics = bool(spec.resume and spec.resume.history)
        self.system_held: list[dict[str, Any]] = []
        self.system_step = spec.resume.system_steps if spec.resume else 0

    def on_side(self, payload: Any) -> None:
        """Rank 0's system-metrics samples, as they come with its reports (``TorchTrainer(on_side=...)``)."""
        if isinstance(payload, dict) and "system" in payload:
            if self.own_metrics:
                self._log_system(payload)
            else:  # MLflow's compare view opens on the metric a run logged first: the trial's own go first
                self.system_held.append(payload)

    def _log_system(self, sample: dict[str, Any]) -> None:
        metrics = {f"system/{name}": value for name, value in sample["system"].items()}
        self.trial.writer.log(metrics, step=self.system_step, timestamp_ms=sample["time_ms"])
        self.system_step += 1

    def own_metrics_logged(self) -> None:
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
        if self.trial.rt.notify("trial_result", self.trial.spec, self.as_scheduled(metrics)):
            return Verdict(stop=stop, checkpoint=True)
        return stop

    def _take_report(self, metrics: dict[str, Any]) -> bool:
        trial = self.trial
        spec, life, rt = trial.spec, trial.life, trial.rt
        if life.number(metrics):
            self._check_metrics(metrics)
        step = int(metrics.get("epoch", metrics["training_iteration"]))
        # The best value so far goes first: the runs table can sort trials by it while they train, and MLflow's
        # compare view opens its parallel-coordinates plot on the metric a run logged first.
        trial.writer.log({**life.best(metrics), **metrics}, step=step)
        if not self.own_metrics:
            self.own_metrics_logged()
        if rt.sampler is not None:
            rt.sampler.on_report(spec.trial_id, metrics)
        next_step = life.screen(metrics, aborted=rt.aborted)
        if next_step is None:
            decision = rt.scheduler.on_trial_result(spec.trial_id, self.as_scheduled(metrics))
            next_step = life.verdict(
                metrics, decision, out_of_time=rt.out_of_time(), scheduler_reason=rt.scheduler.stop_reason
            )
        if next_step is Step.CONTINUE:
            return False
        if next_step is Step.EXPLOIT:  # the group stops and the trial goes on from the donor's: it keeps its slot
            return self.exploits.plan(metrics["training_iteration"])
        if next_step is Step.DIVERGED:  # FAILED now, and never shown to the scheduler (no promotion)
            trial.logger.error("%s: stopping as failed: non-finite %s", spec.name, life.diverged)
        elif next_step is Step.ABORTED:
            trial.logger.warning("%s: stopping at report %s (%s)", spec.name, step, life.stop_reason)
        elif next_step is Step.STOP_ALL:
            rt.end_early(f"the experiment's stopper ended it at {spec.name}'s report {step}")
        elif next_step is Step.PRUNED:
            trial.logger.info("%s: stopping at report %s (%s)", spec.name, step, life.stop_reason)
        elif next_step is Step.PAUSE:
            # It waits for the others (HyperBand's milestone) without holding workers: they may start meanwhile.
            trial.logger.info("%s: paused at report %s until its bracket is decided", spec.name, step)
        trial.slot.release()  # the group only tears down from here: the next trial may start
        return True

    def as_scheduled(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The report as schedulers see it: with Ray's ``time_total_s`` (seconds since the trial started, across
        its groups) when the trainable does not report one (it is not logged: MLflow has the run's times)."""
        if "time_total_s" in metrics:
            return metrics
        return {**metrics, "time_total_s": time.time() - self.trial.started}

    def _check_metrics(self, metrics: dict[str, Any]) -> None:
        wanted = {
            "the selection metric": self.trial.spec.template.selection_metric,
            "the scheduler's metric": self.trial.rt.scheduler.metric,
        }
        for role, name in wanted.items():
            if name and name not in metrics:
                reported = sorted(k for k in metrics if k != "training_iteration")
                raise MetricNotReported(
                    f"the training function never reports {name!r}, {role} (its first report has {reported}): "
                    f"report {name!r}, or select/schedule by one of {reported}"
                )
