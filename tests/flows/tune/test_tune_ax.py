"""Ray Tune's ``AxSearch`` on the real Ax (the ``ax`` extra, its ``ax.api.Client``): Tune's space converted as Ray
does, Ray's list of Ax parameter dicts, metric/mode, points first, parameter and outcome constraints, a Client of
the user's, failures marked failed in Ax, ConcurrencyLimiter, save/restore, mistakes refused before any trial; then
a real ``Tuner`` run restored with ``Tuner.restore``, each suggestion recorded in its trial's MLflow run.

Most checks stay in Ax's Sobol phase (its first 5 trials): each Gaussian-process step costs seconds."""

from __future__ import annotations

import math
import os
import sys

import pytest
from ax.api.client import Client
from ax.api.configs import ChoiceParameterConfig, RangeParameterConfig
from mlflow.tracking import MlflowClient
from tune_planning import drive, ended, planning

from sweepflow import tune
from sweepflow.tasks.compat import ax_experiment
from sweepflow.tasks.sweep.samplers import SamplerWaiting
from sweepflow.tune.search import ConcurrencyLimiter
from sweepflow.tune.search.ax import AxSearch

QUIET = {"random_seed": 0, "verbose_logging": False}


@pytest.fixture
def plan(monkeypatch):
    return planning(monkeypatch)


def _experiment(search: AxSearch):
    return ax_experiment(search._client)


def _statuses(search: AxSearch) -> list[str]:
    return [t.status.name for _, t in sorted(_experiment(search).trials.items())]


MIXED = {
    "lr": tune.loguniform(1e-4, 1e-1),
    "layers": tune.randint(1, 4),
    "width": tune.qrandint(16, 64, 16),
    "drop": tune.quniform(0, 0.5, 0.25),
    "act": tune.choice(["relu", "tanh", "gelu"]),
    "opt": {"momentum": tune.uniform(0, 1)},
    "epochs": 2,
}


def test_a_tune_space_is_converted_as_ray_does(plan):
    search = AxSearch(**QUIET)
    experiment = plan(config=MIXED, search_alg=search, metric="loss", mode="min", num_samples=5)
    configs = drive(experiment.sampler, lambda c: c["opt"]["momentum"])
    params = _experiment(search).parameters
    assert sorted(params) == ["act", "drop", "layers", "lr", "opt/momentum", "width"]  # nested: a/b
    lr, layers, momentum = params["lr"], params["layers"], params["opt/momentum"]
    assert (lr.lower, lr.upper, lr.log_scale, lr.parameter_type.name) == (1e-4, 1e-1, True, "FLOAT")
    assert (layers.lower, layers.upper, layers.parameter_type.name) == (1, 3, "INT")  # randint's exclusive upper
    assert (momentum.lower, momentum.upper, momentum.log_scale) == (0, 1, False)
    assert (params["width"].values, params["width"].is_ordered) == ([16, 32, 48, 64], True)
    assert (params["drop"].values, params["drop"].is_ordered) == ([0.0, 0.25, 0.5], True)
    assert params["act"].values == ["relu", "tanh", "gelu"] and not params["act"].is_ordered
    assert len(configs) == 5 and "AxSearch" in experiment.search
    for c in configs:
        assert 1e-4 <= c["lr"] <= 1e-1 and c["layers"] in (1, 2, 3) and isinstance(c["layers"], int)
        assert c["width"] in (16, 32, 48, 64) and c["drop"] in (0, 0.25, 0.5) and c["act"] in ("relu", "tanh", "gelu")
        assert 0 <= c["opt"]["momentum"] <= 1 and c["epochs"] == 2  # the constant merged under each suggestion
    assert _statuses(search) == ["COMPLETED"] * 5


def test_rays_parameter_dicts_mode_max_and_points_first(plan):
    space = [
        {"name": "x", "type": "range", "bounds": [0.0, 1.0]},
        {"name": "n", "type": "range", "bounds": [1, 4]},
        {"name": "act", "type": "choice", "values": ["relu", "tanh"]},
        {"name": "seed", "type": "fixed", "value": 7},
        ChoiceParameterConfig(name="bs", values=[32, 64], parameter_type="int"),
    ]
    search = AxSearch(space, metric="score", mode="max", points_to_evaluate=[{"x": 0.25, "n": 2, "act": "tanh",
                                                                             "bs": 64}], **QUIET)
    assert not _experiment(search).optimization_config.objective.minimize  # mode max
    configs = drive(plan(config={"epochs": 1}, search_alg=search, num_samples=3).sampler, lambda c: c["x"],
                    metric="score")
    assert configs[0] == {"epochs": 1, "x": 0.25, "n": 2, "act": "tanh", "bs": 64, "seed": 7}
    assert all(c["seed"] == 7 and c["n"] in range(1, 5) and isinstance(c["n"], int) for c in configs)
    assert _experiment(search).trials[0].arm.parameters == {"x": 0.25, "n": 2, "act": "tanh", "bs": 64}


def test_mode_max_climbs_after_the_sobol_trials_and_mode_min_is_minimised():
    """After Ax's 5 Sobol trials its first model-based proposal heads for the maximum (one model fit: seconds)."""
    search = AxSearch({"x": tune.uniform(0, 1), "y": tune.uniform(0, 1)}, metric="m", mode="max", **QUIET)
    for i in range(5):
        c = search.suggest(f"t{i}")
        search.on_trial_complete(f"t{i}", {"m": c["x"]})
    assert search.suggest("t5")["x"] > 0.9
    assert not _experiment(search).optimization_config.objective.minimize
    low = AxSearch({"x": tune.uniform(0, 1)}, metric="m", mode="min", **QUIET)
    assert _experiment(low).optimization_config.objective.minimize
    low.on_trial_complete("t0", {"m": 0.5}) if low.suggest("t0") else None
    assert _experiment(low).lookup_data().df["mean"].tolist() == [0.5]  # told as it is, Ax minimises it


def test_points_and_nested_keys_and_constraints(plan):
    search = AxSearch(
        {"x": tune.uniform(0, 1), "opt": {"y": tune.uniform(0, 1)}},
        metric="loss",
        mode="min",
        points_to_evaluate=[{"x": 0.1, "opt": {"y": 0.2}}],
        parameter_constraints=["x + opt/y <= 1"],
        outcome_constraints=["m2 <= 3"],
        **QUIET,
    )
    assert search.suggest("t0") == {"x": 0.1, "opt/y": 0.2}  # by Ax's names; the sweep nests "a/b"
    configs = [search.suggest(f"t{i}") for i in range(1, 5)]
    assert all(c["x"] + c["opt/y"] <= 1 + 1e-9 for c in configs)
    search.on_trial_complete("t0", {"loss": 0.3, "m2": 1.0})
    search.on_trial_complete("t1", {"loss": 0.3})  # no m2: the outcome constraint cannot be checked
    assert _statuses(search)[:2] == ["COMPLETED", "FAILED"]
    data = _experiment(search).lookup_data().df
    assert sorted(data[data.trial_index == 0].metric_name) == ["loss", "m2"]
    with pytest.raises(ValueError, match=r"point 0 is outside the space"):
        AxSearch({"x": tune.uniform(0, 1), "y": tune.uniform(0, 1)}, parameter_constraints=["x + y <= 1"],
                 points_to_evaluate=[{"x": 0.9, "y": 0.9}], **QUIET)
    with pytest.raises(ValueError, match=r"point 0 gives \['x'\]; give exactly the space's parameters \['opt/y', 'x'\]"):
        AxSearch({"x": tune.uniform(0, 1), "opt": {"y": tune.uniform(0, 1)}}, points_to_evaluate=[{"x": 0.5}])
    with pytest.raises(ValueError, match=r"Ax refuses metric='loss' or outcome_constraints"):
        plan(config={"x": tune.uniform(0, 1)}, search_alg=AxSearch(outcome_constraints=["m2 <<= 3"], **QUIET),
             metric="loss", mode="min", num_samples=2)  # refused before any trial


def test_failed_trials_are_marked_failed_in_ax_and_it_waits_for_its_sobol_results():
    search = AxSearch({"x": tune.uniform(0, 1)}, metric="loss", mode="min", **QUIET)
    first = [search.suggest(f"t{i}") for i in range(5)]
    assert all(isinstance(c, dict) for c in first)
    assert search.suggest("t5") is None  # Ax needs results of its Sobol trials before its model
    search.on_trial_complete("t0", None, error=True)
    search.on_trial_complete("t1", {"other": 1.0})  # no metric
    search.on_trial_complete("t2", {"loss": math.nan})
    search.on_trial_complete("t3", {"loss": 0.5})
    search.on_trial_complete("unknown", {"loss": 0.5})  # a trial it did not suggest: nothing to tell
    assert _statuses(search) == ["FAILED", "FAILED", "FAILED", "COMPLETED", "RUNNING"]


def test_concurrency_limiter_waiting_and_a_resumed_trials_config(plan):
    search = AxSearch(**QUIET)
    experiment = plan(config={"x": tune.uniform(0, 1)}, search_alg=ConcurrencyLimiter(search, max_concurrent=2),
                      metric="loss", mode="min", num_samples=8)
    assert experiment.max_concurrent_trials == 2
    sampler = experiment.sampler
    number = sampler.ask_known({"x": 0.123})  # a resumed experiment's trial: the config it ran with is kept
    sampler.tell_result(number, ended(number, {"x": 0.123}, {"loss": 0.1}))
    trials = _experiment(search).trials
    assert trials[0].status.name == "ABANDONED" and trials[1].arm.parameters == {"x": 0.123}
    assert trials[1].status.name == "COMPLETED"  # Ax learns what ran, not what it proposed again
    asked = []
    # Ax waits for results once its Sobol trials are out and none ended (how many it gives first is its own:
    # 4 in Ax 1.3, 3 in Ax 1.2)
    with pytest.raises(SamplerWaiting, match="returned None"):
        for _ in range(6):
            asked.append(sampler.ask())
    assert 3 <= len(asked) < 6
    sampler.tell_result(asked[0][0], ended(*asked[0], {"loss": asked[0][1]["x"]}))


def test_saved_and_restored_goes_on_where_it_was(tmp_path):
    search = AxSearch({"x": tune.uniform(0, 1), "n": tune.randint(0, 10)}, metric="loss", mode="min", **QUIET)
    for i in range(3):
        c = search.suggest(f"t{i}")
        search.on_trial_complete(f"t{i}", {"loss": c["x"]})
    running = search.suggest("t3")
    search.save(str(tmp_path / "ax.pkl"))
    expected = search.suggest("t4")
    restored = AxSearch()
    restored.restore(str(tmp_path / "ax.pkl"))
    assert restored.suggest("t4") == expected and restored.metric == "loss" and restored.mode == "min"
    restored.on_trial_complete("t3", {"loss": running["x"]})  # a trial running when it was saved
    assert _statuses(restored) == ["COMPLETED"] * 4 + ["RUNNING"]


def test_a_client_of_the_users(plan):
    client = Client(random_seed=1)
    client.configure_experiment(parameters=[RangeParameterConfig(name="x", bounds=(0, 1), parameter_type="float")])
    client.configure_optimization(objective="score")
    search = AxSearch(ax_client=client)
    assert (search.metric, search.mode) == ("score", "max")  # from its objective
    configs = drive(plan(config={"epochs": 1}, search_alg=search, num_samples=2).sampler, lambda c: c["x"],
                    metric="score")
    assert [set(c) for c in configs] == [{"epochs", "x"}] * 2 and search._client is client
    bare = AxSearch(ax_client=Client(random_seed=1))  # no experiment yet: the experiment's space configures it
    drive(plan(config={"y": tune.uniform(2, 3)}, search_alg=bare, metric="loss", mode="min", num_samples=1).sampler,
          lambda c: c["y"])
    assert list(_experiment(bare).parameters) == ["y"]
    with pytest.raises(ValueError, match=r"brings the space, metric and mode; leave out \['space', 'metric'\]"):
        AxSearch({"x": tune.uniform(0, 1)}, metric="score", ax_client=client)
    with pytest.raises(ValueError, match=r"ax_client=dict\(...\).*give an ax.api.Client"):
        AxSearch(ax_client={})
    with pytest.raises(ValueError, match=r"give them to your ax_client"):
        AxSearch(ax_client=Client(), random_seed=3)


def test_rays_names_and_mistakes_refused_before_any_trial(plan, monkeypatch):
    from sweepflow.tune.search import AxSearch as lazy

    assert lazy is AxSearch
    assert isinstance(tune.create_searcher("ax", metric="loss", mode="min"), AxSearch)
    with pytest.raises(ValueError, match=r"x: tune.grid_search is not searched by AxSearch.*use tune.choice"):
        plan(config={"x": tune.grid_search([1, 2])}, search_alg=AxSearch(), metric="loss", mode="min",
             num_samples=2)
    with pytest.raises(ValueError, match=r"x: Normal is not searched by AxSearch .*use one of those"):
        AxSearch({"x": tune.randn(0, 1)})
    with pytest.raises(ValueError, match=r"a choice of one value is a constant"):
        AxSearch({"x": tune.choice([1])})
    with pytest.raises(ValueError, match=r"x: AxSearch chooses among values of one type"):
        AxSearch({"x": tune.choice([1, "a"])})
    with pytest.raises(ValueError, match=r"1001 values are too many.*use tune.uniform"):
        AxSearch({"x": tune.quniform(0, 10, 0.01)})
    with pytest.raises(ValueError, match=r"item 0 .* is not an Ax parameter AxSearch takes"):
        AxSearch([{"name": "x", "type": "range", "bounds": [0, 1], "digits": 3}])
    with pytest.raises(ValueError, match=r"item 0 is int; give Ax parameter dicts"):
        AxSearch([3])
    with pytest.raises(ValueError, match=r"the space has nothing to search"):
        AxSearch({"epochs": 3})
    with pytest.raises(ValueError, match=r"AxSearch\(enforce_sequential_optimization=...\): ax_kwargs are"):
        AxSearch(enforce_sequential_optimization=False)
    with pytest.raises(ValueError, match=r"mode='best'\): mode must be 'min' or 'max'"):
        AxSearch(mode="best")
    with pytest.raises(ValueError, match=r"pass a list of configs"):
        AxSearch(points_to_evaluate={"x": 1})
    with pytest.raises(RuntimeError, match=r"AxSearch has no search space"):
        AxSearch(metric="loss", mode="min").suggest("t0")
    monkeypatch.setitem(sys.modules, "ax.api", None)  # not installed
    with pytest.raises(ImportError, match=r"AxSearch needs Ax 1.0 or later .*pip install 'sweepflow\[ax\]'"):
        AxSearch()


# -------------------------------------------------------------------------------------- a real run, as users write


def shaky(config):
    """loss = (x - 0.5)**2 over two reports; the point x=0.9 fails while the file ``fail`` exists."""
    for step in range(2):
        if config["x"] == 0.9 and step == 1 and os.path.exists(os.path.join(config["marks"], "fail")):
            raise RuntimeError("shaky trial fails")
        tune.report({"loss": (config["x"] - 0.5) ** 2 + 1 / (step + 1)})


def test_tuner_run_restored_with_its_searcher_and_each_suggestion_in_its_trials_run(services, tmp_path):
    marks = str(tmp_path)
    open(os.path.join(marks, "fail"), "w").close()
    search = AxSearch(points_to_evaluate=[{"x": 0.9}], random_seed=0, verbose_logging=False)
    grid = tune.Tuner(
        shaky,
        param_space={"x": tune.uniform(0, 1), "marks": marks},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", num_samples=3, search_alg=ConcurrencyLimiter(search, max_concurrent=1)
        ),
        run_config=tune.RunConfig(name="ax", storage_path=str(tmp_path / "results"), verbose=0),
    ).fit()
    assert grid.num_errors == 1
    first = sorted((r.config["x"] for r in grid), key=lambda x: x != 0.9)
    assert first[0] == 0.9 and len(set(first)) == 3
    os.remove(os.path.join(marks, "fail"))
    tuner = tune.Tuner.restore(grid.experiment_path, shaky, restart_errored=True)
    restored = tuner.tune_config.search_alg.searcher  # the searcher saved with the experiment, as it began
    again = tuner.fit()
    assert again.num_errors == 0 and sorted(r.config["x"] for r in again) == sorted(first)
    assert _statuses(restored) == ["COMPLETED"] * 3  # told each trial of the restored experiment
    client = MlflowClient(services["mlflow"])
    for r in again:
        assert float(client.get_run(r.mlflow_run_id).data.params["x"]) == pytest.approx(r.config["x"])
    assert again.get_best_result().config["x"] == min(first, key=lambda x: abs(x - 0.5))
