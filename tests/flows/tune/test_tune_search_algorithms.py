"""Ray Tune's search pieces in ``sweepflow.tune.search``: ``OptunaSearch`` with a define-by-run space function,
``points_to_evaluate`` and ``evaluated_rewards``, and ``Repeater``.

The planning tests catch the experiment ``tune.run`` would run (before any service starts) and drive its sampler
as the sweep driver does (ask a config, tell the trial's result). One short real run per feature runs it as a Ray
user writes it, against the session's services."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from tune_planning import catching_plans

from sweepflow import tune
from sweepflow.tasks.sweep.results import TrialResult, TrialStatus
from sweepflow.tasks.sweep.samplers import Sampler, SamplerExhausted
from sweepflow.tune import ExperimentAnalysis, ResultGrid
from sweepflow.tune._internal.searchers import DefineByRunSampler, RepeatSampler
from sweepflow.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Repeater
from sweepflow.tune.search.optuna import OptunaSearch
from sweepflow.tune.search.repeater import TRIAL_INDEX


def trainable(config):
    tune.report(loss=config["lr"])


def define_by_run(trial) -> dict[str, Any]:
    """Ray's define-by-run example shape: a conditional parameter, a nested one, and constants returned."""
    trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    activation = trial.suggest_categorical("activation", ["relu", "tanh"])
    if activation == "relu":
        trial.suggest_int("model/width", 8, 64)
    return {"batch_size": 32}


@pytest.fixture
def plan(monkeypatch):
    """Calls ``tune.run(trainable, **kwargs)`` and returns the experiment it would run, before any work."""
    planned = catching_plans(monkeypatch)
    return lambda **kwargs: planned(
        lambda: tune.run(trainable, **{"metric": "loss", "mode": "min", "verbose": 0, **kwargs})
    )


def _drive(sampler: Sampler, result=lambda config: config["lr"]) -> list[dict[str, Any]]:
    """Every config the sampler proposes, each trial's result told back as it ends (in order)."""
    configs = []
    while True:
        try:
            number, config = sampler.ask()
        except SamplerExhausted:
            return configs
        configs.append(config)
        sampler.tell(number, result(config))


# ------------------------------------------------------------------------------------ OptunaSearch(space=fn)


def test_a_define_by_run_function_proposes_each_config_merged_over_configs_constants(plan):
    experiment = plan(
        config={"epochs": 3, "model": {"depth": 2}},
        search_alg=OptunaSearch(space=define_by_run, seed=0),
        num_samples=8,
    )
    assert isinstance(experiment.sampler, DefineByRunSampler) and experiment.sampler.total == 8
    assert "define-by-run" in experiment.search and "define_by_run" in experiment.search  # the function, by name
    configs = _drive(experiment.sampler)
    assert len(configs) == 8
    for config in configs:
        assert config["epochs"] == 3 and config["batch_size"] == 32  # config's constants, the returned ones
        assert 1e-4 <= config["lr"] <= 1e-1 and config["activation"] in ("relu", "tanh")
        if config["activation"] == "relu":  # "model/width" nests, next to the constant "model/depth"
            assert config["model"]["depth"] == 2 and 8 <= config["model"]["width"] <= 64
        else:
            assert config["model"] == {"depth": 2}
    assert len({c["lr"] for c in configs}) == 8
    # The trials table's columns: what the function searched, known once it ran.
    from sweepflow.tune._internal.searchers import shown

    assert set(shown(experiment.searched, experiment.sampler)) >= {"lr", "activation"}


def test_tpe_learns_from_the_results_told_back():
    """Minimising lr: after its random start-up trials TPE proposes lower values than at random."""

    def space(trial):
        trial.suggest_float("lr", 0.0, 1.0)

    sampler = DefineByRunSampler(space, constants={}, num_samples=30, mode="min", seed=0, n_startup_trials=5)
    configs = _drive(sampler)
    assert np.mean([c["lr"] for c in configs[-10:]]) < np.mean([c["lr"] for c in configs[:5]]) / 2


def test_points_to_evaluate_come_first_with_the_parameters_they_leave_out_proposed(plan):
    points = [{"lr": 0.01, "activation": "tanh"}, {"lr": 0.05, "activation": "relu"}]
    experiment = plan(search_alg=OptunaSearch(space=define_by_run, points_to_evaluate=points, seed=0), num_samples=4)
    first, second, *rest = _drive(experiment.sampler)
    assert first == {"lr": 0.01, "activation": "tanh", "batch_size": 32}
    assert (second["lr"], second["activation"]) == (0.05, "relu") and 8 <= second["model"]["width"] <= 64
    assert len(rest) == 2

    # A space of tune domains: the same, nested keys given as dicts; the searcher's space with config's constants.
    space = {"lr": tune.loguniform(1e-4, 1e-1), "model": {"width": tune.choice([16, 32, 64])}}
    alg = OptunaSearch(space=space, points_to_evaluate=[{"model": {"width": 64}}, {"lr": 0.02, "model/width": 16}])
    configs = _drive(plan(config={"epochs": 3}, search_alg=alg, num_samples=3).sampler)
    assert configs[0]["model"] == {"width": 64} and configs[0]["epochs"] == 3
    assert configs[1] == {"lr": 0.02, "model": {"width": 16}, "epochs": 3}


def test_evaluated_rewards_are_told_to_tpe_and_not_run(plan):
    space = {"lr": tune.uniform(0.0, 1.0)}
    points = [{"lr": 0.9}, {"lr": 0.1}]
    experiment = plan(
        search_alg=OptunaSearch(space=space, points_to_evaluate=points, evaluated_rewards=[0.9, 0.1], seed=0),
        num_samples=3,
    )
    configs = _drive(experiment.sampler)
    assert len(configs) == 3 and all(c["lr"] not in (0.9, 0.1) for c in configs)  # proposed, not re-run
    study = experiment.sampler._tpe._study  # the evaluated points are finished trials of the study
    assert [t.value for t in study.trials[:2]] == [0.9, 0.1]


def test_define_by_run_mistakes_are_refused_with_the_fix(plan):
    with pytest.raises(ValueError, match=r"config/param_space searches \['lr'\].*only one of them"):
        plan(config={"lr": tune.uniform(0, 1)}, search_alg=OptunaSearch(space=define_by_run))
    with pytest.raises(ValueError, match="evaluated_rewards.*define-by-run"):
        OptunaSearch(space=define_by_run, points_to_evaluate=[{"lr": 0.1}], evaluated_rewards=[0.5])
    with pytest.raises(ValueError, match="never run"):
        plan(search_alg=OptunaSearch(space=define_by_run, points_to_evaluate=[{"lr": 0.1}] * 3), num_samples=2)
    with pytest.raises(TypeError, match="define-by-run function"):
        OptunaSearch(space=[("lr", 0.1)])

    # Known only once the function runs (in the sweep's first ask): a wrong return, a point's unknown name.
    wrong = plan(search_alg=OptunaSearch(space=lambda trial: trial.suggest_float("lr", 0, 1)), num_samples=2)
    with pytest.raises(ValueError, match="must return None or a dict.*got float"):
        wrong.sampler.ask()
    typo = plan(search_alg=OptunaSearch(space=define_by_run, points_to_evaluate=[{"learning_rate": 0.1}]))
    with pytest.raises(ValueError, match=r"points_to_evaluate\[0\] gives \['learning_rate'\].*did not suggest"):
        typo.sampler.ask()

    def broken(trial):
        raise KeyError("oops")

    failing = plan(search_alg=OptunaSearch(space=broken), num_samples=2)
    with pytest.raises(KeyError) as raised:
        failing.sampler.ask()
    assert "define-by-run space function" in "".join(raised.value.__notes__)


def test_a_resumed_define_by_run_search_records_the_trials_that_ran_as_its_proposals():
    """A resumed experiment's ended trials are replayed (``ask_known``): the function runs on trials fixed to their
    values, and the search continues after them."""

    def make() -> DefineByRunSampler:
        return DefineByRunSampler(
            define_by_run, constants={"epochs": 3}, num_samples=4, mode="min", seed=0, n_startup_trials=1,
            points_to_evaluate=[{"lr": 0.01, "activation": "tanh"}],
        )

    first = make()
    ran = []
    for _ in range(2):
        number, config = first.ask()
        ran.append(config)
        first.tell(number, config["lr"])
    resumed = make()
    for config in ran:
        resumed.tell(resumed.ask_known(config), config["lr"])
    assert [t.params for t in resumed._study.trials] == [t.params for t in first._study.trials]
    _, third = resumed.ask()
    assert third["lr"] != 0.01  # the point was spent by the replayed first trial


# ------------------------------------------------------------------------------------------------- Repeater


class _Recorder(Sampler):
    """An inner searcher that proposes {"lr": 0.1 * i} and records what it is told."""

    def __init__(self, total: int) -> None:
        self.total, self.asked, self.told = total, 0, {}

    def ask(self) -> tuple[int, dict[str, Any]]:
        if self.asked >= self.total:
            raise SamplerExhausted("done")
        self.asked += 1
        return self.asked - 1, {"lr": 0.1 * (self.asked - 1), "nested": {"k": 1}}

    def tell(self, number: int, value: float | None) -> None:
        self.told[number] = value


def test_repeater_runs_each_config_repeat_times_and_tells_the_mean_once_all_ended():
    inner = _Recorder(2)
    sampler = RepeatSampler(inner, repeat=3, set_index=True)
    assert sampler.total == 6
    trials = [sampler.ask() for _ in range(6)]
    with pytest.raises(SamplerExhausted):
        sampler.ask()
    assert [c[TRIAL_INDEX] for _, c in trials] == [0, 1, 2, 0, 1, 2]
    assert [c["lr"] for _, c in trials] == [0.0, 0.0, 0.0, 0.1, 0.1, 0.1]
    assert trials[0][1]["nested"] is not trials[1][1]["nested"]  # each trial's own copy
    # Trials end out of order; a config is told when its last repeat ends. A failed repeat is left out.
    for number, value in [(3, 1.0), (0, 2.0), (4, None), (1, 4.0)]:
        sampler.tell(number, value)
    assert inner.told == {}
    sampler.tell(2, 6.0)
    assert inner.told == {0: 4.0}
    sampler.tell(5, 3.0)
    assert inner.told == {0: 4.0, 1: 2.0}

    failed = RepeatSampler(_Recorder(1), repeat=2, set_index=False)
    (n0, c0), (n1, _) = failed.ask(), failed.ask()
    assert TRIAL_INDEX not in c0
    failed.tell(n0, None)
    failed.tell(n1, float("nan"))
    assert failed.inner.told == {0: None}  # every repeat failed: the config failed


def test_repeater_wraps_optuna_search_and_the_default_search(plan):
    experiment = plan(
        search_alg=ConcurrencyLimiter(Repeater(OptunaSearch(space=define_by_run, seed=0), repeat=2), 1),
        num_samples=6,
    )
    assert experiment.max_concurrent_trials == 1 and "each config run 2x (Repeater)" in experiment.search
    configs = _drive(experiment.sampler)
    assert [c[TRIAL_INDEX] for c in configs] == [0, 1] * 3
    for a, b in zip(configs[::2], configs[1::2], strict=True):
        assert {**a, TRIAL_INDEX: 0} == {**b, TRIAL_INDEX: 0}
    study = experiment.sampler.inner._study
    assert len(study.trials) == 3  # Optuna saw one trial per config, told the repeats' mean
    assert [t.value for t in study.trials] == pytest.approx([c["lr"] for c in configs[::2]])

    # The default search: each config (one pass over the grid per num_samples // repeat) repeated in a row.
    grid = plan(
        config={"lr": tune.grid_search([0.1, 0.2]), "wd": tune.uniform(0, 1)},
        search_alg=Repeater(BasicVariantGenerator(random_state=0), repeat=2),
        num_samples=4,
    )
    assert grid.sampler.total == 8  # num_samples per grid point, as without the Repeater
    configs = _drive(grid.sampler)
    assert [(c["lr"], c[TRIAL_INDEX]) for c in configs] == [(0.1, 0), (0.1, 1), (0.2, 0), (0.2, 1)] * 2
    assert configs[0]["wd"] == configs[1]["wd"] != configs[4]["wd"]
    assert grid.searched == ("lr", "wd", TRIAL_INDEX)  # the trials table shows each repeat's index


def test_repeater_mistakes_are_refused_with_the_fix(plan):
    with pytest.raises(ValueError, match=r"num_samples=5 with Repeater\(repeat=2\).*use num_samples=6.*or 4"):
        plan(search_alg=Repeater(OptunaSearch(space=define_by_run), repeat=2), num_samples=5)
    with pytest.raises(ValueError, match=r"repeat once, with Repeater\(searcher, repeat=6\)"):
        Repeater(Repeater(OptunaSearch(), repeat=2), repeat=3)
    with pytest.raises(ValueError, match="integer >= 1"):
        Repeater(OptunaSearch(), repeat=0)
    with pytest.raises(TypeError, match="wrap a searcher of sweepflow.tune.search"):
        Repeater(object(), repeat=2)


# ---------------------------------------------------------------------------------- real runs, as Ray users write


def lr_trainable(config):
    for step in range(2):
        tune.report(loss=config["lr"] * (1 + step) + 0.01 * config.get(TRIAL_INDEX, 0))


def search_space(trial):
    trial.suggest_float("lr", 1e-3, 1.0, log=True)
    trial.suggest_categorical("optimizer", ["sgd", "adam"])
    return {"momentum": 0.9}


def test_tune_run_with_a_define_by_run_optuna_search(services):
    analysis = tune.run(
        lr_trainable,
        config={"epochs": 2},
        search_alg=OptunaSearch(
            space=search_space, metric="loss", mode="min", seed=0, points_to_evaluate=[{"lr": 0.5, "optimizer": "sgd"}]
        ),
        num_samples=4,
        verbose=0,
    )
    trials = sorted(analysis.trials, key=lambda t: t.trial_id)
    assert len(trials) == 4 and all(t.status == "TERMINATED" for t in trials)
    assert trials[0].config == {"epochs": 2, "lr": 0.5, "optimizer": "sgd", "momentum": 0.9}
    for t in trials:
        assert t.config["epochs"] == 2 and t.config["momentum"] == 0.9 and t.config["optimizer"] in ("sgd", "adam")
        assert t.last_result["loss"] == pytest.approx(2 * t.config["lr"])
    assert analysis.get_best_trial().config["lr"] == min(t.config["lr"] for t in trials)
    parent = MlflowClient(services["mlflow"]).get_run(analysis.record.parent_run_id)
    assert "define-by-run" in parent.data.params["search"]


def test_tune_run_with_a_repeater(services):
    analysis = tune.run(
        lr_trainable,
        config={"lr": tune.uniform(0.01, 1.0)},
        search_alg=Repeater(OptunaSearch(metric="loss", mode="min", seed=0), repeat=2),
        num_samples=4,
        verbose=0,
    )
    trials = sorted(analysis.trials, key=lambda t: t.trial_id)
    assert len(trials) == 4 and all(t.status == "TERMINATED" for t in trials)
    assert [t.config[TRIAL_INDEX] for t in trials] == [0, 1, 0, 1]
    assert trials[0].config["lr"] == trials[1].config["lr"] != trials[2].config["lr"] == trials[3].config["lr"]
    assert trials[1].last_result["loss"] == pytest.approx(trials[0].last_result["loss"] + 0.01)
    parent = MlflowClient(services["mlflow"]).get_run(analysis.record.parent_run_id)
    assert "each config run 2x (Repeater)" in parent.data.params["search"]


# ------------------------------------------------------------------------------------ multi-objective OptunaSearch


def _ended(index: int, config: dict[str, Any], last: dict[str, Any], status: str = "COMPLETED") -> TrialResult:
    return TrialResult(
        trial_id=f"t{index}", index=index, name=f"t{index}", config=config, status=TrialStatus(status), last=last
    )


def test_a_multi_objective_search_tells_optuna_each_objectives_last_value(plan):
    """Ray's OptunaSearch(metric=[...], mode=[...]): one study direction per objective; each ended trial's last
    value of every objective is told (a failed trial, or one missing an objective, as failed)."""
    search = OptunaSearch(metric=["loss", "acc"], mode=["min", "max"], seed=0)
    experiment = plan(config={"lr": tune.uniform(0, 1)}, search_alg=search, metric=None, mode=None, num_samples=6)
    assert experiment.objectives == (("loss", "min"), ("acc", "max"))
    assert experiment.metric is None and experiment.mode is None  # no ranking metric given: none, as in Ray
    assert "tpe, objectives loss min, acc max (optuna)" == experiment.search
    sampler = experiment.sampler
    study = sampler._tpe._study
    assert [d.name for d in study.directions] == ["MINIMIZE", "MAXIMIZE"]
    for i in range(6):
        number, config = sampler.ask()
        last = {"loss": config["lr"], "acc": 1 - config["lr"] ** 2}
        status = "COMPLETED"
        if i == 4:
            last = {"loss": config["lr"]}  # no acc reported
        if i == 5:
            status = "FAILED"
        sampler.tell_result(number, _ended(i, config, last, status))
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE"] * 4 + ["FAIL", "FAIL"]
    assert study.trials[0].values == [study.trials[0].params["lr"], 1 - study.trials[0].params["lr"] ** 2]
    assert len(study.best_trials) >= 1  # Optuna's own Pareto front


def test_a_multi_objective_search_ranks_by_one_objective_or_none(plan):
    import optuna

    search = OptunaSearch(
        metric=["loss", "acc"], mode=["min", "max"], sampler=optuna.samplers.NSGAIISampler(seed=0)
    )
    experiment = plan(config={"lr": tune.uniform(0, 1)}, search_alg=search, metric="acc", mode=None)
    assert (experiment.metric, experiment.mode) == ("acc", "max")  # the objective's own mode
    assert experiment.search == "NSGAIISampler, objectives loss min, acc max (optuna)"
    assert isinstance(experiment.sampler._tpe._study.sampler, optuna.samplers.NSGAIISampler)
    assert experiment.sampler._tpe._study.sampler is not search.sampler  # each experiment gets its own copy
    by_run = plan(config={"c": 1}, search_alg=OptunaSearch(space=define_by_run, metric=["loss", "acc"],
                                                            mode=["min", "max"]), metric=None, mode=None)
    assert [d.name for d in by_run.sampler._study.directions] == ["MINIMIZE", "MAXIMIZE"]
    space = {"lr": tune.uniform(0, 1)}
    refusals = [
        (dict(metric="acc", mode="min"), "searches 'acc' with mode='max'"),
        (dict(metric="f1", mode="max"), "is not one of OptunaSearch's objectives"),
        (dict(metric=None, mode="max"), "without a metric"),
    ]
    for kwargs, message in refusals:
        with pytest.raises(ValueError, match=message):
            plan(config=space, search_alg=OptunaSearch(metric=["loss", "acc"], mode=["min", "max"]), **kwargs)
    with pytest.raises(ValueError, match="Repeater around a multi-objective OptunaSearch is not built"):
        plan(config=space, search_alg=Repeater(OptunaSearch(metric=["loss", "acc"], mode=["min", "max"]), repeat=2),
             metric=None, mode=None, num_samples=4)
    with pytest.raises(ValueError, match="a list of metrics and a list of modes of the same length"):
        OptunaSearch(metric=["loss", "acc"], mode="min")
    with pytest.raises(ValueError, match="each mode must be 'min' or 'max'"):
        OptunaSearch(metric=["loss", "acc"], mode=["min", "up"])
    with pytest.raises(TypeError, match="give an Optuna sampler"):
        OptunaSearch(metric="loss", mode="min", sampler="nsga2")


def test_the_pareto_front_is_the_trials_no_other_beats_on_every_objective():
    trials = [
        _ended(0, {"lr": 0.1}, {"loss": 1.0, "acc": 0.5}),
        _ended(1, {"lr": 0.2}, {"loss": 2.0, "acc": 0.9}),
        _ended(2, {"lr": 0.3}, {"loss": 2.0, "acc": 0.4}),  # beaten by 0 on both
        _ended(3, {"lr": 0.4}, {"loss": 0.5, "acc": 0.5}),  # beats 0: as good on acc, better on loss
        _ended(4, {"lr": 0.5}, {"loss": 0.1, "acc": 1.0}, status="FAILED"),  # failed: not on the front
        _ended(5, {"lr": 0.6}, {"loss": float("nan"), "acc": 1.0}),  # not finite: left out
    ]
    grid = ResultGrid(trials, metric=None, mode=None, objectives=(("loss", "min"), ("acc", "max")))
    assert [r.metrics["trial_id"] for r in grid.pareto_front()] == ["t1", "t3"]
    assert [r.metrics["trial_id"] for r in grid.pareto_front(["acc"], ["max"])] == ["t5"]  # one objective: its best
    analysis = ExperimentAnalysis(trials, metric="loss", mode="min", objectives=(("loss", "min"), ("acc", "max")))
    assert [t.trial_id for t in analysis.pareto_front()] == ["t1", "t3"]
    with pytest.raises(ValueError, match="pareto_front needs the objectives"):
        ResultGrid(trials, metric="loss", mode="min").pareto_front()


def two_objectives(config):
    for step in range(2):
        tune.report(loss=(config["x"] - 0.2) ** 2 + step * 0.0, gain=config["x"])


def test_tune_run_with_a_multi_objective_optuna_search_records_its_pareto_front(services):
    """Ray's multi-objective example, as its users write it: no metric for the experiment, the best result per
    objective asked of the ResultGrid; the Pareto front is on the grid and on the MLflow parent run."""
    tuner = tune.Tuner(
        two_objectives,
        tune_config=tune.TuneConfig(search_alg=OptunaSearch(metric=["loss", "gain"], mode=["min", "max"], seed=0),
                                    num_samples=5),
        param_space={"x": tune.uniform(0, 1)},
        run_config=tune.RunConfig(verbose=0),
    )
    results = tuner.fit()
    assert len(results) == 5 and results.num_errors == 0
    assert results.get_best_result("gain", "max").config["x"] == max(r.config["x"] for r in results)
    front = results.pareto_front()
    # x above 0.2 trades loss for gain; below it, a larger x is better on both.
    xs = sorted(r.config["x"] for r in front)
    assert xs and all(x >= min(r.config["x"] for r in results) for x in xs)
    best_loss = results.get_best_result("loss", "min")
    assert best_loss.metrics["trial_id"] in {r.metrics["trial_id"] for r in front}
    client = MlflowClient(services["mlflow"])
    parent = client.get_run(results.record.parent_run_id)
    ids = [r.metrics["trial_id"] for r in front]
    assert parent.data.tags["sweepflow.pareto_front"] == ",".join(ids)
    recorded = client.download_artifacts(results.record.parent_run_id, "pareto_front.json")
    with open(recorded) as f:
        data = json.load(f)
    assert data["objectives"] == [{"metric": "loss", "mode": "min"}, {"metric": "gain", "mode": "max"}]
    assert [t["trial_id"] for t in data["trials"]] == ids
    # No metric of its own: the sweep report is ranked by the first objective, and draws the front.
    with open(client.download_artifacts(results.record.parent_run_id, "report/sweep_report.html"), encoding="utf-8") as f:
        page = f.read()
    assert "Ranked by <b>loss</b> (min: lower is better), the first of the search's objectives" in page
    assert "Pareto front: loss against gain" in page
    assert "Sweep report:" in parent.data.tags["mlflow.note.content"]  # the parent run's description links it


def test_a_multi_objective_experiment_ranked_by_one_objective_draws_its_front_in_the_sweep_report(services):
    """Ranked by one of its objectives, a multi-objective experiment has a sweep report, and the report draws the
    Pareto front the parent run records (the recording step hands the report the objectives)."""
    tuner = tune.Tuner(
        two_objectives,
        tune_config=tune.TuneConfig(search_alg=OptunaSearch(metric=["loss", "gain"], mode=["min", "max"], seed=1),
                                    num_samples=4, metric="loss", mode="min"),
        param_space={"x": tune.uniform(0, 1)},
        run_config=tune.RunConfig(verbose=0),
    )
    results = tuner.fit()
    client = MlflowClient(services["mlflow"])
    parent_id = results.record.parent_run_id
    front = client.get_run(parent_id).data.tags["sweepflow.pareto_front"].split(",")
    with open(client.download_artifacts(parent_id, "report/sweep_report.html"), encoding="utf-8") as f:
        page = f.read()
    data = json.loads(re.search(r'<script type="application/json" id="sweep-data">(.*?)</script>', page, re.S).group(1))
    assert "Pareto front: loss against gain" in page
    assert sorted(data["pareto"]["front"]) == sorted(front) and len(data["pareto"]["points"]) == 4
