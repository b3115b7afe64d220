"""A running trial as its jobs share it (``TrialGroups``' train loop, its reports, PBT's exploits, HyperBand's
pauses): the trial as it is now (its config changes with an exploit, its slot with a pause), its MLflow run's
writer, its life (``trial_life``: pure), and the groups it ran before the current one."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ddp_runtime as train
from sweepflow.tasks.sweep.runtime import SweepRuntime
from sweepflow.tasks.sweep.slots import HeldSlot
from sweepflow.tasks.sweep.template import SweepTrial
from sweepflow.tasks.sweep.trial_life import TrialLife
from sweepflow.tasks.tracking.writers import RunWriter


@dataclass
class RunningTrial:
    spec: SweepTrial  # with the config it trains with now (PBT replaces it)
    rt: SweepRuntime
    writer: RunWriter
    slot: HeldSlot  # the slot it holds now (HyperBand gives it back at a pause, takes another after)
    logger: Any
    life: TrialLife
    started: float = field(default_factory=time.time)  # the scheduler's ``time_total_s`` counts from here
    earlier_groups: list[train.Result] = field(default_factory=list)  # what its groups before this one cost

    @classmethod
    def start(
        cls, spec: SweepTrial, rt: SweepRuntime, writer: RunWriter, slot: HeldSlot, logger: Any
    ) -> RunningTrial:
        # What happens after each report, across the trial's groups (trial_life: pure, unit-tested); the trial's
        # jobs carry its steps out (MLflow, the slot, the logs, the next group).
        life = TrialLife(
            selection_metric=spec.template.selection_metric,
            selection_mode=spec.template.selection_mode,
            scheduler_metric=rt.scheduler.metric,
            max_reports=spec.template.max_reports,
        )
        return cls(spec=spec, rt=rt, writer=writer, slot=slot, logger=logger, life=life)

    def keep_history(self, fit: train.Result) -> None:
        """A group of the trial ended and another follows: its reports join the ones kept, numbered on."""
        self.life.keep_history(fit.metrics_history)
        self.earlier_groups.append(fit)
