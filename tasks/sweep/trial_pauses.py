"""HyperBand's pauses, as one trial waits them out (``resume_after_pause``): its group stopped at a milestone
without holding its workers; the trial waits for its bracket's verdict, then goes on from its latest checkpoint
in a slot of its own again, or ends there."""

from __future__ import annotations

import ddp_runtime as train
from ddp_runtime.checkpoint import RunStorage
from sweepflow.tasks.sweep.trial_scheduler import Decision
from sweepflow.tasks.sweep.trial_state import RunningTrial


def resume_after_pause(trial: RunningTrial, storage: str, fit: train.Result) -> train.Checkpoint | None | bool:
    """Wait for the paused trial's verdict. Stopped: False (the last group's result is the trial's). Going on: a
    slot again (ahead of trials not started), and the trial's latest checkpoint to continue from (None: it
    reported none, so it starts over)."""
    rt, life, name = trial.rt, trial.life, trial.spec.name
    life.paused = False
    verdict = rt.scheduler.wait_to_resume(
        trial.spec.trial_id, give_up=lambda: rt.aborted is not None or rt.out_of_time()
    )
    if verdict is not Decision.CONTINUE:
        life.stop_reason = rt.aborted or rt.scheduler.stop_reason
        trial.logger.info("%s: stopped while paused (%s)", name, life.stop_reason)
        return False
    trial.keep_history(fit)
    trial.slot = rt.slots.reacquire()
    rt.progress.holds_slot(trial.spec.trial_id, trial.slot)
    latest = RunStorage(storage, "checkpoints", rt.storage_options).list_committed()
    if not latest:
        trial.logger.warning(
            "%s: goes on after its pause without a checkpoint, so it starts over: report checkpoints "
            "(tune.report(..., checkpoint=...)) to go on where it paused",
            name,
        )
    trial.logger.info("%s: goes on from report %d", name, len(life.covered))
    return latest[-1].checkpoint if latest else None
