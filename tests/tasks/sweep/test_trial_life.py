"""A trial's life (tasks/sweep/trial_life.py) on its own, in milliseconds: the sweep's real schedulers give the
verdicts, nothing else runs (no Prefect, MLflow or Dask: `make lint` checks the module imports none)."""

from __future__ import annotations

import math
import random

import pytest

from sweepflow.tasks.sweep.hyperband import HyperBandScheduler
from sweepflow.tasks.sweep.pbt import PopulationBasedTraining
from sweepflow.tasks.sweep.results import TrialStatus
from sweepflow.tasks.sweep.schedulers import ASHAScheduler, Decision, FIFOScheduler, MedianStoppingRule
from sweepflow.tasks.sweep.trial_life import Step, TrialLife, reports_up_to


def _life(max_reports: int = 4, scheduler_metric: str | None = "val_loss") -> TrialLife:
    return TrialLife(
        selection_metric="val_loss", selection_mode="min", scheduler_metric=scheduler_metric, max_reports=max_reports
    )


def _report(life: TrialLife, scheduler, trial: str, i: int, loss: float, *, aborted=None, out_of_time=False):
    """One report as the adapter takes it: numbered, best so far, screened, then the scheduler's verdict."""
    metrics = {"training_iteration": i, "epoch": i, "val_loss": loss}
    life.number(metrics)
    best = life.best(metrics)
    step = life.screen(metrics, aborted=aborted)
    if step is None:
        decision = scheduler.on_trial_result(trial, metrics)
        step = life.verdict(metrics, decision, out_of_time=out_of_time, scheduler_reason=scheduler.stop_reason)
    return step, best, metrics


def test_fifo_never_stops_a_trial_and_a_stop_at_max_t_is_completion_not_pruning():
    life, fifo = _life(max_reports=3), FIFOScheduler()
    fifo.on_trial_add("t")
    assert [_report(life, fifo, "t", i, 1.0 / i)[0] for i in (1, 2, 3)] == [Step.CONTINUE] * 3
    assert life.status(failed=False, stopped_early=False) is TrialStatus.COMPLETED  # its function ended
    asha = ASHAScheduler(metric="val_loss", mode="min", max_t=3, grace_period=1, reduction_factor=2)
    alone = _life(max_reports=3)
    asha.on_trial_add("a")
    assert [_report(alone, asha, "a", i, 1.0 / i)[0] for i in (1, 2, 3)] == [Step.CONTINUE, Step.CONTINUE, Step.COMPLETE]
    assert alone.reached_max_t and alone.status(failed=False, stopped_early=True) is TrialStatus.COMPLETED


def test_the_best_so_far_skips_non_finite_values_and_follows_the_mode():
    life = _life()
    assert life.best({"val_loss": 3.0}) == {"best_val_loss": 3.0}
    assert life.best({"val_loss": 5.0}) == {"best_val_loss": 3.0}
    assert life.best({"val_loss": math.inf}) == {"best_val_loss": 3.0}
    assert life.best({"val_loss": 2.0}) == {"best_val_loss": 2.0}
    high = TrialLife(selection_metric="acc", selection_mode="max", scheduler_metric=None, max_reports=0)
    assert high.best({"acc": 0.5}) == {"best_acc": 0.5} and high.best({"acc": 0.4}) == {"best_acc": 0.5}
    assert high.best({"other": 1}) == {"best_acc": 0.5}
    assert _life().best({"val_loss": True}) == {}  # a bool is not a value


def test_asha_prunes_a_worse_trial_at_its_rung_with_its_name_as_the_reason():
    asha = ASHAScheduler(metric="val_loss", mode="min", max_t=4, grace_period=1, reduction_factor=2)
    good, bad = _life(), _life()
    for trial in ("good", "bad"):
        asha.on_trial_add(trial)
    assert _report(good, asha, "good", 1, 0.1)[0] is Step.CONTINUE
    assert _report(bad, asha, "bad", 1, 0.9)[0] is Step.PRUNED
    assert bad.stop_reason == "ASHA" and not bad.reached_max_t
    assert bad.status(failed=False, stopped_early=True) is TrialStatus.STOPPED
    assert bad.saved_epochs(TrialStatus.STOPPED, 1) == 3


def test_the_median_rule_prunes_below_the_median_after_its_grace_period():
    rule = MedianStoppingRule(metric="val_loss", mode="min", grace_period=1, min_samples_required=1)
    first, second = _life(), _life()
    rule.on_trial_add("a")
    for i in (1, 2, 3, 4):
        _report(first, rule, "a", i, 1.0)
    rule.on_trial_complete("a", {"val_loss": 1.0})
    rule.on_trial_add("b")
    assert _report(second, rule, "b", 1, 2.0)[0] is Step.PRUNED
    assert second.stop_reason == "median stopping rule"


def test_a_non_finite_metric_fails_the_trial_and_is_never_shown_to_the_scheduler():
    class Watching(FIFOScheduler):
        seen: list = []

        def on_trial_result(self, trial_id, result):
            self.seen.append(result["val_loss"])
            return super().on_trial_result(trial_id, result)

    life, sched = _life(), Watching()
    sched.on_trial_add("t")
    assert _report(life, sched, "t", 1, 0.5)[0] is Step.CONTINUE
    step, best, _ = _report(life, sched, "t", 2, math.nan)
    assert step is Step.DIVERGED and best == {"best_val_loss": 0.5}
    assert sched.seen == [0.5]
    assert life.diverged == "val_loss=nan at report 2"
    assert life.status(failed=False, stopped_early=True) is TrialStatus.FAILED
    # The scheduler's own metric counts too, even when the selection metric is fine.
    other = TrialLife(selection_metric="acc", selection_mode="max", scheduler_metric="val_loss", max_reports=4)
    metrics = {"training_iteration": 1, "acc": 0.5, "val_loss": -math.inf}
    assert other.screen(metrics, aborted=None) is Step.DIVERGED and other.diverged.startswith("val_loss=-inf")


def test_an_ending_sweep_stops_the_trial_before_its_scheduler_and_the_time_budget_prunes_it():
    life, fifo = _life(), FIFOScheduler()
    fifo.on_trial_add("t")
    step, _, _ = _report(life, fifo, "t", 1, 0.5, aborted="another trial failed")
    assert step is Step.ABORTED and life.stop_reason == "another trial failed"
    timed = _life()
    fifo.on_trial_add("u")
    assert _report(timed, fifo, "u", 1, 0.5, out_of_time=True)[0] is Step.PRUNED
    assert timed.stop_reason == "time budget"


def test_a_stopper_that_ends_everything_completes_this_trial_and_done_is_completion():
    life = _life(max_reports=10)
    metrics = {"training_iteration": 2}
    assert life.verdict(metrics, Decision.STOP_ALL, out_of_time=False, scheduler_reason="x") is Step.STOP_ALL
    assert life.reached_max_t
    done = _life(max_reports=10)
    assert done.verdict(metrics, Decision.DONE, out_of_time=True, scheduler_reason="x") is Step.COMPLETE
    # The time budget wins over an exploit the scheduler would have asked for.
    late = _life(max_reports=10)
    assert late.verdict(metrics, Decision.EXPLOIT, out_of_time=True, scheduler_reason="PBT") is Step.PRUNED


def test_hyperband_pauses_at_the_milestone_and_the_next_group_numbers_on():
    hb = HyperBandScheduler(metric="val_loss", mode="min", max_t=4, reduction_factor=2)
    lives = {}
    # Brackets of 3 (max_t 4, eta 2): the first three run to max_t without a milestone, as in Ray.
    for t in ("a", "b", "c", "d", "e", "f"):
        hb.on_trial_add(t)
        lives[t] = _life()
    for t in ("a", "b", "c"):
        assert [_report(lives[t], hb, t, i, 1.0)[0] for i in (1, 2, 3, 4)][-1] is Step.COMPLETE
    hb.no_more_trials(6)
    steps = {t: [_report(lives[t], hb, t, i, q)[0] for i in (1, 2)] for t, q in (("d", 3.0), ("e", 1.0))}
    assert steps == {"d": [Step.CONTINUE, Step.PAUSE], "e": [Step.CONTINUE, Step.PAUSE]}
    assert lives["d"].paused
    # The last of the bracket arrives: it is decided now; the paused ones hear their verdicts.
    assert [_report(lives["f"], hb, "f", i, 2.0)[0] for i in (1, 2)] == [Step.CONTINUE, Step.CONTINUE]
    assert hb.wait_to_resume("e", give_up=lambda: False) is Decision.CONTINUE
    assert hb.wait_to_resume("d", give_up=lambda: False) is Decision.STOP
    # e's next group restarts its numbering at 1; the life numbers it after the two kept reports.
    e = lives["e"]
    e.keep_history([{"training_iteration": 1, "val_loss": 1.0}, {"training_iteration": 2, "val_loss": 1.0}])
    step, _, metrics = _report(e, hb, "e", 1, 1.0)
    assert metrics["training_iteration"] == 3 and step is Step.CONTINUE
    assert [r["training_iteration"] for r in e.history([{"training_iteration": 1}, {"training_iteration": 2}])] == [
        1, 2, 3, 4,
    ]


def test_pbt_asks_the_bottom_trial_to_exploit_the_top_one():
    random.seed(0)
    pbt = PopulationBasedTraining(
        time_attr="training_iteration", metric="val_loss", mode="min", perturbation_interval=2,
        quantile_fraction=0.5, resample_probability=0, hyperparam_mutations={"lr": [0.01, 0.1]},
    )
    top, bottom = _life(max_reports=6), _life(max_reports=6)
    for t in ("top", "bottom"):
        pbt.on_trial_add(t)
        pbt.on_trial_config(t, {"lr": 0.01})
    assert _report(top, pbt, "top", 1, 0.1)[0] is Step.CONTINUE
    assert _report(bottom, pbt, "bottom", 1, 0.9)[0] is Step.CONTINUE
    assert _report(top, pbt, "top", 2, 0.1)[0] is Step.CONTINUE
    assert _report(bottom, pbt, "bottom", 2, 0.9)[0] is Step.EXPLOIT
    plan = pbt.take_exploit("bottom")
    assert plan.donor == "top" and plan.config["lr"] in (0.01, 0.1)
    assert bottom.status(failed=False, stopped_early=True) is TrialStatus.STOPPED  # until it goes on


def test_a_resumed_trial_keeps_the_reports_its_checkpoint_covers_and_its_best():
    history = [{"training_iteration": i, "val_loss": loss} for i, loss in ((1, 0.5), (2, 0.3), (3, 0.4))]
    kept = reports_up_to({"val_loss": 0.3, "training_iteration": 2}, history)
    assert kept == history[:2]
    # A checkpoint whose report never reached the run (the process died first): appended, numbered after.
    assert reports_up_to({"val_loss": 0.2}, history)[-1] == {"val_loss": 0.2, "training_iteration": 4}
    life = _life()
    assert life.resume(kept) == kept and life.best_so_far == 0.3
    metrics = {"training_iteration": 1, "val_loss": 0.35}
    assert life.number(metrics) and metrics["training_iteration"] == 3


def test_a_failure_is_failed_whatever_else_happened():
    life = _life()
    life.reached_max_t = True
    assert life.status(failed=True, stopped_early=False) is TrialStatus.FAILED
    assert life.saved_epochs(TrialStatus.FAILED, 1) == 0


@pytest.mark.parametrize("decision", [Decision.CONTINUE])
def test_continue_keeps_the_group_going(decision):
    assert _life().verdict({"training_iteration": 1}, decision, out_of_time=False, scheduler_reason="") is (
        Step.CONTINUE
    )
    assert not Step.CONTINUE.stops_group and all(s.stops_group for s in Step if s is not Step.CONTINUE)
