"""Population Based Training as a Ray Tune user writes it (``sweepflow.tune.schedulers.PopulationBasedTraining``):
its rules checked report by report, then real experiments on the Dask cluster with MLflow and Prefect, where it
must beat random search at the same budget on a problem whose best learning rate changes as training goes."""

from __future__ import annotations

import json
import os
import random
import tempfile
import time

import pytest
from mlflow.tracking import MlflowClient

from sweepflow import tune
from sweepflow.tune.schedulers import PopulationBasedTraining

# ------------------------------------------------------------------------------------------- the toy problem
#: No fixed learning rate gets past this: the rate that climbs to 50 is too high beyond it (see `_step`).
FIXED_LR_CEILING = 52


def _step(accuracy: float, lr: float) -> float:
    """One step of a problem where schedules matter (after Ray's PBT function example, written anew): the learning
    rate that helps is 0.1 below 50 % accuracy, 0.01 up to 80 %, then 0.001. Within 3x of it a step gains 4
    points; too high loses 2; too low gains 0.5."""
    best_lr = 0.1 if accuracy < 50 else 0.01 if accuracy < 80 else 0.001
    if lr > 3 * best_lr:
        return max(accuracy - 2, 0.0)
    if lr < best_lr / 3:
        return accuracy + 0.5
    return min(accuracy + 4, 100.0)


#: Steps per trial: enough intervals (every 2 steps) for PBT to find the schedule even when a loaded machine starts
#: the population's trials seconds apart; fewer than ~100, under which no fixed rate gets past the ceiling.
STEPS = 60


def schedule_matters(config):
    """A function trainable with Ray 2's checkpoint API: it resumes from the checkpoint it is given (its own after
    a restart, a donor's copy after a PBT exploit) and saves one with every report."""
    accuracy, step = 0.0, 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory, open(os.path.join(directory, "state.json")) as f:
            state = json.load(f)
        accuracy, step = state["accuracy"], state["step"]
    while step < STEPS:
        time.sleep(0.05)  # a step takes time: the trials of a population train side by side
        accuracy, step = _step(accuracy, config["lr"]), step + 1
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "state.json"), "w") as f:
                json.dump({"accuracy": accuracy, "step": step}, f)
            tune.report({"accuracy": accuracy, "step": step}, checkpoint=tune.Checkpoint.from_directory(directory))


# ------------------------------------------------------------------------------------------- its rules, unit by unit


def _pbt(**kwargs):
    random.seed(0)
    defaults = dict(time_attr="training_iteration", metric="acc", mode="max", perturbation_interval=2)
    return PopulationBasedTraining(**{**defaults, **kwargs})


def test_the_bottom_trial_exploits_the_top_one_with_an_explored_config():
    pbt = _pbt(hyperparam_mutations={"lr": [0.001, 0.01, 0.1], "momentum": tune.uniform(0.1, 0.9)})
    configs = {t: pbt.on_trial_config(t, {"lr": 0.01}) for t in ("a", "b", "c", "d")}
    assert all(0.1 <= c["momentum"] <= 0.9 for c in configs.values())  # filled from its mutation, as in Ray
    for t in configs:
        pbt.on_trial_add(t)
    scores = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    for t in ("a", "b", "c"):  # reaching the interval one by one
        assert pbt.on_trial_result(t, {"acc": scores[t], "training_iteration": 1}) == "CONTINUE"
    decisions = {t: pbt.on_trial_result(t, {"acc": scores[t], "training_iteration": 2}) for t in ("b", "c", "d")}
    assert set(decisions.values()) == {"CONTINUE"}  # the bottom of b, c, d is b, which had passed its interval
    assert pbt.on_trial_result("a", {"acc": scores["a"], "training_iteration": 2}) == "EXPLOIT"
    plan = pbt.take_exploit("a")
    assert plan.donor == "d" and plan.score == 1.0 and plan.donor_score == 4.0  # ceil(4 * 0.25) = 1 in each
    assert plan.config["lr"] in (0.001, 0.01, 0.1)  # a neighbour in the list, or resampled
    assert plan.config["momentum"] != configs["d"]["momentum"]  # perturbed or resampled, not copied as is
    assert pbt.take_exploit("a") is None
    # Not again until another interval has passed.
    assert pbt.on_trial_result("a", {"acc": 0.0, "training_iteration": 3}) == "CONTINUE"


def test_explore_perturbs_resamples_and_applies_the_custom_function():
    never = _pbt(hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1), "layers": [1, 2, 3, 4]},
                 resample_probability=0.0, perturbation_factors=(2.0,),
                 custom_explore_fn=lambda c: {**c, "explored": True})
    new = never.explore({"lr": 0.01, "layers": 2, "batch": 32})
    assert new["lr"] == pytest.approx(0.02) and new["layers"] in (1, 3) and new["batch"] == 32 and new["explored"]
    always = _pbt(hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-3), "n": lambda: 7}, resample_probability=1.0)
    new = always.explore({"lr": 0.5, "n": 1})
    assert 1e-4 <= new["lr"] <= 1e-3 and new["n"] == 7
    nested = _pbt(hyperparam_mutations={"opt": {"lr": [0.1, 0.2]}}, resample_probability=1.0)
    assert nested.explore({"opt": {"lr": 0.1, "beta": 0.9}})["opt"]["beta"] == 0.9


def test_burn_in_and_require_attrs():
    pbt = _pbt(hyperparam_mutations={"lr": [0.1, 0.2]}, burn_in_period=4, quantile_fraction=0.5)
    for t, acc in (("a", 0.0), ("b", 1.0)):
        pbt.on_trial_add(t)
        pbt.on_trial_config(t, {"lr": 0.1})
        for i in (2, 3):
            assert pbt.on_trial_result(t, {"acc": acc, "training_iteration": i}) == "CONTINUE"  # burning in
    assert pbt.on_trial_result("b", {"acc": 1.0, "training_iteration": 4}) == "CONTINUE"
    assert pbt.on_trial_result("a", {"acc": 0.0, "training_iteration": 4}) == "EXPLOIT"
    with pytest.raises(ValueError, match="no numeric 'acc'"):
        pbt.on_trial_result("a", {"loss": 1.0, "training_iteration": 6})
    lenient = _pbt(hyperparam_mutations={"lr": [0.1]}, require_attrs=False)
    assert lenient.on_trial_result("a", {"loss": 1.0}) == "CONTINUE"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({}, "needs hyperparam_mutations"),
        ({"hyperparam_mutations": {"lr": 0.1}}, r"hyperparam_mutations\['lr'\]=0.1"),
        ({"hyperparam_mutations": {"lr": []}}, "empty list"),
        ({"hyperparam_mutations": {"lr": [1]}, "quantile_fraction": 0.7}, "between 0 and 0.5"),
        ({"hyperparam_mutations": {"lr": [1]}, "perturbation_interval": 0}, "perturbation_interval must be > 0"),
        ({"hyperparam_mutations": {"lr": [1]}, "mode": "maximum"}, "'min' or 'max'"),
    ],
)
def test_mistakes_are_refused_when_built(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        PopulationBasedTraining(**kwargs)


# ------------------------------------------------------------------------------------------- real experiments


def test_pbt_beats_random_search_at_the_same_budget_and_records_every_exploit(services):
    """Four trials of 60 steps each, from the same four sampled learning rates (seed 8): random search keeps
    them; PBT (two trials at a time: the cluster's room) lets the worse one of each pair continue from the
    better one's checkpoint with a perturbed rate every 2 steps."""
    space = {"lr": tune.loguniform(1e-3, 1e-1)}
    common = dict(config=space, num_samples=4, metric="accuracy", mode="max", seed=8, verbose=0)
    plain = tune.run(schedule_matters, name="toy-random", **common)
    random.seed(0)
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": tune.loguniform(1e-3, 1e-1)},
    )
    tuned = tune.run(schedule_matters, name="toy-pbt", scheduler=pbt, **common)

    def best(analysis):  # the best accuracy any trial reached
        return analysis.get_best_trial("accuracy", "max", scope="all").result.best

    assert all(t.result.config_history == () for t in plain.trials)  # nothing exploited without PBT
    assert best(plain) <= FIXED_LR_CEILING < best(tuned), (best(plain), best(tuned))
    # A recipient counts its own reports on from where it was; its trainable goes on from the donor's step (so it
    # may end sooner: one that copied a donor at its last step has nothing left to do).
    assert all(t.status == "TERMINATED" for t in tuned.trials)

    # Every exploit is recorded: in the result, and in the trial's MLflow run (tags, the hyperparameters as
    # metrics over time, the whole history as an artifact).
    exploited = [t for t in tuned.trials if len(t.result.config_history) > 1]
    assert exploited and pbt.num_perturbations >= sum(len(t.result.config_history) - 1 for t in exploited)
    client = MlflowClient(services["mlflow"])
    report = {a.path for a in client.list_artifacts(tuned.record.parent_run_id, "report")}
    assert "report/pbt.png" in report and not any(  # the lineage plot: only for PBT sweeps
        a.path == "report/pbt.png" for a in client.list_artifacts(plain.record.parent_run_id, "report")
    )
    if os.environ.get("SWEEPFLOW_KEEP_REPORT"):  # to look at it: the whole page, as the report opens
        client.download_artifacts(tuned.record.parent_run_id, "report", os.environ["SWEEPFLOW_KEEP_REPORT"])
    for trial in exploited:
        history = trial.result.config_history
        assert history[0] == {"iteration": 0, "config": history[0]["config"]}
        donors = {h["donor"] for h in history[1:]}
        pairs = {"trial_0000", "trial_0001"} if trial.trial_id in ("trial_0000", "trial_0001") else {
            "trial_0002", "trial_0003"}
        assert donors <= pairs - {trial.trial_id}, donors  # a donor ran at the same time as it
        assert trial.config == history[-1]["config"]  # the result's config is the one it ended with
        run = client.get_run(trial.mlflow_run_id)
        assert run.data.tags["sweepflow.pbt.exploits"] == str(len(history) - 1)
        assert run.data.tags["sweepflow.pbt.last_exploit"].startswith(f"copied {history[-1]['donor']} at report ")
        lr_steps = client.get_metric_history(trial.mlflow_run_id, "hparam/lr")
        assert len(lr_steps) == len(history) and lr_steps[-1].value == pytest.approx(history[-1]["config"]["lr"])
        local = client.download_artifacts(trial.mlflow_run_id, "pbt/config_history.json")
        with open(local) as f:
            assert [h["iteration"] for h in json.load(f)] == [h["iteration"] for h in history]
        # Its reports go on in order across exploits, one MLflow step each.
        reports = client.get_metric_history(trial.mlflow_run_id, "accuracy")
        assert sorted(m.step for m in reports) == list(range(1, len(trial.result.history) + 1))


def test_synchronous_pbt_perturbs_the_population_together_and_refuses_what_cannot_run_at_once(services):
    random.seed(1)
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=10,
        hyperparam_mutations={"lr": [0.001, 0.003, 0.01, 0.03, 0.1]},
        synch=True,
    )
    analysis = tune.run(
        schedule_matters,
        config={"lr": tune.grid_search([0.1, 0.003])},
        metric="accuracy", mode="max", scheduler=pbt, name="toy-synch", verbose=0,
    )
    histories = {t.trial_id: t.result.config_history for t in analysis.trials}
    # At step 10 both have reported (the first waited for the second): the slow one (5 %) continues from the
    # fast one (40 %). Every exploit is at a sync point.
    first = histories["trial_0001"][1]
    assert (first["iteration"], first["donor"], first["donor_score"]) == (10, "trial_0000", 40.0), histories
    assert {h["iteration"] for history in histories.values() for h in history[1:]} <= set(range(10, STEPS + 1, 10))

    too_many = PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=10, hyperparam_mutations={"lr": [0.1]}, synch=True
    )
    with pytest.raises(ValueError, match="waits for all 3 trials"):
        tune.run(schedule_matters, config={"lr": tune.grid_search([0.1, 0.01, 0.001])}, metric="accuracy",
                 mode="max", scheduler=too_many, verbose=0)


class Climber(tune.Trainable):
    """A class trainable on the same problem: PBT checkpoints it every interval by itself."""

    def setup(self, config):
        self.accuracy = 0.0

    def step(self):
        self.accuracy = _step(self.accuracy, self.config["lr"])
        return {"accuracy": self.accuracy}

    def save_checkpoint(self, checkpoint_dir):
        return {"accuracy": self.accuracy}

    def load_checkpoint(self, checkpoint):
        self.accuracy = checkpoint["accuracy"]

    def reset_config(self, new_config):
        self.config = new_config
        return True


def test_a_class_trainable_under_pbt_continues_from_its_donor(services):
    random.seed(2)
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=4,
        hyperparam_mutations={"lr": [0.003, 0.01, 0.03, 0.1]},
        resample_probability=0.0,
        # Its steps take microseconds: asynchronously, on a loaded machine one trial could end before the other
        # reported at all (a finished trial is no donor). Synchronous: both meet at every interval.
        synch=True,
    )
    analysis = tune.run(
        Climber, config={"lr": tune.grid_search([0.1, 0.003])}, stop={"training_iteration": 12},
        metric="accuracy", mode="max", scheduler=pbt, name="climber", verbose=0,
    )
    # The first exploit: the slow trial takes the fast one's state. A later one can be between equals (after the
    # first, both may stand at the same accuracy: CI once saw the fast trial "exploit" an equal at iteration 8).
    exploited = [t for t in analysis.trials if len(t.result.config_history) > 1]
    loser = min(exploited, key=lambda t: t.result.config_history[1]["iteration"])
    history = loser.result.config_history
    assert history[1]["donor"] != loser.trial_id and history[1]["iteration"] in (4, 8)
    # The report after the exploit starts from the donor's state: a jump no single step of its own makes (+4).
    k = history[1]["iteration"]
    accuracy = [r["accuracy"] for r in loser.result.history]
    assert accuracy[k] > accuracy[k - 1] + 4, accuracy
    assert len(accuracy) == 12  # stop={"training_iteration": 12} counts its reports across groups


class _ExploitThatFails(PopulationBasedTraining):
    """A scheduler whose exploit fails in the trial (here: taking on the explored config), outside its training."""

    def on_trial_config(self, trial_id, config):
        if trial_id in self._trials and self._trials[trial_id].config:  # not its start: an exploit
            raise RuntimeError(f"cannot take on {config} (the scheduler's error)")
        return super().on_trial_config(trial_id, config)


@pytest.mark.timeout(240)
def test_a_trial_that_errors_while_exploiting_does_not_hold_the_population_for_ever(services):
    # Synchronous PBT waits at each interval for every trial it counts as running: a trial that ended by an error
    # outside its training (not a FAILED result) must be taken out of the count, or the other waits for ever.
    random.seed(2)
    pbt = _ExploitThatFails(
        time_attr="training_iteration", perturbation_interval=4,
        hyperparam_mutations={"lr": [0.003, 0.01, 0.03, 0.1]}, resample_probability=0.0, synch=True,
    )
    with pytest.raises(Exception, match="the scheduler's error"):
        tune.run(
            Climber, config={"lr": tune.grid_search([0.1, 0.003])}, stop={"training_iteration": 12},
            metric="accuracy", mode="max", scheduler=pbt, name="climber-error", verbose=0,
        )
