"""Ray Tune's ``TuneBOHB`` on the real hpbandster BOHB and ConfigSpace (the ``bohb`` extra) and
``HyperBandForBOHB``: Tune's space converted as Ray does, a ConfigSpace as it is, metric/mode, points first, each
report told at its budget, save/restore, mistakes refused before any trial; HyperBand's brackets filled largest
first; then a real ``tune.run`` of both, recording each suggestion in MLflow."""

from __future__ import annotations

import json
import os
import sys
import tempfile

import ConfigSpace as CS
import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from tune_planning import ended, planning

from sweepflow import tune
from sweepflow.tune.schedulers import HyperBandForBOHB
from sweepflow.tune.search.bohb import TuneBOHB


@pytest.fixture
def plan(monkeypatch):
    return planning(monkeypatch)


def _run(sampler, objective, n, metric="loss", reports=1):
    """Ask and tell as the sweep does: each trial reports ``objective(config)`` ``reports`` times (its
    ``training_iteration`` counting), then ends. Returns the configs, in order."""
    configs = []
    for _ in range(n):
        number, config = sampler.ask()
        sampler.started(number, f"t{number}")
        for step in range(1, reports + 1):
            sampler.on_report(f"t{number}", {metric: objective(config), "training_iteration": step})
        sampler.tell_result(number, ended(number, config, {metric: objective(config)}))
        configs.append(config)
    return configs


def _bowl(config) -> float:
    return (config["x"] - 0.5) ** 2 + (config["opt"]["y"] + 1) ** 2


BOWL = {"x": tune.uniform(-2, 2), "opt": {"y": tune.uniform(-2, 2)}, "epochs": 3}


# ------------------------------------------------------------------------------------------------- TuneBOHB


def test_a_tune_space_is_converted_as_ray_does(plan):
    space = {
        "lr": tune.loguniform(1e-4, 1e-1),
        "layers": tune.randint(1, 4),
        "width": tune.qrandint(16, 64, 16),
        "act": tune.choice(["relu", "tanh"]),
        "opt": {"momentum": tune.uniform(0, 1), "noise": tune.randn(0, 2)},
        "epochs": 2,
    }
    search = TuneBOHB(seed=0)
    configs = _run(
        plan(config=space, search_alg=search, metric="loss", mode="min", num_samples=6).sampler,
        lambda c: c["opt"]["momentum"],
        6,
    )
    cs = search._space
    assert sorted(cs.keys()) == ["act", "layers", "lr", "opt/momentum", "opt/noise", "width"]
    assert (cs["lr"].lower, cs["lr"].upper, cs["lr"].log) == (1e-4, 1e-1, True)
    assert (cs["layers"].lower, cs["layers"].upper) == (1, 3)  # tune.randint's exclusive upper bound
    assert list(cs["width"].choices) == [16, 32, 48, 64]
    assert (cs["opt/noise"].mu, cs["opt/noise"].sigma, cs["opt/noise"].lower, cs["opt/noise"].upper) == (
        0,
        2,
        -8,
        8,
    )
    for c in configs:
        assert 1e-4 <= c["lr"] <= 1e-1 and c["layers"] in (1, 2, 3) and c["width"] in (16, 32, 48, 64)
        assert c["act"] in ("relu", "tanh") and type(c["act"]) is str and c["epochs"] == 2
        assert 0 <= c["opt"]["momentum"] <= 1 and isinstance(c["layers"], int)
    assert (
        "TuneBOHB"
        in plan(config=space, search_alg=TuneBOHB(), metric="loss", mode="min", num_samples=1).search
    )
    assert isinstance(tune.create_searcher("bohb", metric="loss", mode="min"), TuneBOHB)  # Ray's name for it


def test_each_report_is_told_at_its_budget_and_bohb_learns(plan):
    np.random.seed(0)  # BOHB's model draws from NumPy's global state
    search = TuneBOHB(metric="loss", mode="min", seed=1, bohb_config={"random_fraction": 0.1})
    configs = _run(plan(config=BOWL, search_alg=search, num_samples=30).sampler, _bowl, 30, reports=2)
    assert sorted(search._bohber.configs) == [1.0, 2.0]  # every report, at its training_iteration
    assert len(search._bohber.losses[2.0]) == 30 and 2.0 in search._bohber.kde_models
    assert all(c["epochs"] == 3 for c in configs)
    # once it has a model, its proposals come nearer the optimum than the random start's
    assert np.median([_bowl(c) for c in configs[-10:]]) < np.median([_bowl(c) for c in configs[:8]])


def test_mode_max_points_first_and_a_configspace_as_it_is(plan):
    cs = CS.ConfigurationSpace(seed=3)
    cs.add(
        CS.UniformFloatHyperparameter("x", lower=0, upper=1), CS.CategoricalHyperparameter("a", ["p", "q"])
    )
    search = TuneBOHB(
        cs, metric="score", mode="max", points_to_evaluate=[{"x": 0.25, "a": "q"}, {"x": 0.75, "a": "p"}]
    )
    configs = _run(
        plan(config={"epochs": 1}, search_alg=search, num_samples=4).sampler,
        lambda c: c["x"],
        4,
        metric="score",
    )
    assert configs[:2] == [{"epochs": 1, "x": 0.25, "a": "q"}, {"epochs": 1, "x": 0.75, "a": "p"}]
    assert search._bohber.losses[1.0][:2] == [-0.25, -0.75]  # mode max: told negated
    assert search._space is cs
    nested = TuneBOHB(BOWL, metric="loss", mode="min", points_to_evaluate=[{"x": 0.1, "opt": {"y": 0.2}}])
    assert nested.suggest("t0") == {"x": 0.1, "opt/y": 0.2}  # by the space's names; the sweep nests "a/b"


def test_saved_and_restored_goes_on_where_it_was(plan, tmp_path):
    search = TuneBOHB(metric="loss", mode="min", seed=0)
    _run(plan(config=BOWL, search_alg=search, num_samples=10).sampler, _bowl, 7)
    search.save(str(tmp_path / "bohb.pkl"))
    np.random.seed(4)
    expected = search.suggest("next")
    restored = TuneBOHB(metric="loss", mode="min")
    restored.restore(str(tmp_path / "bohb.pkl"))
    np.random.seed(4)
    assert restored.suggest("next") == expected
    assert len(restored._bohber.losses[1.0]) == 7


def test_mistakes_are_refused_before_any_trial(plan, monkeypatch):
    with pytest.raises(
        ValueError, match=r"x: tune.grid_search cannot be converted to a TuneBOHB search space"
    ):
        plan(
            config={"x": tune.grid_search([1, 2])},
            search_alg=TuneBOHB(),
            metric="loss",
            mode="min",
            num_samples=2,
        )
    with pytest.raises(ValueError, match=r"x: SampleFrom is not searched by TuneBOHB"):
        TuneBOHB({"x": tune.sample_from(lambda spec: 1)})
    with pytest.raises(ValueError, match=r"ConcurrencyLimiter\(TuneBOHB\(...\), max_concurrent=4\)"):
        TuneBOHB(max_concurrent=4)
    with pytest.raises(ValueError, match=r"give only hpbandster BOHB's arguments"):
        TuneBOHB({"x": tune.uniform(0, 1)}, bohb_config={"eta": 3})
    with pytest.raises(ValueError, match=r"does not fit the space"):
        TuneBOHB({"x": tune.uniform(0, 1)}, points_to_evaluate=[{"x": 2.0}])
    cs = CS.ConfigurationSpace()
    cs.add(CS.UniformFloatHyperparameter("x", lower=0, upper=1))
    with pytest.raises(ValueError, match=r"keeps its own search space"):
        plan(
            config={"y": tune.uniform(0, 1)},
            search_alg=TuneBOHB(cs),
            metric="loss",
            mode="min",
            num_samples=2,
        )
    with pytest.raises(RuntimeError, match=r"TuneBOHB has no search space"):
        TuneBOHB(metric="loss", mode="min").suggest("t0")
    monkeypatch.setitem(sys.modules, "ConfigSpace", None)  # not installed
    with pytest.raises(ImportError, match=r"pip install 'sweepflow\[bohb\]'"):
        TuneBOHB()


# ------------------------------------------------------------------------------------------ HyperBandForBOHB


def test_brackets_are_filled_largest_first_and_pause_until_full():
    hb = HyperBandForBOHB(metric="score", mode="max", max_t=9, reduction_factor=3)
    for i in range(9 + 5 + 3 + 1):
        hb.on_trial_add(f"t{i}")
    # Ray's HyperBandForBOHB for max_t=9, eta=3: 9 trials from 1, then 5 from 3, 3 straight to 9; then again
    assert hb.brackets() == [(9, 1, 9), (5, 3, 5), (3, 9, 3), (9, 1, 1)]
    big = HyperBandForBOHB(metric="score", mode="max", max_t=81)
    for i in range(81 + 1):
        big.on_trial_add(f"t{i}")
    assert big.brackets() == [(81, 1, 81), (34, 3, 1)]
    early = HyperBandForBOHB(metric="score", mode="max", max_t=3)  # brackets: 3 trials from 1, then 2 to 3
    early.on_trial_add("t0")
    assert (
        early.on_trial_result("t0", {"score": 1, "training_iteration": 1}) == "PAUSE"
    )  # its bracket is not full
    early.on_trial_add("t1")
    early.on_trial_add("t2")
    assert early.on_trial_result("t1", {"score": 3, "training_iteration": 1}) == "PAUSE"
    assert (
        early.on_trial_result("t2", {"score": 2, "training_iteration": 1}) == "STOP"
    )  # full: decided, 1 of 3 kept
    assert early.wait_to_resume("t0", give_up=lambda: False) == "STOP"
    assert early.wait_to_resume("t1", give_up=lambda: False) == "CONTINUE"
    assert tune.create_scheduler("hb_bohb", metric="score", mode="max", max_t=3).brackets() == []
    assert repr(early).startswith("HyperBandForBOHB(time_attr='training_iteration'")


# -------------------------------------------------------------------------------------- a real run, as users write


def rising(config):
    """score = x * step, one checkpoint per report; it goes on from its checkpoint after a pause."""
    step = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory, open(os.path.join(directory, "step.json")) as f:
            step = json.load(f)["step"]
    while True:
        step += 1
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "step.json"), "w") as f:
                json.dump({"step": step}, f)
            tune.report(
                {"score": config["x"] * step, "step": step},
                checkpoint=tune.Checkpoint.from_directory(directory),
            )


def test_tune_run_with_tunebohb_and_hyperband_for_bohb(services):
    """5 trials: BOHB's first bracket (3 trials) pauses at 1, the best goes on to max_t=3 from its checkpoint and
    two are stopped; the next bracket's 2 trials run to 3. BOHB hears every report, at its budget."""
    np.random.seed(0)
    search = TuneBOHB(metric="score", mode="max", seed=0, points_to_evaluate=[{"x": 0.9}])
    scheduler = HyperBandForBOHB(max_t=3, reduction_factor=3)
    analysis = tune.run(
        rising,
        config={"x": tune.uniform(0, 1)},
        search_alg=search,
        scheduler=scheduler,
        num_samples=5,
        verbose=0,
        name="bohb",
    )
    trials = sorted(analysis.trials, key=lambda t: t.trial_id)
    assert trials[0].config == {"x": 0.9}
    first = trials[:3]
    kept = [t for t in first if len(t.result.history) == 3]
    assert len(kept) == 1 and kept[0].config["x"] == max(t.config["x"] for t in first)
    assert kept[0].config == {"x": 0.9} and [r["step"] for r in kept[0].result.history] == [1, 2, 3]
    for t in first:
        if t is not kept[0]:
            assert len(t.result.history) == 1 and t.result.stop_reason == "HyperBandForBOHB"
    assert [len(t.result.history) for t in trials[3:]] == [3, 3]
    assert {b: len(v) for b, v in search._bohber.losses.items()} == {1.0: 5, 2.0: 3, 3.0: 3}
    client = MlflowClient(services["mlflow"])
    for t in trials:
        assert float(client.get_run(t.mlflow_run_id).data.params["x"]) == pytest.approx(t.config["x"])
