"""A team's own ``Searcher`` subclass and ``HyperOptSearch`` (``sweepflow.tune.search``), as Ray Tune users write
them.

The driver tests run the real sweep driver in memory (``sweepflow.tasks.sweep.in_memory``) with the searcher as its
sampler: what is asked when, what is told, ``None`` and ``FINISHED``. The planning tests drive the sampler ``tune.run``
would build; one real ``tune.run`` and one ``Tuner.fit`` run them against the session's services."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from tune_planning import drive, ended, planning

from sweepflow import tune
from sweepflow.tasks.sweep.driver import Sweep
from sweepflow.tasks.sweep.in_memory import InMemoryTracker, InMemoryTrainer
from sweepflow.tasks.sweep.launch import Threads
from sweepflow.tasks.sweep.results import TrialStatus
from sweepflow.tasks.sweep.schedulers import ASHAScheduler, FIFOScheduler
from sweepflow.tasks.sweep.searcher import SearcherSampler
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tune.search import ConcurrencyLimiter, Repeater, Searcher
from sweepflow.tune.search.hyperopt import HyperOptSearch


class ListSearcher(Searcher):
    """Ray's documented shape of a custom searcher: it keeps each suggestion by trial id and learns on completion.
    It proposes ``lrs`` in order, and records every call it gets."""

    def __init__(self, lrs, metric="loss", mode="min", wait_for=0):
        super().__init__(metric=metric, mode=mode)
        self.lrs, self.wait_for = list(lrs), wait_for
        self.configurations: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.results: list[tuple[str, Any, bool]] = []
        self.reports: list[tuple[str, int]] = []

    def suggest(self, trial_id):
        self.calls.append(("suggest", trial_id))
        if not self.lrs:
            return Searcher.FINISHED
        if len(self.configurations) - len(self.results) >= 1 and len(self.results) < self.wait_for:
            return None  # one trial at a time until `wait_for` have ended
        self.configurations[trial_id] = {"lr": self.lrs.pop(0)}
        return self.configurations[trial_id]

    def on_trial_result(self, trial_id, result):
        self.reports.append((trial_id, result["training_iteration"]))

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.calls.append(("complete", trial_id))
        self.results.append((trial_id, result, error))


def _in_memory(tmp_path, searcher, *, num_samples, concurrency=2, script=None, scheduler=None, max_reports=0):
    def default(config, start):
        for step in range(start, 3):
            yield {"loss": config["lr"] * (3 - step)}

    sampler = SearcherSampler(searcher, constants={"epochs": 3}, num_samples=num_samples, metric="loss")
    return Sweep(
        sampler=sampler,
        template=TrialTemplate(
            train_fn=script or default, selection_metric="loss", selection_mode="min", max_reports=max_reports,
            varying_names=("lr",), checkpoints_to_keep=None,
        ),
        cluster=None, tracker=InMemoryTracker(str(tmp_path / "runs")), parent_run_id="parent",
        scheduler=scheduler or FIFOScheduler(), concurrency=concurrency, staging_dir=str(tmp_path / "staging"),
        log=lambda line: None, launcher=Threads(), trainer=InMemoryTrainer,
    ).run()


# ------------------------------------------------------------------------------------------- a custom Searcher


def test_a_custom_searcher_is_asked_by_trial_id_and_told_each_report_and_each_end(tmp_path):
    searcher = ListSearcher([0.3, 0.1, 0.2])
    result = _in_memory(tmp_path, searcher, num_samples=3)

    assert sorted(t.config["lr"] for t in result.trials) == [0.1, 0.2, 0.3]
    assert all(t.config["epochs"] == 3 for t in result.trials)  # merged over the experiment's constants
    assert result.best().config["lr"] == 0.1
    # Ray's ids: the suggestion's id is the trial's, and every report and the end are told under it.
    assert set(searcher.configurations) == {"trial_0000", "trial_0001", "trial_0002"}
    assert sorted(searcher.reports) == [(f"trial_000{i}", step) for i in range(3) for step in (1, 2, 3)]
    for trial_id, told, error in searcher.results:
        assert not error and told["trial_id"] == trial_id
        assert told["config"] == {"epochs": 3, **searcher.configurations[trial_id]}
        assert told["loss"] == pytest.approx(searcher.configurations[trial_id]["lr"])  # the last report
        assert told["training_iteration"] == 3


def test_finished_ends_the_search_before_num_samples(tmp_path):
    searcher = ListSearcher([0.3, 0.1])
    result = _in_memory(tmp_path, searcher, num_samples=10)
    assert len(result.trials) == 2
    assert searcher.calls.count(("suggest", "trial_0002")) == 1  # FINISHED once, then never asked again


def test_none_waits_for_a_running_trial_to_end_then_asks_again(tmp_path):
    started: list[float] = []

    def script(config, start):
        started.append(config["lr"])
        yield {"loss": config["lr"]}

    searcher = ListSearcher([0.3, 0.1, 0.2], wait_for=2)  # the first two one at a time, then the third beside none
    result = _in_memory(tmp_path, searcher, num_samples=3, concurrency=3, script=script)
    assert len(result.trials) == 3 and started == [0.3, 0.1, 0.2]
    calls = searcher.calls
    # trial_0001 was asked (None) while trial_0000 ran, and asked again only after trial_0000 ended
    first_none = calls.index(("suggest", "trial_0001"))
    assert calls.index(("complete", "trial_0000")) > first_none
    assert calls[calls.index(("complete", "trial_0000")) + 1] == ("suggest", "trial_0001")


def test_none_with_no_trial_running_is_refused_instead_of_waiting_for_ever(tmp_path):
    class Stuck(ListSearcher):
        def suggest(self, trial_id):
            return None

    with pytest.raises(RuntimeError, match=r"suggest returned None\) while no trial was running"):
        _in_memory(tmp_path, Stuck([]), num_samples=2)


def test_a_failed_trial_is_told_as_an_error_and_an_early_stopped_one_with_its_last_report(tmp_path):
    def script(config, start):
        for step in range(start, 4):
            if config["lr"] == 0.5:
                raise RuntimeError("CUDA out of memory (pretend)")
            yield {"loss": config["lr"] * 10 / (step + 1)}

    searcher = ListSearcher([0.1, 0.5, 0.9])
    scheduler = ASHAScheduler(metric="loss", mode="min", max_t=4, grace_period=1, reduction_factor=2)
    result = _in_memory(tmp_path, searcher, num_samples=3, concurrency=1, script=script, scheduler=scheduler,
                        max_reports=4)
    status = {t.config["lr"]: t.status for t in result.trials}
    assert status == {0.1: TrialStatus.COMPLETED, 0.5: TrialStatus.FAILED, 0.9: TrialStatus.STOPPED}
    told = {searcher.configurations[tid]["lr"]: (res, err) for tid, res, err in searcher.results}
    assert told[0.5] == (None, True)  # as Ray tells a failed trial
    assert told[0.9][1] is False and told[0.9][0]["training_iteration"] == 1  # stopped at ASHA's first rung


def test_a_suggestion_that_is_not_a_config_is_refused_with_the_fix():
    class Bad(ListSearcher):
        def suggest(self, trial_id):
            return [0.1]

    sampler = SearcherSampler(Bad([]), constants={}, num_samples=1, metric="loss")
    with pytest.raises(TypeError, match=r"return the trial's config \(a dict with str keys\), None .*FINISHED"):
        sampler.ask()


def test_a_resumed_experiment_asks_the_searcher_again_and_keeps_the_config_the_trial_ran_with():
    searcher = ListSearcher([0.7, 0.1])
    sampler = SearcherSampler(searcher, constants={}, num_samples=2, metric="loss")
    number = sampler.ask_known({"lr": 0.3})  # a trial of the interrupted run
    sampler.tell_result(number, ended(number, {"lr": 0.3}, {"loss": 0.3}))
    assert searcher.results == [("trial_0000", {"loss": 0.3, "config": {"lr": 0.3}, "trial_id": "trial_0000"}, False)]
    assert sampler.ask() == (1, {"lr": 0.1})


# ------------------------------------------------------------------------------------ tune.run's planning


@pytest.fixture
def plan(monkeypatch):
    return planning(monkeypatch)


def test_a_searcher_with_its_own_space_takes_no_domains_in_param_space(plan):
    with pytest.raises(ValueError, match=r"keeps its own search space .* searches \['lr'\] too"):
        plan(config={"lr": tune.uniform(0, 1)}, search_alg=ListSearcher([0.1]), num_samples=1)


def test_a_searchers_metric_and_the_experiments_must_agree(plan):
    with pytest.raises(ValueError, match=r"ListSearcher\(metric='loss'\) and the experiment's metric='acc' differ"):
        plan(config={}, search_alg=ListSearcher([0.1]), metric="acc", mode="max", num_samples=1)
    experiment = plan(config={"epochs": 2}, search_alg=ListSearcher([0.1], metric=None, mode=None),
                      metric="loss", mode="min", num_samples=1)
    assert experiment.metric == "loss"


def test_concurrency_limiter_and_repeater_wrap_a_searcher(plan):
    class Limited(ListSearcher):
        told_limit = None

        def set_max_concurrency(self, max_concurrent):
            Limited.told_limit = max_concurrent
            return False

    experiment = plan(config={}, search_alg=ConcurrencyLimiter(Limited([0.1, 0.2]), max_concurrent=1), num_samples=2)
    assert Limited.told_limit == 1 and experiment.max_concurrent_trials == 1

    searcher = ListSearcher([0.1, 0.2])
    sampler = plan(config={}, search_alg=Repeater(searcher, repeat=2), num_samples=4).sampler
    configs = drive(sampler, lambda c: c["lr"] + 0.01 * c["__trial_index__"])
    assert [c["lr"] for c in configs] == [0.1, 0.1, 0.2, 0.2]
    # told once per config, the repeats' mean under the metric alone (Ray's Repeater)
    assert [(tid, res["loss"]) for tid, res, _ in searcher.results] == [
        ("trial_0000", pytest.approx(0.105)), ("trial_0001", pytest.approx(0.205))
    ]


# ------------------------------------------------------------------------------------------------- HyperOpt


SPACE = {
    "lr": tune.loguniform(1e-4, 1e-1),
    "batch_size": tune.qrandint(16, 128, 16),
    "layers": tune.randint(1, 4),
    "activation": tune.choice([{"kind": "relu", "width": tune.randint(8, 65)}, {"kind": "tanh"}]),
    "epochs": 3,
}


def _quadratic(config) -> float:
    return (math.log10(config["lr"]) + 2) ** 2 + (config["activation"]["kind"] == "tanh")


def test_hyperopt_searches_a_tune_space_with_a_conditional_branch(plan):
    experiment = plan(config=SPACE, search_alg=HyperOptSearch(random_state_seed=0, n_initial_points=5),
                      metric="loss", mode="min", num_samples=20)
    configs = drive(experiment.sampler, _quadratic)
    assert len(configs) == 20
    for c in configs:
        assert 1e-4 <= c["lr"] <= 1e-1 and c["epochs"] == 3
        assert c["batch_size"] % 16 == 0 and 16 <= c["batch_size"] <= 128 and isinstance(c["batch_size"], int)
        assert c["layers"] in (1, 2, 3)
        if c["activation"]["kind"] == "relu":
            assert set(c["activation"]) == {"kind", "width"} and 8 <= c["activation"]["width"] <= 64
        else:
            assert c["activation"] == {"kind": "tanh"}  # the other branch's parameter is not drawn
    # TPE learns: its proposals after the random start-up are nearer the optimum than the start-up's
    assert np.mean([_quadratic(c) for c in configs[10:]]) < np.mean([_quadratic(c) for c in configs[:5]])
    assert "HyperOptSearch" in experiment.search


def test_hyperopt_with_the_same_seed_and_results_proposes_the_same_configs(plan):
    def configs(seed):
        search = HyperOptSearch(SPACE, metric="loss", mode="min", random_state_seed=seed, n_initial_points=3)
        return drive(plan(search_alg=search, num_samples=8).sampler, _quadratic)

    assert configs(1) == configs(1) != configs(2)


def test_hyperopt_mode_max_maximises_and_a_missing_metric_is_told_as_failed(plan):
    search = HyperOptSearch({"x": tune.uniform(0, 1)}, metric="score", mode="max", random_state_seed=0,
                            n_initial_points=4)
    sampler = plan(search_alg=search, num_samples=24).sampler
    seen = []
    for _ in range(24):
        number, config = sampler.ask()
        seen.append(config["x"])
        last = {} if len(seen) == 2 else {"score": config["x"]}  # the second trial never reported the metric
        sampler.tell_result(number, ended(number, config, last))
    told = {doc["tid"]: doc["result"]["status"] for doc in search._trials._dynamic_trials}  # HyperOpt's record
    assert told[1] == "fail" and set(told.values()) == {"ok", "fail"} and len(told) == 24
    assert np.mean(seen[-8:]) > 0.6  # it climbs towards x = 1


def test_hyperopt_points_to_evaluate_run_first_a_category_given_by_its_value(plan):
    points = [
        {"lr": 0.01, "batch_size": 32, "layers": 2, "activation": {"kind": "tanh"}},
        {"lr": 0.001, "batch_size": 64, "layers": 1, "activation": {"kind": "relu", "width": 16}},
    ]
    search = HyperOptSearch(SPACE, metric="loss", mode="min", points_to_evaluate=points, random_state_seed=0)
    configs = drive(plan(search_alg=search, num_samples=3).sampler, _quadratic)
    assert configs[:2] == [{**p, "epochs": 3} for p in points]

    with pytest.raises(ValueError, match=r"point 0 leaves out \['layers'\]: give every parameter"):
        HyperOptSearch(SPACE, metric="loss", mode="min", points_to_evaluate=[{"lr": 0.01, "batch_size": 32,
                                                                              "activation": {"kind": "tanh"}}])
    with pytest.raises(ValueError, match=r"activation=\{'kind': 'gelu'\}, which is not one of its categories"):
        HyperOptSearch(SPACE, metric="loss", mode="min", points_to_evaluate=[{**points[0], "activation": {"kind": "gelu"}}])


def test_hyperopt_takes_hyperopts_own_space_as_it_is(plan):
    from hyperopt import hp

    space = {"lr": hp.loguniform("lr", math.log(1e-4), math.log(1e-1)), "opt": hp.choice("opt", ["sgd", "adam"])}
    search = HyperOptSearch(space, metric="loss", mode="min", random_state_seed=0,
                            points_to_evaluate=[{"lr": 0.01, "opt": 1}])  # hyperopt's own: a choice's index
    configs = drive(plan(config={"epochs": 2}, search_alg=search, num_samples=4).sampler,
                     lambda c: c["lr"])
    assert configs[0] == {"epochs": 2, "lr": 0.01, "opt": "adam"}
    assert all(c["opt"] in ("sgd", "adam") and c["epochs"] == 2 for c in configs)


def test_hyperopt_saved_and_restored_goes_on_where_it_was(plan, tmp_path):
    search = HyperOptSearch(SPACE, metric="loss", mode="min", random_state_seed=0, n_initial_points=3)
    sampler = plan(search_alg=search, num_samples=10).sampler
    drive(sampler, _quadratic, n=6)
    search.save(str(tmp_path / "searcher.pkl"))
    expected = search.suggest("next")

    restored = HyperOptSearch(metric="loss", mode="min", n_initial_points=3)  # built as the first was
    restored.restore(str(tmp_path / "searcher.pkl"))
    assert len(restored._trials.trials) == 6
    assert restored.suggest("next") == expected


def test_hyperopt_mistakes_are_refused_before_any_trial(plan, monkeypatch):
    with pytest.raises(ValueError, match=r"lr: tune.grid_search is not searched by HyperOptSearch .* tune.choice"):
        plan(config={"lr": tune.grid_search([0.1, 0.2])}, search_alg=HyperOptSearch(), metric="loss", mode="min",
             num_samples=2)
    with pytest.raises(ValueError, match=r"tune.sample_from cannot be searched by HyperOptSearch"):
        HyperOptSearch({"x": tune.sample_from(lambda spec: 1)})
    with pytest.raises(ValueError, match=r"mode must be 'min' or 'max'"):
        HyperOptSearch(mode="maximize")
    monkeypatch.setitem(sys.modules, "hyperopt", None)  # not installed
    with pytest.raises(ImportError, match=r"pip install 'sweepflow\[hyperopt\]'"):
        HyperOptSearch()


# -------------------------------------------------------------------------------------- real runs, as users write


def trainable(config):
    for step in range(3):
        tune.report(loss=(math.log10(config["lr"]) + 2) ** 2 + 1 / (step + 1))


def test_tune_run_with_hyperopt_and_asha_records_each_suggestion_in_its_trials_run(services):
    analysis = tune.run(
        trainable,
        config={"lr": tune.loguniform(1e-4, 1e-1), "epochs": 3},
        search_alg=HyperOptSearch(metric="loss", mode="min", random_state_seed=0, n_initial_points=2,
                                  points_to_evaluate=[{"lr": 0.01}]),
        scheduler=ASHAScheduler(max_t=3, grace_period=1),
        num_samples=4,
        verbose=0,
    )
    trials = sorted(analysis.trials, key=lambda t: t.trial_id)
    assert len(trials) == 4 and trials[0].config == {"lr": 0.01, "epochs": 3}
    client = MlflowClient(services["mlflow"])
    for t in trials:  # what the searcher suggested is the trial's MLflow params
        assert float(client.get_run(t.mlflow_run_id).data.params["lr"]) == pytest.approx(t.config["lr"])
    parent = client.get_run(analysis.record.parent_run_id)
    assert "HyperOptSearch" in parent.data.params["search"]
    assert analysis.get_best_config(metric="loss", mode="min")["lr"] == pytest.approx(0.01)


def test_tuner_fit_with_a_custom_searcher(services):
    searcher = ListSearcher([0.001, 0.01, 0.1])
    tuner = tune.Tuner(
        trainable,
        param_space={"epochs": 3},
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=5),
    )
    results = tuner.fit()
    assert len(results) == 3  # FINISHED after its three configs, although num_samples=5
    assert results.get_best_result().config == {"epochs": 3, "lr": 0.01}
