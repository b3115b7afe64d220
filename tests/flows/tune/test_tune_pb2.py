"""PB2 (``sweepflow.tune.schedulers.pb2.PB2``): PBT's exploit with a GP-bandit explore. Its decisions are pure, so
they are tested here without services: the GP's choice, unit by unit, and a seeded toy population run step by step
in this process, where PB2 ends better than PBT's random explore."""

from __future__ import annotations

import random

import numpy as np
import pytest

from sweepflow import tune
from sweepflow.tasks.sweep.pb2 import select_config
from sweepflow.tune.schedulers import PopulationBasedTraining
from sweepflow.tune.schedulers.pb2 import PB2


def _pb2(**kwargs):
    random.seed(0)
    defaults = dict(time_attr="training_iteration", metric="acc", mode="max", perturbation_interval=2)
    return PB2(**{**defaults, **kwargs})


# ------------------------------------------------------------------------------------------- the GP's choice


def test_the_gp_proposes_within_the_bounds_where_the_reward_improved():
    """One hyperparameter (scaled to [0, 1]): the reward grew fast near 0.3 and fell elsewhere."""
    rng = np.random.default_rng(0)
    h = rng.uniform(0, 1, 40)
    observations = np.column_stack([np.linspace(0, 1, 40), np.full(40, 0.5), h])
    changes = np.exp(-(((h - 0.3) / 0.1) ** 2)) - 0.2
    chosen = [
        select_config(observations, changes, now=np.array([1.0, 0.5]), donor=np.array([0.9]), rng=rng)
        for _ in range(3)
    ]
    assert all(0.0 <= c[0] <= 1.0 for c in chosen)
    assert all(abs(c[0] - 0.3) < 0.15 for c in chosen), chosen


def test_pending_choices_spread_a_round_out():
    """With nothing learnt (every change equal), a point already given out this round is not chosen again."""
    rng = np.random.default_rng(1)
    observations = np.column_stack([np.linspace(0, 1, 10), np.full(10, 0.5), np.linspace(0.4, 0.6, 10), np.full(10, 0.5)])
    changes = np.zeros(10)
    first = select_config(observations, changes, now=np.array([1.0, 0.5]), donor=np.array([0.5, 0.5]), rng=rng)
    second = select_config(
        observations, changes, now=np.array([1.0, 0.5]), donor=np.array([0.5, 0.5]), pending=first.reshape(1, -1),
        rng=rng,
    )
    assert np.linalg.norm(first - second) > 0.2, (first, second)


def test_pb2_exploits_like_pbt_and_explores_within_the_bounds():
    pb2 = _pb2(hyperparam_bounds={"lr": [1e-4, 1e-1], "opt": {"momentum": [0.1, 0.9]}, "layers": [1, 8]})
    configs = {t: pb2.on_trial_config(t, {"lr": 0.01, "layers": 2}) for t in ("a", "b", "c", "d")}
    assert all(0.1 <= c["opt"]["momentum"] <= 0.9 for c in configs.values())  # filled within its bounds
    for t in configs:
        pb2.on_trial_add(t)
    for step in (1, 2, 3, 4):
        decisions = {t: pb2.on_trial_result(t, {"acc": step * (i + 1), "training_iteration": step})
                     for i, t in enumerate(configs)}
    assert decisions["a"] == "EXPLOIT" and set(decisions.values()) == {"CONTINUE", "EXPLOIT"}
    plan = pb2.take_exploit("a")
    assert plan.donor == "d"
    assert 1e-4 <= plan.config["lr"] <= 1e-1 and 0.1 <= plan.config["opt"]["momentum"] <= 0.9
    assert isinstance(plan.config["layers"], int) and 1 <= plan.config["layers"] <= 8  # an int stays an int
    assert "PB2(" in repr(pb2) and pb2.num_perturbations >= 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "PB2 needs hyperparam_bounds"),
        ({"hyperparam_bounds": {"lr": tune.uniform(0, 1)}}, r"give the continuous range as \[low, high\]"),
        ({"hyperparam_bounds": {"lr": [0.1, 0.01]}}, "low must be below high"),
        ({"hyperparam_bounds": {"lr": [0, 1]}, "quantile_fraction": 0.7}, "quantile_fraction"),
    ],
)
def test_mistakes_are_refused_when_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PB2(**kwargs)


# ------------------------------------------------------------------------------------------- a toy population

#: Reports per trial, trials in the population, reports between exploits.
STEPS, POPULATION, INTERVAL = 40, 4, 4


def _gain(h: float, step: int) -> float:
    """A step's reward: best when ``h`` is near a value that drifts from 0.2 to 0.7 during training (a schedule
    to follow), nothing more than 0.2 away from it."""
    best = 0.2 + 0.5 * step / STEPS
    return max(0.0, 1.0 - ((h - best) / 0.2) ** 2)


def _toy(scheduler, seed: int) -> float:
    """The population trained step by step in this process, as the sweep would (an exploit copies the donor's
    state, its "checkpoint"); returns the best final reward."""
    rng = np.random.default_rng(seed)
    configs, state = {}, {}
    for i in range(POPULATION):
        trial = f"trial_{i}"
        configs[trial] = scheduler.on_trial_config(trial, {"h": float(rng.uniform(0, 1))})
        scheduler.on_trial_add(trial)
        state[trial] = (0.0, 0)  # reward, step
    for iteration in range(1, STEPS + 1):
        for trial in configs:
            reward, step = state[trial]
            state[trial] = (reward + _gain(configs[trial]["h"], step), step + 1)
            result = {"reward": state[trial][0], "training_iteration": iteration}
            if scheduler.on_trial_result(trial, result) == "EXPLOIT":
                plan = scheduler.take_exploit(trial)
                state[trial] = state[plan.donor]
                configs[trial] = scheduler.on_trial_config(trial, plan.config)
    return max(reward for reward, _ in state.values())


def test_pb2_beats_pbts_random_explore_on_a_drifting_optimum():
    """Six seeded populations each (the same initial values for both): the median best final reward."""
    common = dict(time_attr="training_iteration", metric="reward", mode="max", perturbation_interval=INTERVAL)
    pbt, pb2 = [], []
    for seed in range(6):
        random.seed(seed)
        pbt.append(_toy(PopulationBasedTraining(hyperparam_mutations={"h": tune.uniform(0, 1)}, **common), seed))
        random.seed(seed)
        pb2.append(_toy(PB2(hyperparam_bounds={"h": [0.0, 1.0]}, **common), seed))
    assert np.median(pb2) > np.median(pbt) + 3, (pbt, pb2)


# ------------------------------------------------------------------------------------------- a real experiment


def test_tune_run_with_pb2_exploits_with_gp_chosen_rates_within_the_bounds(services):
    """Ray's pb2_example as its users write it (PB2 imported from Ray's module path), on the PBT tests' toy
    trainable: the bottom trial of each pair continues from the top one's checkpoint with a rate the GP chose,
    recorded as PBT's exploits are."""
    from mlflow.tracking import MlflowClient
    from test_tune_pbt import schedule_matters

    random.seed(0)
    pb2 = PB2(time_attr="training_iteration", perturbation_interval=4, hyperparam_bounds={"lr": [0.001, 0.1]})
    analysis = tune.run(
        schedule_matters, name="toy-pb2", scheduler=pb2, config={"lr": tune.loguniform(1e-3, 1e-1)}, num_samples=4,
        metric="accuracy", mode="max", seed=8, verbose=0,
    )
    assert all(t.status == "TERMINATED" for t in analysis.trials)
    exploited = [t for t in analysis.trials if len(t.result.config_history) > 1]
    assert exploited and pb2.num_perturbations >= sum(len(t.result.config_history) - 1 for t in exploited)
    for trial in exploited:
        assert all(0.001 <= h["config"]["lr"] <= 0.1 for h in trial.result.config_history[1:])
        assert trial.config == trial.result.config_history[-1]["config"]
    parent = MlflowClient(services["mlflow"]).get_run(analysis.record.parent_run_id)
    assert parent.data.params["scheduler"].startswith("PB2(")
