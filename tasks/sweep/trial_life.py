"""A trial's life as a small state machine: given its reports and the scheduler's verdicts, what happens next.

Pure: no Prefect, MLflow or Dask (``make lint`` checks it). ``sweepflow.tasks.sweep.trial_groups`` is the
adapter: it runs the DDP groups, writes MLflow, releases the trial's slot and logs, each as this machine decides. A trial
may span several groups (a restart after a failure is the group's own business; a PBT exploit or a HyperBand
pause ends a group and starts another), and a resumed trial continues an interrupted sweep's run: its reports
are numbered across all of them (``training_iteration``), which is what schedulers and ``max_t`` count.

Per report, in this order (the order is the contract):
1. ``number``: the report's ``training_iteration`` continues the trial's earlier groups.
2. ``best``: the trial's best selection-metric value so far (what the runs table sorts by while it trains).
3. ``screen``: a non-finite metric the sweep ranks by ends the trial as FAILED and is never shown to the
   scheduler (a NaN must not be promoted); a sweep that is ending stops the trial.
4. ``verdict``: the scheduler's decision (and the time budget) as the next step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sweepflow.tasks.sweep.results import TrialStatus
from sweepflow.tasks.sweep.trial_scheduler import Decision

from ._str_enum import StrEnum

__all__ = ["Step", "TrialLife", "reports_up_to"]


class Step(StrEnum):
    """What the trial's current group does after a report."""

    CONTINUE = "continue"  # trains on
    DIVERGED = "diverged"  # stops, the trial FAILED (a non-finite metric), the scheduler never saw the report
    ABORTED = "aborted"  # stops: the sweep is ending (an error elsewhere, a stopper)
    COMPLETE = "complete"  # stops, complete: max_t reached or a stop criterion met (not pruned)
    STOP_ALL = "stop_all"  # stops, complete, and the whole sweep ends (a stopper said so at this report)
    PRUNED = "pruned"  # stops early: the scheduler pruned it, or the time budget ran out
    EXPLOIT = "exploit"  # the group stops; the trial continues from another trial's checkpoint (PBT)
    PAUSE = "pause"  # the group stops; the trial waits for its bracket's verdict (HyperBand)

    @property
    def stops_group(self) -> bool:
        return self is not Step.CONTINUE


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class TrialLife:
    """One trial's state across its groups. ``max_reports``: the reports at which it is complete (0: the trial
    decides, so a stop is always early); ``scheduler_metric``: what the scheduler ranks by (None: nothing)."""

    selection_metric: str | None
    selection_mode: str
    scheduler_metric: str | None
    max_reports: int
    covered: list[dict[str, Any]] = field(default_factory=list)  # the earlier groups' (and run's) reports
    best_so_far: float | None = None
    diverged: str | None = None  # why it FAILED at a non-finite report
    stop_reason: str | None = None  # why it stopped early: the scheduler's name, "time budget", an abort
    reached_max_t: bool = False  # stopped complete, not pruned (Ray: TERMINATED)
    paused: bool = False  # its group ended to wait for a verdict
    resumed_reports: int = 0  # of ``covered``, the reports an interrupted sweep's run already had

    # ------------------------------------------------------------------------------------------ per report

    def number(self, metrics: dict[str, Any]) -> bool:
        """Number ``metrics`` (in place) after the trial's earlier reports; True for the trial's first report
        in this group (the one whose keys are checked against what the sweep ranks by)."""
        metrics["training_iteration"] += len(self.covered)
        return metrics["training_iteration"] == len(self.covered) + 1

    def best(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        """``{"best_<metric>": value}`` after this report: the best finite selection-metric value so far."""
        value = metrics.get(self.selection_metric) if self.selection_metric else None
        if _finite_number(value):
            better = max if self.selection_mode == "max" else min
            self.best_so_far = float(value if self.best_so_far is None else better(self.best_so_far, value))
        return {} if self.best_so_far is None else {f"best_{self.selection_metric}": self.best_so_far}

    def screen(self, metrics: Mapping[str, Any], *, aborted: str | None) -> Step | None:
        """Before the scheduler sees the report: DIVERGED at a non-finite metric the sweep ranks by, ABORTED
        when the sweep is ending (``aborted``: why), else None (ask the scheduler)."""
        for name in (self.selection_metric, self.scheduler_metric):
            value = metrics.get(name) if name else None
            if isinstance(value, int | float) and not isinstance(value, bool) and not math.isfinite(value):
                self.diverged = f"{name}={value} at report {metrics['training_iteration']}"
                return Step.DIVERGED
        if aborted:
            self.stop_reason = aborted
            return Step.ABORTED
        return None

    def verdict(
        self, metrics: Mapping[str, Any], decision: Decision, *, out_of_time: bool, scheduler_reason: str
    ) -> Step:
        """The scheduler's ``decision`` on this report as the group's next step. A stop at ``max_reports`` is
        completion, not pruning; the time budget stops a trial the scheduler would have let go on (or exploit)."""
        at_max_t = self.max_reports > 0 and metrics["training_iteration"] >= self.max_reports
        if decision is Decision.STOP_ALL:
            self.reached_max_t = True
            return Step.STOP_ALL
        if decision is Decision.DONE or (decision is Decision.STOP and at_max_t):
            self.reached_max_t = True
            return Step.COMPLETE
        if decision is Decision.STOP or out_of_time:
            self.stop_reason = scheduler_reason if decision is Decision.STOP else "time budget"
            return Step.PRUNED
        if decision is Decision.EXPLOIT:
            return Step.EXPLOIT
        if decision is Decision.PAUSE:
            self.paused = True
            return Step.PAUSE
        return Step.CONTINUE

    # ------------------------------------------------------------------------------------------ across groups

    def keep_history(self, group_reports: Sequence[Mapping[str, Any]]) -> None:
        """A group ended and another follows (exploit, pause): its reports join the kept ones, numbered on."""
        self.covered = self.history(group_reports)

    def history(self, group_reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Every report of the trial: the kept ones, then the current group's numbered after them."""
        offset = len(self.covered)
        return [
            *self.covered,
            *({**m, "training_iteration": m["training_iteration"] + offset} for m in group_reports),
        ]

    def resume(self, reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """A resumed trial continues after ``reports`` (its checkpoint's, see ``reports_up_to``): they are kept,
        its best so far rebuilt from them; returns them, to be replayed to the scheduler."""
        self.covered = [dict(r) for r in reports]
        for report in self.covered:
            self.best(report)
        return self.covered

    def status(self, *, failed: bool, stopped_early: bool) -> TrialStatus:
        """How the trial ended: FAILED (an error, or diverged), STOPPED (pruned before max_t), else COMPLETED."""
        if failed or self.diverged:
            return TrialStatus.FAILED
        if stopped_early and not self.reached_max_t:
            return TrialStatus.STOPPED
        return TrialStatus.COMPLETED

    def saved_epochs(self, status: TrialStatus, epochs: int) -> int:
        """What early stopping spared: the reports up to max_t a pruned trial did not train."""
        return max(self.max_reports - epochs, 0) if status is TrialStatus.STOPPED else 0


def reports_up_to(checkpoint_metrics: Mapping[str, Any], history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reports a resumed trial keeps: those up to the one its latest checkpoint was reported with (found by
    its metrics, which the checkpoint's marker holds). When that report is not in the history (the dead process
    never wrote it), it is appended, numbered after the last."""
    numeric = {
        k: float(v)
        for k, v in checkpoint_metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and k != "training_iteration"
    }
    for i in range(len(history) - 1, -1, -1):
        report = history[i]
        if numeric and all(
            isinstance(report.get(k), int | float) and math.isclose(report[k], v, rel_tol=1e-9, abs_tol=1e-12)
            for k, v in numeric.items()
            if math.isfinite(v)
        ):
            return history[: i + 1]
    return [*history, {**checkpoint_metrics, "training_iteration": len(history) + 1}]
