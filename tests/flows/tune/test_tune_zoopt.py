"""Ray Tune's ``ZOOptSearch`` on the real library (the ``zoopt`` extra): Tune's space converted as Ray does,
ZOOpt's own ``dim_dict``, metric/mode, points first, the budget, ``parallel_num``, ConcurrencyLimiter/Repeater,
save/restore, mistakes refused before any trial; then a real ``tune.run`` recording its suggestions in MLflow."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from tune_planning import drive, planning
from zoopt import ValueType

from sweepflow import tune
from sweepflow.tasks.sweep.samplers import SamplerWaiting
from sweepflow.tune.search import ConcurrencyLimiter, Repeater
from sweepflow.tune.search.zoopt import ZOOptSearch


@pytest.fixture
def plan(monkeypatch):
    return planning(monkeypatch)


def _bowl(config) -> float:
    return (config["x"] - 0.5) ** 2 + (config["opt"]["y"] + 1) ** 2 + abs(config["layers"] - 2)


MIXED = {
    "x": tune.uniform(-2, 2),
    "opt": {"y": tune.quniform(-2, 2, 0.25)},
    "layers": tune.randint(1, 4),
    "width": tune.qrandint(16, 64, 16),
    "activation": tune.choice(["relu", "tanh"]),
    "epochs": 3,
}


def test_zoopt_converts_a_mixed_tune_space_learns_and_is_finished_at_its_budget(plan):
    np.random.seed(0)  # ZOOpt draws from NumPy's global state
    experiment = plan(
        config=MIXED, search_alg=ZOOptSearch(budget=30), metric="loss", mode="min", num_samples=50
    )
    configs = drive(experiment.sampler, _bowl)
    assert len(configs) == 30  # the budget, though num_samples is 50
    assert experiment.sampler.total == 30 and experiment.sampler.searcher.suggest("more") == "FINISHED"
    for c in configs:
        assert -2 <= c["x"] <= 2 and c["layers"] in (1, 2, 3) and isinstance(c["layers"], int)
        assert c["width"] in (16, 32, 48, 64) and c["activation"] in ("relu", "tanh") and c["epochs"] == 3
        assert c["opt"]["y"] / 0.25 == pytest.approx(round(c["opt"]["y"] / 0.25))  # a multiple of q
    assert min(_bowl(c) for c in configs[-10:]) < min(_bowl(c) for c in configs[:4])  # after its random start
    assert "ZOOptSearch" in experiment.search


def test_zoopt_mode_max_points_first_and_zoopts_own_dim_dict(plan):
    np.random.seed(1)
    search = ZOOptSearch(
        algo="SRacos",
        budget=12,
        dim_dict={
            "x": (ValueType.CONTINUOUS, [0, 1], 1e-3),
            "n": (ValueType.DISCRETE, [1, 5], True),
            "act": (ValueType.GRID, ["relu", "tanh"]),
            "lr": tune.uniform(0, 1),  # a tune.* domain may be mixed in
        },
        metric="score",
        mode="max",
        points_to_evaluate=[
            {"x": 0.25, "n": 2, "act": "tanh", "lr": 0.5},
            {"x": 0.75, "n": 5, "act": "relu", "lr": 0},
        ],
    )
    configs = drive(
        plan(config={"epochs": 1}, search_alg=search, num_samples=12).sampler,
        lambda c: c["x"] + c["n"] - c["lr"],
        metric="score",
    )
    assert configs[:2] == [
        {"epochs": 1, "x": 0.25, "n": 2, "act": "tanh", "lr": 0.5},
        {"epochs": 1, "x": 0.75, "n": 5, "act": "relu", "lr": 0.0},
    ]
    assert all(
        c["n"] in range(1, 6) and c["act"] in ("relu", "tanh") and round(c["x"], 3) == c["x"] for c in configs
    )
    assert max(c["x"] + c["n"] - c["lr"] for c in configs[4:]) > 5.5  # it climbs (mode max)


def test_zoopt_waits_for_results_with_parallel_num_and_goes_on_past_a_failed_trial():
    np.random.seed(2)
    search = ZOOptSearch(
        budget=10, dim_dict={"x": tune.uniform(0, 1)}, metric="loss", mode="min", parallel_num=2
    )
    first = [search.suggest(f"t{i}") for i in range(4)]  # ZOOpt's first phase: 4 samples for a budget of 10
    assert all(isinstance(c, dict) for c in first)
    assert search.suggest("t4") is None  # it waits for the first phase's results
    search.on_trial_complete("t0", {"loss": first[0]["x"]})
    search.on_trial_complete("t1", None, error=True)  # told as the worst value: ZOOpt does not wait for it
    search.on_trial_complete("t2", {"other": 1})  # no metric: the same
    search.on_trial_complete("t3", {"loss": first[3]["x"]})
    assert isinstance(search.suggest("t4"), dict) and isinstance(search.suggest("t5"), dict)
    assert search.suggest("t6") is None  # parallel_num=2 running
    search.on_trial_complete("t4", {"loss": 0.3})
    assert isinstance(search.suggest("t6"), dict)


def test_zoopt_waiting_is_the_sweeps_waiting_and_its_first_phase_ends_when_results_came_first(plan):
    np.random.seed(3)
    sampler = plan(
        config={"x": tune.uniform(0, 1)},
        search_alg=ZOOptSearch(budget=6, metric="loss", mode="min"),
        num_samples=6,
    ).sampler
    asked = [sampler.ask() for _ in range(4)]
    with pytest.raises(SamplerWaiting, match="returned None"):
        sampler.ask()
    from tune_planning import ended

    for number, config in asked:
        sampler.tell_result(number, ended(number, config, {"loss": config["x"]}))
    assert len(drive(sampler, lambda c: c["x"])) == 2  # ZOOpt 0.4 alone would wait for nothing here


def test_zoopt_with_limiter_and_repeater_and_saved_and_restored(plan, tmp_path):
    search = ZOOptSearch(budget=10, metric="loss", mode="min")
    experiment = plan(
        config=MIXED,
        search_alg=Repeater(ConcurrencyLimiter(search, max_concurrent=1), repeat=2),
        num_samples=20,
    )
    assert experiment.max_concurrent_trials == 1
    configs = drive(experiment.sampler, _bowl, n=12)
    assert configs[0]["x"] == configs[1]["x"] and configs[0]["__trial_index__"] == 0
    assert search._opt.complete_num == 6  # told once per config (the repeats' mean)
    search.save(str(tmp_path / "zoopt.pkl"))
    ZOOptSearch(
        budget=5, dim_dict={"z": tune.quniform(0, 1, 0.5)}
    )  # another space: ZOOpt keeps one in a global
    np.random.seed(4)
    expected = search.suggest("next")
    restored = ZOOptSearch(budget=3, metric="loss", mode="min")
    restored.restore(str(tmp_path / "zoopt.pkl"))
    np.random.seed(4)
    assert restored.suggest("next") == expected and restored._opt.complete_num == 6


def test_zoopt_is_rays_name_and_create_searchers():
    from sweepflow.tune.search import ZOOptSearch as lazy

    assert lazy is ZOOptSearch
    searcher = tune.create_searcher("zoopt", budget=5, metric="loss", mode="min")
    assert isinstance(searcher, ZOOptSearch) and searcher.metric == "loss"


def test_zoopt_mistakes_are_refused_before_any_trial(plan, monkeypatch):
    with pytest.raises(ValueError, match=r"lr: LogUniform is not searched by ZOOptSearch"):
        plan(
            config={"lr": tune.loguniform(1e-3, 1)},
            search_alg=ZOOptSearch(budget=5),
            metric="loss",
            mode="min",
            num_samples=5,
        )
    with pytest.raises(
        ValueError, match=r"x: tune.grid_search is not searched by ZOOptSearch.*use tune.choice"
    ):
        ZOOptSearch(budget=5, dim_dict={"x": tune.grid_search([1, 2])})
    with pytest.raises(ValueError, match=r"budget=None.*an integer >= 3"):
        ZOOptSearch()
    with pytest.raises(ValueError, match=r"budget=2.*ZOOpt exits the process below that"):
        ZOOptSearch(budget=2)
    with pytest.raises(ValueError, match=r"algo='bayes'.*'asracos' or 'sracos'"):
        ZOOptSearch(algo="bayes", budget=5)
    with pytest.raises(ValueError, match=r"\{'seed': 1\}.*reads only exploration_rate, uncertain_bits"):
        ZOOptSearch(budget=5, seed=1)
    space = {"x": tune.uniform(0, 1), "act": tune.choice(["relu", "tanh"])}
    with pytest.raises(
        ValueError, match=r"point 0 gives \['x'\]; give exactly the space's parameters \['act', 'x'\]"
    ):
        ZOOptSearch(budget=5, dim_dict=space, points_to_evaluate=[{"x": 0.5}])
    with pytest.raises(ValueError, match=r"point 0's act: 'gelu' is not one of \['relu', 'tanh'\]"):
        ZOOptSearch(budget=5, dim_dict=space, points_to_evaluate=[{"x": 0.5, "act": "gelu"}])
    with pytest.raises(
        ValueError, match=r"point 0's w: 20 is not an integer of the space \(16 to 64 in steps of 16"
    ):
        ZOOptSearch(budget=5, dim_dict={"w": tune.qrandint(16, 64, 16)}, points_to_evaluate=[{"w": 20}])
    with pytest.raises(ValueError, match=r"5 points, and ZOOpt runs at most 4"):
        ZOOptSearch(budget=5, dim_dict={"x": tune.uniform(0, 1)}, points_to_evaluate=[{"x": 0.1}] * 5)
    with pytest.raises(ValueError, match=r"dim_dict\['x'\] = \(1, \[0, 1\]\): give \(ValueType.CONTINUOUS"):
        ZOOptSearch(budget=5, dim_dict={"x": (ValueType.CONTINUOUS, [0, 1])})
    with pytest.raises(RuntimeError, match=r"ZOOptSearch has no search space"):
        ZOOptSearch(budget=5, metric="loss", mode="min").suggest("t0")
    monkeypatch.setitem(sys.modules, "zoopt", None)  # not installed
    with pytest.raises(ImportError, match=r"pip install 'sweepflow\[zoopt\]'"):
        ZOOptSearch(budget=5)


# -------------------------------------------------------------------------------------- a real run, as users write


def trainable(config):
    for step in range(2):
        tune.report(loss=(config["x"] - 0.5) ** 2 + 1 / (step + 1))


def test_tune_run_records_each_suggestion_in_its_trials_run(services):
    search = ZOOptSearch(budget=3, metric="loss", mode="min", points_to_evaluate=[{"x": 0.5}])
    analysis = tune.run(
        trainable, config={"x": tune.uniform(0, 1)}, search_alg=search, num_samples=3, verbose=0
    )
    trials = sorted(analysis.trials, key=lambda t: t.trial_id)
    assert len(trials) == 3 and trials[0].config == {"x": 0.5}
    client = MlflowClient(services["mlflow"])
    for t in trials:
        assert float(client.get_run(t.mlflow_run_id).data.params["x"]) == pytest.approx(t.config["x"])
    assert analysis.get_best_config(metric="loss", mode="min") == {"x": 0.5}
