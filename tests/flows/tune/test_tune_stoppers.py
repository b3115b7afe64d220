"""Ray Tune's stoppers, as the flow asks them (in report order): which report completes a trial, when the
experiment ends. The experiments they end are in test_tune.py."""

from __future__ import annotations

import datetime
import time

import pytest

from sweepflow import tune
from sweepflow.tune.stopper import (
    CombinedStopper,
    ExperimentPlateauStopper,
    FunctionStopper,
    MaximumIterationStopper,
    TimeoutStopper,
    TrialPlateauStopper,
    max_reports,
)


def _reports(stopper, trial_id, values, metric="loss"):
    """The first report (1-based) at which the stopper completes the trial, or None."""
    for i, value in enumerate(values, start=1):
        if stopper(trial_id, {metric: value, "training_iteration": i}):
            return i
    return None


def test_maximum_iteration_stopper_completes_at_its_report_and_bounds_the_trials():
    stopper = MaximumIterationStopper(max_iter=3)
    assert _reports(stopper, "t0", [5, 4, 3, 2, 1]) == 3
    assert not stopper.stop_all() and max_reports(stopper) == 3
    with pytest.raises(ValueError, match="max_iter"):
        MaximumIterationStopper(0)


def test_trial_plateau_stopper_waits_for_its_window_and_threshold():
    flat_after_two = [5.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert _reports(TrialPlateauStopper("loss", std=0.01, num_results=3, grace_period=3), "t", flat_after_two) == 4
    # Still moving: never stops.
    assert _reports(TrialPlateauStopper("loss", num_results=3, grace_period=3), "t", [5, 4, 3, 2, 1]) is None
    # Flat, but not yet good enough for the threshold: stops only once it is under it.
    stopper = TrialPlateauStopper("loss", num_results=2, grace_period=2, metric_threshold=0.5, mode="min")
    assert _reports(stopper, "t", [1.0, 1.0, 1.0, 0.4, 0.4]) == 5
    # Windows are per trial.
    two = TrialPlateauStopper("loss", num_results=2, grace_period=2)
    assert not two("a", {"loss": 1.0}) and not two("b", {"loss": 1.0}) and two("a", {"loss": 1.0})
    with pytest.raises(ValueError, match="mode"):
        TrialPlateauStopper("loss", metric_threshold=0.5)
    with pytest.raises(ValueError, match="no 'loss'"):
        TrialPlateauStopper("loss")("t", {"acc": 1.0})


def test_experiment_stoppers_end_the_experiment():
    plateau = ExperimentPlateauStopper("loss", std=0.001, top=2, mode="min", patience=1)
    for value in (3.0, 1.0, 1.0):
        assert not plateau("t", {"loss": value})
    assert not plateau.stop_all()  # flat once: patience 1 wants a second time
    plateau("t", {"loss": 2.0})
    assert plateau.stop_all()

    timeout = TimeoutStopper(datetime.timedelta(seconds=0.2))
    assert not timeout.stop_all()  # the clock starts at the first report
    timeout("t", {"loss": 1.0})
    assert not timeout.stop_all()
    time.sleep(0.25)
    assert timeout.stop_all()


def test_combined_and_function_stoppers_ask_every_stopper():
    window = TrialPlateauStopper("loss", num_results=2, grace_period=2)
    combined = CombinedStopper(FunctionStopper(lambda trial_id, result: result["loss"] < 0), window)
    assert not combined("t", {"loss": 1.0})
    assert combined("t", {"loss": 1.0})  # the plateau window saw both reports
    assert combined("u", {"loss": -1.0})
    assert max_reports(CombinedStopper(MaximumIterationStopper(4), MaximumIterationStopper(2))) == 2
    with pytest.raises(TypeError, match="not a tune.Stopper"):
        CombinedStopper(lambda t, r: True)


def test_a_stopper_subclass_is_what_ray_users_write():
    class StopWhenGoodEnough(tune.Stopper):
        def __init__(self):
            self.good = False

        def __call__(self, trial_id, result):
            self.good = self.good or result["score"] >= 2
            return result["training_iteration"] >= 3

        def stop_all(self):
            return self.good

    stopper = StopWhenGoodEnough()
    assert not stopper("t", {"score": 1, "training_iteration": 1}) and not stopper.stop_all()
    assert not stopper("t", {"score": 2, "training_iteration": 2}) and stopper.stop_all()
    with pytest.raises(NotImplementedError, match="__call__"):
        tune.Stopper()("t", {})
