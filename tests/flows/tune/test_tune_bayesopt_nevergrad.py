"""Ray Tune's ``BayesOptSearch`` and ``NevergradSearch`` on the real libraries (the ``bayesopt`` and ``nevergrad``
extras): Tune's space converted as Ray does, metric/mode, points first, ConcurrencyLimiter/Repeater, save/restore,
mistakes refused before any trial; then a real ``tune.run`` of each recording its suggestions in MLflow."""

from __future__ import annotations

import math
import sys

import nevergrad as ng
import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from tune_planning import drive, ended, planning

from sweepflow import tune
from sweepflow.tune.search import ConcurrencyLimiter, Repeater
from sweepflow.tune.search.bayesopt import BayesOptSearch
from sweepflow.tune.search.nevergrad import NevergradSearch


@pytest.fixture
def plan(monkeypatch):
    return planning(monkeypatch)


def _bowl(config) -> float:
    return (config["x"] - 0.5) ** 2 + (config["opt"]["y"] + 1) ** 2


BOWL = {"x": tune.uniform(-2, 2), "opt": {"y": tune.uniform(-2, 2)}, "epochs": 3}


# ------------------------------------------------------------------------------------------------- BayesOpt


def test_bayesopt_searches_uniform_parameters_and_learns(plan):
    search = BayesOptSearch(random_search_steps=4, random_state=0)
    experiment = plan(config=BOWL, search_alg=search, metric="loss", mode="min", num_samples=20)
    configs = drive(experiment.sampler, _bowl)
    assert len(configs) == 20 and all(c["epochs"] == 3 and -2 <= c["x"] <= 2 for c in configs)
    # the Gaussian process, once given the random start's results, proposes nearer the optimum
    assert min(_bowl(c) for c in configs[8:]) < min(_bowl(c) for c in configs[:4])
    assert min(_bowl(c) for c in configs) < 0.05
    assert "BayesOptSearch" in experiment.search


def test_bayesopt_mode_max_points_first_and_a_tuple_space(plan):
    search = BayesOptSearch({"x": (0.0, 1.0)}, metric="score", mode="max", random_state=1, random_search_steps=2,
                            points_to_evaluate=[{"x": 0.25}])
    configs = drive(plan(config={"epochs": 1}, search_alg=search, num_samples=12).sampler, lambda c: c["x"],
                    metric="score")
    assert configs[0] == {"epochs": 1, "x": 0.25}
    assert max(c["x"] for c in configs) > 0.95  # it climbs towards x = 1


def test_bayesopt_stops_after_patience_duplicates(plan):
    search = BayesOptSearch({"x": (0.0, 1.0)}, metric="loss", mode="min", patience=2, random_search_steps=1,
                            points_to_evaluate=[{"x": 0.5}, {"x": 0.5}])  # the second point repeats the first
    sampler = plan(search_alg=search, num_samples=5).sampler
    number, config = sampler.ask()
    assert config == {"x": 0.5}
    search._ask = lambda: {"x": 0.5}  # the process keeps proposing the same point: Ray stops the search
    sampler.tell_result(number, ended(number, config, {"loss": 0.1}))
    from sweepflow.tasks.sweep.samplers import SamplerExhausted

    # the given duplicate point is run as given (points are not deduplicated); then patience ends the search
    number, config = sampler.ask()
    sampler.tell_result(number, ended(number, config, {"loss": 0.1}))
    with pytest.raises(SamplerExhausted, match="FINISHED after 2 trials"):
        sampler.ask()


def test_bayesopt_saved_and_restored_goes_on_where_it_was(plan, tmp_path):
    search = BayesOptSearch(metric="loss", mode="min", random_search_steps=3, random_state=0)
    sampler = plan(config=BOWL, search_alg=search, num_samples=10).sampler
    drive(sampler, _bowl, n=5)
    search.save(str(tmp_path / "bayesopt.pkl"))
    expected = search.suggest("next")
    restored = BayesOptSearch(metric="loss", mode="min")
    restored.restore(str(tmp_path / "bayesopt.pkl"))
    assert restored.suggest("next") == expected


def test_bayesopt_mistakes_are_refused_before_any_trial(plan, monkeypatch):
    with pytest.raises(ValueError, match=r"layers: BayesOptSearch searches continuous parameters only, not RandInt"):
        plan(config={"layers": tune.randint(1, 4)}, search_alg=BayesOptSearch(), metric="loss", mode="min",
             num_samples=2)
    with pytest.raises(ValueError, match=r"does not search quantized values"):
        BayesOptSearch({"x": tune.quniform(0, 1, 0.1)})
    with pytest.raises(ValueError, match=r"kind is 'ucb', 'ei' or 'poi'"):
        BayesOptSearch(utility_kwargs={"kind": "thompson"})
    with pytest.raises(ValueError, match=r"point 0 gives \['z'\]; give exactly the space's parameters \['x'\]"):
        BayesOptSearch({"x": (0, 1)}, points_to_evaluate=[{"z": 1}])
    monkeypatch.setitem(sys.modules, "bayes_opt", None)  # not installed
    with pytest.raises(ImportError, match=r"pip install 'sweepflow\[bayesopt\]'"):
        BayesOptSearch()


# ------------------------------------------------------------------------------------------------ Nevergrad


MIXED = {
    "lr": tune.loguniform(1e-4, 1e-1),
    "layers": tune.randint(1, 4),
    "width": tune.qrandint(16, 64, 16),
    "activation": tune.choice(["relu", "tanh"]),
    "epochs": 2,
}


def _mixed(config) -> float:
    return (math.log10(config["lr"]) + 2) ** 2 + abs(config["layers"] - 2) + (config["activation"] == "tanh")


def test_nevergrad_converts_a_mixed_tune_space_and_learns(plan):
    np.random.seed(0)  # Nevergrad seeds a parametrization from NumPy's global state
    search = NevergradSearch(optimizer=ng.optimizers.OnePlusOne)
    experiment = plan(config=MIXED, search_alg=search, metric="loss", mode="min", num_samples=40)
    configs = drive(experiment.sampler, _mixed)
    for c in configs:
        assert 1e-4 <= c["lr"] <= 1e-1 and c["layers"] in (1, 2, 3) and c["width"] in (16, 32, 48, 64)
        assert c["activation"] in ("relu", "tanh") and c["epochs"] == 2 and isinstance(c["layers"], int)
    assert np.mean([_mixed(c) for c in configs[-10:]]) < np.mean([_mixed(c) for c in configs[:10]])


def test_nevergrad_points_first_mode_max_and_a_configured_optimizer_with_kwargs(plan):
    np.random.seed(0)  # Nevergrad seeds a parametrization from NumPy's global state
    search = NevergradSearch(optimizer=ng.families.ParametrizedOnePlusOne(mutation="cauchy"),
                             optimizer_kwargs={"budget": 30}, metric="score", mode="max",
                             points_to_evaluate=[{"x": 0.1, "opt/y": 0.0}, {"x": 0.2, "opt/y": 0.0}])
    configs = drive(plan(config=BOWL, search_alg=search, num_samples=30).sampler, lambda c: -_bowl(c),
                    metric="score")
    assert [(c["x"], c["opt"]["y"]) for c in configs[:2]] == [(0.1, 0.0), (0.2, 0.0)]  # in the order given
    assert min(_bowl(c) for c in configs) < 0.2


def test_nevergrad_takes_an_optimizer_made_with_its_own_parametrization(plan):
    optimizer = ng.optimizers.OnePlusOne(parametrization=ng.p.Instrumentation(lr=ng.p.Log(lower=1e-3, upper=1.0)),
                                         budget=10)
    configs = drive(plan(config={"epochs": 2}, search_alg=NevergradSearch(optimizer=optimizer, metric="loss",
                                                                           mode="min"), num_samples=3).sampler,
                    lambda c: c["lr"])
    assert all(set(c) == {"epochs", "lr"} and 1e-3 <= c["lr"] <= 1.0 for c in configs)


def test_nevergrad_with_limiter_and_repeater_and_saved_and_restored(plan, tmp_path):
    search = NevergradSearch(optimizer=ng.optimizers.OnePlusOne, metric="loss", mode="min")
    experiment = plan(config=BOWL, search_alg=Repeater(ConcurrencyLimiter(search, max_concurrent=1), repeat=2),
                      num_samples=6)
    assert experiment.max_concurrent_trials == 1
    configs = drive(experiment.sampler, _bowl, n=4)
    assert configs[0]["x"] == configs[1]["x"] and configs[0]["__trial_index__"] == 0
    search.save(str(tmp_path / "nevergrad.pkl"))
    restored = NevergradSearch(optimizer=ng.optimizers.OnePlusOne, metric="loss", mode="min")
    restored.restore(str(tmp_path / "nevergrad.pkl"))
    assert restored._opt.num_tell == search._opt.num_tell == 2  # told once per config (the repeats' mean)


def test_nevergrad_mistakes_are_refused_before_any_trial(plan, monkeypatch):
    with pytest.raises(ValueError, match=r"give a Nevergrad optimizer class"):
        NevergradSearch()
    with pytest.raises(ValueError, match=r"x: Normal is not searched by NevergradSearch"):
        plan(config={"x": tune.randn(0, 1)}, search_alg=NevergradSearch(optimizer=ng.optimizers.OnePlusOne),
             metric="loss", mode="min", num_samples=2)
    with pytest.raises(ValueError, match=r"does not fit the space"):
        NevergradSearch(optimizer=ng.optimizers.OnePlusOne, space={"x": tune.uniform(0, 1)},
                        points_to_evaluate=[{"nope": 1}])
    monkeypatch.setitem(sys.modules, "nevergrad", None)  # not installed
    with pytest.raises(ImportError, match=r"pip install 'sweepflow\[nevergrad\]'"):
        NevergradSearch(optimizer=object())


# -------------------------------------------------------------------------------------- real runs, as users write


def trainable(config):
    for step in range(2):
        tune.report(loss=(config["x"] - 0.5) ** 2 + 1 / (step + 1))


@pytest.mark.parametrize("which", ["bayesopt", "nevergrad"])
def test_tune_run_records_each_suggestion_in_its_trials_run(services, which):
    search = (
        BayesOptSearch(metric="loss", mode="min", random_search_steps=2, points_to_evaluate=[{"x": 0.5}])
        if which == "bayesopt"
        else NevergradSearch(optimizer=ng.optimizers.OnePlusOne, metric="loss", mode="min",
                             points_to_evaluate=[{"x": 0.5}])
    )
    analysis = tune.run(trainable, config={"x": tune.uniform(0, 1)}, search_alg=search, num_samples=3, verbose=0)
    trials = sorted(analysis.trials, key=lambda t: t.trial_id)
    assert len(trials) == 3 and trials[0].config == {"x": 0.5}
    client = MlflowClient(services["mlflow"])
    for t in trials:
        assert float(client.get_run(t.mlflow_run_id).data.params["x"]) == pytest.approx(t.config["x"])
    assert analysis.get_best_config(metric="loss", mode="min") == {"x": 0.5}
