"""Synchronous HyperBand as a Ray Tune user writes it (``sweepflow.tune.schedulers.HyperBandScheduler``): Ray's
brackets and milestones, checked report by report; then a real experiment in which trials pause at their
bracket's milestone (giving their workers to the bracket's other trials) and the best go on from their
checkpoints."""

from __future__ import annotations

import json
import os
import tempfile
import time

import pytest
from mlflow.tracking import MlflowClient

from sweepflow import tune
from sweepflow.tasks.sweep.slots import TrialSlots
from sweepflow.tune.schedulers import HyperBandScheduler


def _hyperband(**kwargs):
    return HyperBandScheduler(**{"metric": "score", "mode": "max", "max_t": 9, "reduction_factor": 3, **kwargs})


def test_brackets_have_rays_sizes_and_milestones():
    hb = _hyperband(max_t=81)
    for i in range(5 + 8 + 15 + 1):
        hb.on_trial_add(f"t{i}")
    # Ray's HyperBand for max_t=81, eta=3: brackets of 5 trials from 81, 8 from 27, 15 from 9, 34 from 3, ...
    assert hb.brackets() == [(5, 81, 5), (8, 27, 8), (15, 9, 15), (34, 3, 1)]


def test_a_bracket_pauses_at_its_milestone_and_keeps_the_best_third():
    hb = _hyperband()  # brackets: 3 trials straight to 9; then 5 trials from 3 (keep 2)
    for i in range(8):
        hb.on_trial_add(f"t{i}")
    assert hb.on_trial_result("t0", {"score": 1, "training_iteration": 8}) == "CONTINUE"
    assert hb.on_trial_result("t0", {"score": 1, "training_iteration": 9}) == "STOP"  # done at max_t
    scores = {"t3": 5, "t4": 1, "t5": 4, "t6": 2}
    for t, score in scores.items():  # the first four of the second bracket wait at 3 for the fifth
        assert hb.on_trial_result(t, {"score": score, "training_iteration": 2}) == "CONTINUE"
        assert hb.on_trial_result(t, {"score": score, "training_iteration": 3}) == "PAUSE"
    assert hb.on_trial_result("t7", {"score": 3, "training_iteration": 3}) == "STOP"  # the last: decided now
    verdicts = {t: hb.wait_to_resume(t, give_up=lambda: False) for t in scores}
    assert verdicts == {"t3": "CONTINUE", "t4": "STOP", "t5": "CONTINUE", "t6": "STOP"}
    assert hb.on_trial_result("t3", {"score": 6, "training_iteration": 4}) == "CONTINUE"  # on to 9
    assert hb.wait_to_resume("t4", give_up=lambda: True) == "STOP"  # a sweep that stops wakes the waiting


def test_a_bracket_that_will_not_fill_is_decided_when_no_trial_is_left_to_start():
    hb = _hyperband()
    for i in range(5):  # 3 in the first bracket, 2 in the second (of 5)
        hb.on_trial_add(f"t{i}")
    assert hb.on_trial_result("t3", {"score": 1, "training_iteration": 3}) == "PAUSE"
    hb.on_trial_error("t4")  # one fails: the other waited only for it, and no trial is left to start
    hb.no_more_trials(5)
    assert hb.wait_to_resume("t3", give_up=lambda: False) == "CONTINUE"


def test_a_paused_trial_gets_a_slot_before_new_trials():
    slots = TrialSlots(1)
    first = slots.acquire(0)
    first.release()  # it paused
    taken = slots.reacquire()  # the paused one comes back first ...
    assert slots.acquire(1, timeout=0) is None  # ... and the next new trial waits
    taken.release()
    assert slots.acquire(1, timeout=0) is not None


@pytest.mark.parametrize(
    "kwargs,message",
    [({"max_t": 0}, "max_t must be >= 1"), ({"reduction_factor": 1}, "reduction_factor must be > 1"),
     ({"stop_last_trials": False}, "stop_last_trials=True"), ({"mode": "best"}, "'min' or 'max'")],
)
def test_mistakes_are_refused_when_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _hyperband(**kwargs)


def rising(config):
    """score = quality * step, one checkpoint per report; it goes on from its checkpoint after a pause."""
    step = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory, open(os.path.join(directory, "step.json")) as f:
            step = json.load(f)["step"]
    while True:
        time.sleep(0.02)
        step += 1
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "step.json"), "w") as f:
                json.dump({"step": step}, f)
            tune.report({"score": config["quality"] * step, "step": step}, checkpoint=tune.Checkpoint.from_directory(directory))


def test_hyperband_experiment_pauses_trials_and_continues_the_best_from_their_checkpoints(services):
    """8 trials, 2 at a time: trials 0-2 run to max_t=9; trials 3-7 (one bracket) each pause at 3 until all five
    got there, then the two best go on to 9 from their checkpoints and three are stopped."""
    qualities = [0.5, 0.2, 0.9, 0.1, 0.7, 0.3, 0.9, 0.5]
    analysis = tune.run(
        rising,
        config={"quality": tune.grid_search(qualities)},
        metric="score", mode="max",
        scheduler=HyperBandScheduler(max_t=9, reduction_factor=3),
        name="hyperband", verbose=0,
    )
    trials = analysis.trials
    assert [len(t.result.history) for t in trials[:3]] == [9, 9, 9]
    bracket = {t.config["quality"]: t for t in trials[3:]}
    kept = sorted(q for q, t in bracket.items() if len(t.result.history) == 9)
    assert kept == [0.7, 0.9], {q: len(t.result.history) for q, t in bracket.items()}
    for quality, trial in bracket.items():
        # Every trial of the bracket reported up to the milestone; the stopped ones no further.
        steps = [r["step"] for r in trial.result.history]
        assert steps == list(range(1, len(steps) + 1)), steps  # the kept ones went on from step 3's checkpoint
        if quality not in kept:
            assert len(steps) == 3 and trial.result.stop_reason == "HyperBand"
            assert trial.result.status.value == "STOPPED"
    # Recorded as every sweep: the stopped trials' MLflow runs say so.
    client = MlflowClient(services["mlflow"])
    stopped = client.get_run(bracket[0.1].mlflow_run_id)
    assert stopped.data.tags["sweepflow.status"] == "STOPPED"
