"""No silently dropped argument: every argument that ``tune.run``, ``TuneConfig``, ``RunConfig``, ``OptunaSearch``,
``Repeater`` and ``ASHAScheduler`` accept either changes what the experiment runs or is refused with a message naming it.

What an experiment runs is planned, and checked, before any service starts: the planned ``Experiment`` is caught
where it would be handed to the runner, and compared with the plan of a call that differs in that one argument
(the trials proposed, with results told back, included). Arguments that act after the run (the trials table,
raising for failed trials) are checked on a finished experiment's analysis. A new argument without a probe here
fails ``test_every_accepted_argument_has_a_probe``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import numpy as np
import optuna
import pytest
from tune_planning import catching_plans

import ddp_runtime as train
from sweepflow import tune
from sweepflow.air.integrations.mlflow import MLflowLoggerCallback
from sweepflow.tasks.sweep.results import TrialResult, TrialStatus
from sweepflow.tune import api
from sweepflow.tune._internal import runner
from sweepflow.tune.analysis import ExperimentAnalysis
from sweepflow.tune.reporter import CLIReporter
from sweepflow.tune.schedulers import ASHAScheduler, HyperBandScheduler, MedianStoppingRule
from sweepflow.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Repeater
from sweepflow.tune.search.optuna import OptunaSearch


def trainable(config):
    tune.report(loss=config["a"])


def other_trainable(config):
    tune.report(loss=config["a"] * 2)


class StepTrainable(tune.Trainable):
    def step(self):
        return {"loss": self.config["a"]}


SPACE = {"a": tune.uniform(0, 1), "b": tune.choice([1, 2, 3])}
RUN = {"config": SPACE, "num_samples": 4, "metric": "loss", "mode": "min", "name": "probe", "verbose": 0}


@pytest.fixture
def plan(monkeypatch):
    """Calls a Tune entry point and returns the experiment it would run, stopping where the run would start."""
    planned = catching_plans(monkeypatch)

    def fingerprint(call) -> dict[str, Any]:
        np.random.seed(0)  # draws from NumPy's global state are the same in both calls being compared
        return _fingerprint(planned(call))

    return fingerprint


def _state(obj: Any) -> Any:
    return {k: repr(v) for k, v in sorted(vars(obj).items()) if k != "_lock"}


def _fingerprint(exp: runner.TuneRequest) -> dict[str, Any]:
    """Everything the experiment will do: its fields, its scheduler's state, and the first trials its sampler
    proposes when each trial's result is told back (what a search algorithm's settings change)."""
    proposals = []
    for _ in range(min(exp.sampler.total, 6)):
        number, config = exp.sampler.ask()
        proposals.append(config)
        exp.sampler.tell(number, float(config["a"]))
    template = exp.template
    fields = {f.name: repr(getattr(exp, f.name)) for f in dataclasses.fields(exp) if f.name not in ("template", "sampler")}
    trials = [template.trial(i, config) for i, config in enumerate(proposals)]  # how each is named, where it goes
    return {
        **fields,
        "scheduler": _state(exp.scheduler),
        "proposals": proposals,
        "trials": [(t.name, t.run_name, t.dirname) for t in trials],
        "run_tags": template.run_tags,
        "total": exp.sampler.total,
        "trainable": getattr(template.train_fn, "fn", template.train_fn),
        "template": (
            template.num_ranks,
            template.resources_per_rank,
            template.train_loop_config,
            sorted(getattr(template.train_fn, "parameters", {})),
        ),
    }


def _run(**changes: Any):
    return lambda: tune.run(trainable, **{**RUN, **changes})


def _tuner(tune_config: dict[str, Any] | None = None, run_config: dict[str, Any] | None = None, **kwargs: Any):
    tc = {"metric": "loss", "mode": "min", "num_samples": 4, **(tune_config or {})}
    rc = {"name": "probe", "verbose": 0, **(run_config or {})}
    return lambda: tune.Tuner(
        kwargs.get("trainable", trainable),
        param_space=kwargs.get("param_space", SPACE),
        tune_config=tune.TuneConfig(**tc),
        run_config=tune.RunConfig(**rc),
    ).fit()


# (entry point, argument) -> (the baseline call, the call with that one argument changed). "refused": the
# changed call must raise ValueError/TypeError naming the argument. "after": checked after a run, below.
_OPTUNA = {"seed": 0, "n_startup_trials": 1}
_POINTS = [{"a": 0.25, "b": 3}]
PLANNED: dict[tuple[str, str], tuple[Any, Any]] = {
    ("run", "run_or_experiment"): (_run(), lambda: tune.run(other_trainable, **RUN)),
    ("run", "name"): (_run(), _run(name="other")),
    ("run", "reuse_actors"): (
        lambda: tune.run(StepTrainable, **RUN),
        lambda: tune.run(StepTrainable, reuse_actors=True, **RUN),
    ),
    ("TuneConfig", "reuse_actors"): (
        _tuner(trainable=StepTrainable),
        _tuner({"reuse_actors": True}, trainable=StepTrainable),
    ),
    ("run", "metric"): (_run(), _run(metric="acc")),
    ("run", "mode"): (_run(), _run(mode="max")),
    ("run", "stop"): (_run(), _run(stop={"training_iteration": 2})),
    ("run", "time_budget_s"): (_run(), _run(time_budget_s=60.0)),
    ("run", "config"): (_run(), _run(config={"a": tune.uniform(5, 6)})),
    ("run", "resources_per_trial"): (_run(), _run(resources_per_trial={"cpu": 1})),
    ("run", "num_samples"): (_run(), _run(num_samples=2)),
    ("run", "local_dir"): (_run(), _run(local_dir="/tmp/elsewhere")),
    ("run", "storage_path"): (_run(), _run(storage_path="/tmp/elsewhere")),
    ("run", "search_alg"): (_run(), _run(search_alg=OptunaSearch(seed=0))),
    ("run", "scheduler"): (_run(), _run(scheduler=ASHAScheduler(max_t=4))),
    ("run", "keep_checkpoints_num"): (_run(), _run(keep_checkpoints_num=3)),
    ("run", "checkpoint_score_attr"): (_run(), _run(checkpoint_score_attr="min-val_loss")),
    ("run", "max_failures"): (_run(), _run(max_failures=2)),
    ("run", "max_concurrent_trials"): (_run(), _run(max_concurrent_trials=1)),
    ("run", "seed"): (_run(), _run(seed=1)),
    ("run", "resume"): (_run(), _run(resume="AUTO")),
    ("run", "fail_fast"): (_run(), _run(fail_fast=True)),
    ("run", "callbacks"): (_run(), _run(callbacks=[tune.Callback()])),
    ("run", "trial_name_creator"): (_run(), _run(trial_name_creator=lambda trial: f"named_{trial.trial_id}")),
    ("run", "trial_dirname_creator"): (_run(), _run(trial_dirname_creator=lambda trial: f"dir_{trial.trial_id}")),
    ("TuneConfig", "trial_name_creator"): (
        _tuner(),
        _tuner({"trial_name_creator": lambda trial: f"named_{trial.trial_id}"}),
    ),
    ("TuneConfig", "trial_dirname_creator"): (
        _tuner(),
        _tuner({"trial_dirname_creator": lambda trial: f"dir_{trial.trial_id}"}),
    ),
    ("RunConfig", "callbacks"): (  # MLflowLoggerCallback's tags go on every trial's run
        _tuner(),
        _tuner(run_config={"callbacks": [MLflowLoggerCallback(tags={"team": "vision"})]}),
    ),
    ("MLflowLoggerCallback", "experiment_name"): (
        _run(callbacks=[MLflowLoggerCallback()]),
        _run(callbacks=[MLflowLoggerCallback(experiment_name="elsewhere")]),
    ),
    ("MLflowLoggerCallback", "tags"): (
        _run(callbacks=[MLflowLoggerCallback()]),
        _run(callbacks=[MLflowLoggerCallback(tags={"team": "vision"})]),
    ),
    ("MLflowLoggerCallback", "tracking_uri"): (
        _run(callbacks=[MLflowLoggerCallback()]),
        # the environment's own URI when one is set (a different one is refused): the plan records it all the same
        _run(callbacks=[MLflowLoggerCallback(tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or "http://127.0.0.1:1")]),
    ),
    ("FailureConfig", "max_failures"): (
        _tuner(),
        _tuner(run_config={"failure_config": train.FailureConfig(max_failures=2)}),
    ),
    ("FailureConfig", "fail_fast"): (
        _tuner(),
        _tuner(run_config={"failure_config": train.FailureConfig(fail_fast=True)}),
    ),
    ("ConcurrencyLimiter", "searcher"): (
        _run(search_alg=ConcurrencyLimiter(BasicVariantGenerator(random_state=0), 2)),
        _run(search_alg=ConcurrencyLimiter(OptunaSearch(seed=0), 2)),
    ),
    ("ConcurrencyLimiter", "max_concurrent"): (
        _run(search_alg=ConcurrencyLimiter(OptunaSearch(seed=0), 2)),
        _run(search_alg=ConcurrencyLimiter(OptunaSearch(seed=0), 1)),
    ),
    ("BasicVariantGenerator", "max_concurrent"): (
        _run(search_alg=BasicVariantGenerator(random_state=0)),
        _run(search_alg=BasicVariantGenerator(random_state=0, max_concurrent=1)),
    ),
    ("BasicVariantGenerator", "random_state"): (
        _run(search_alg=BasicVariantGenerator(random_state=0)),
        _run(search_alg=BasicVariantGenerator(random_state=1)),
    ),
    ("TuneConfig", "metric"): (_tuner(), _tuner({"metric": "acc"})),
    ("TuneConfig", "mode"): (_tuner(), _tuner({"mode": "max"})),
    ("TuneConfig", "search_alg"): (_tuner(), _tuner({"search_alg": OptunaSearch(seed=0)})),
    ("TuneConfig", "scheduler"): (_tuner(), _tuner({"scheduler": ASHAScheduler(max_t=4)})),
    ("TuneConfig", "num_samples"): (_tuner(), _tuner({"num_samples": 2})),
    ("TuneConfig", "max_concurrent_trials"): (_tuner(), _tuner({"max_concurrent_trials": 1})),
    ("TuneConfig", "time_budget_s"): (_tuner(), _tuner({"time_budget_s": 60.0})),
    ("TuneConfig", "seed"): (_tuner(), _tuner({"seed": 1})),
    ("RunConfig", "name"): (_tuner(), _tuner(run_config={"name": "other"})),
    ("RunConfig", "storage_path"): (_tuner(), _tuner(run_config={"storage_path": "/tmp/elsewhere"})),
    ("RunConfig", "stop"): (_tuner(), _tuner(run_config={"stop": {"training_iteration": 2}})),
    ("RunConfig", "failure_config"): (
        _tuner(),
        _tuner(run_config={"failure_config": train.FailureConfig(max_failures=2)}),
    ),
    ("RunConfig", "checkpoint_config"): (
        _tuner(),
        _tuner(run_config={"checkpoint_config": train.CheckpointConfig(num_to_keep=3)}),
    ),
    ("OptunaSearch", "space"): (  # the space is the searcher's; config's plain values are merged in
        _run(config={"c": 1}, search_alg=OptunaSearch(space=SPACE, **_OPTUNA)),
        _run(config={"c": 1}, search_alg=OptunaSearch(space={"a": tune.uniform(5, 6)}, **_OPTUNA)),
    ),
    ("OptunaSearch", "points_to_evaluate"): (
        _run(search_alg=OptunaSearch(**_OPTUNA)),
        _run(search_alg=OptunaSearch(points_to_evaluate=_POINTS, **_OPTUNA)),
    ),
    ("OptunaSearch", "evaluated_rewards"): (  # the point is told to TPE, not run
        _run(search_alg=OptunaSearch(points_to_evaluate=_POINTS, **_OPTUNA)),
        _run(search_alg=OptunaSearch(points_to_evaluate=_POINTS, evaluated_rewards=[0.25], **_OPTUNA)),
    ),
    ("Repeater", "searcher"): (
        _run(search_alg=Repeater(OptunaSearch(**_OPTUNA), repeat=2)),
        _run(search_alg=Repeater(BasicVariantGenerator(random_state=0), repeat=2)),
    ),
    ("Repeater", "repeat"): (
        _run(search_alg=Repeater(OptunaSearch(**_OPTUNA), repeat=2)),
        _run(search_alg=Repeater(OptunaSearch(**_OPTUNA), repeat=4)),
    ),
    ("Repeater", "set_index"): (
        _run(search_alg=Repeater(OptunaSearch(**_OPTUNA), repeat=2)),
        _run(search_alg=Repeater(OptunaSearch(**_OPTUNA), repeat=2, set_index=False)),
    ),
    ("OptunaSearch", "metric"): (
        _run(metric=None, mode=None, search_alg=OptunaSearch(metric="loss", mode="min", **_OPTUNA)),
        _run(metric=None, mode=None, search_alg=OptunaSearch(metric="acc", mode="min", **_OPTUNA)),
    ),
    ("OptunaSearch", "mode"): (
        _run(metric=None, mode=None, search_alg=OptunaSearch(metric="loss", mode="min", **_OPTUNA)),
        _run(metric=None, mode=None, search_alg=OptunaSearch(metric="loss", mode="max", **_OPTUNA)),
    ),
    ("OptunaSearch", "seed"): (
        _run(search_alg=OptunaSearch(**_OPTUNA)),
        _run(search_alg=OptunaSearch(seed=1, n_startup_trials=1)),
    ),
    ("OptunaSearch", "sampler"): (  # Optuna's own sampler instead of TPE
        _run(search_alg=OptunaSearch(**_OPTUNA)),
        _run(search_alg=OptunaSearch(sampler=optuna.samplers.RandomSampler(seed=0), **_OPTUNA)),
    ),
    ("OptunaSearch", "n_startup_trials"): (
        _run(search_alg=OptunaSearch(**_OPTUNA)),
        _run(search_alg=OptunaSearch(seed=0, n_startup_trials=4)),
    ),
    ("ASHAScheduler", "time_attr"): (
        _run(scheduler=ASHAScheduler(max_t=4)),
        _run(scheduler=ASHAScheduler(max_t=4, time_attr="epoch")),
    ),
    ("ASHAScheduler", "metric"): (
        _run(metric=None, mode=None, scheduler=ASHAScheduler(metric="loss", mode="min")),
        _run(metric=None, mode=None, scheduler=ASHAScheduler(metric="acc", mode="min")),
    ),
    ("ASHAScheduler", "mode"): (
        _run(metric=None, mode=None, scheduler=ASHAScheduler(metric="loss", mode="min")),
        _run(metric=None, mode=None, scheduler=ASHAScheduler(metric="loss", mode="max")),
    ),
    ("ASHAScheduler", "max_t"): (_run(scheduler=ASHAScheduler()), _run(scheduler=ASHAScheduler(max_t=4))),
    ("ASHAScheduler", "brackets"): (_run(scheduler=ASHAScheduler()), _run(scheduler=ASHAScheduler(brackets=3))),
    ("MedianStoppingRule", "time_attr"): (
        _run(scheduler=MedianStoppingRule()),
        _run(scheduler=MedianStoppingRule(time_attr="epoch")),
    ),
    ("MedianStoppingRule", "metric"): (
        _run(metric=None, mode=None, scheduler=MedianStoppingRule(metric="loss", mode="min")),
        _run(metric=None, mode=None, scheduler=MedianStoppingRule(metric="acc", mode="min")),
    ),
    ("MedianStoppingRule", "mode"): (
        _run(metric=None, mode=None, scheduler=MedianStoppingRule(metric="loss", mode="min")),
        _run(metric=None, mode=None, scheduler=MedianStoppingRule(metric="loss", mode="max")),
    ),
    ("MedianStoppingRule", "grace_period"): (
        _run(scheduler=MedianStoppingRule()),
        _run(scheduler=MedianStoppingRule(grace_period=3)),
    ),
    ("MedianStoppingRule", "min_samples_required"): (
        _run(scheduler=MedianStoppingRule()),
        _run(scheduler=MedianStoppingRule(min_samples_required=1)),
    ),
    ("HyperBandScheduler", "time_attr"): (
        _run(scheduler=HyperBandScheduler()),
        _run(scheduler=HyperBandScheduler(time_attr="epoch")),
    ),
    ("HyperBandScheduler", "metric"): (
        _run(metric=None, mode=None, scheduler=HyperBandScheduler(metric="loss", mode="min")),
        _run(metric=None, mode=None, scheduler=HyperBandScheduler(metric="acc", mode="min")),
    ),
    ("HyperBandScheduler", "mode"): (
        _run(metric=None, mode=None, scheduler=HyperBandScheduler(metric="loss", mode="min")),
        _run(metric=None, mode=None, scheduler=HyperBandScheduler(metric="loss", mode="max")),
    ),
    ("HyperBandScheduler", "max_t"): (_run(scheduler=HyperBandScheduler()), _run(scheduler=HyperBandScheduler(max_t=9))),
    ("HyperBandScheduler", "reduction_factor"): (
        _run(scheduler=HyperBandScheduler()),
        _run(scheduler=HyperBandScheduler(reduction_factor=2)),
    ),
    ("ASHAScheduler", "grace_period"): (
        _run(scheduler=ASHAScheduler()),
        _run(scheduler=ASHAScheduler(grace_period=2)),
    ),
    ("ASHAScheduler", "reduction_factor"): (
        _run(scheduler=ASHAScheduler()),
        _run(scheduler=ASHAScheduler(reduction_factor=2)),
    ),
}

class _SavesCheckpoints(tune.Callback):
    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        pass


REFUSED: dict[tuple[str, str], Any] = {
    ("MLflowLoggerCallback", "registry_uri"): lambda: MLflowLoggerCallback(registry_uri="sqlite:///r.db"),
    ("MLflowLoggerCallback", "tracking_token"): lambda: MLflowLoggerCallback(tracking_token="t"),
    ("MLflowLoggerCallback", "log_params_on_trial_end"): lambda: MLflowLoggerCallback(log_params_on_trial_end=True),
    ("run", "callbacks+hook-never-called"): _run(callbacks=[_SavesCheckpoints()]),
    ("run", "callbacks+not-a-callback"): _run(callbacks=[print]),
    ("RunConfig", "callbacks+not-a-list"): _tuner(run_config={"callbacks": tune.Callback()}),
    ("run", "trial_name_creator+not-callable"): _run(trial_name_creator="name"),
    ("MLflowLoggerCallback", "tags+reserved"): lambda: MLflowLoggerCallback(tags={"sweepflow.status": "x"}),
    ("MedianStoppingRule", "hard_stop"): lambda: MedianStoppingRule(hard_stop=False),
    ("MedianStoppingRule", "min_time_slice"): lambda: MedianStoppingRule(min_time_slice=5),
    ("ConcurrencyLimiter", "batch"): lambda: ConcurrencyLimiter(OptunaSearch(), 2, batch=True),
    ("BasicVariantGenerator", "points_to_evaluate"): lambda: BasicVariantGenerator(points_to_evaluate=[{"a": 1}]),
    ("BasicVariantGenerator", "constant_grid_search"): lambda: BasicVariantGenerator(constant_grid_search=True),
    ("FailureConfig", "fail_fast+unknown"): lambda: train.FailureConfig(fail_fast="later"),
    ("run", "checkpoint_freq"): _run(checkpoint_freq=2),
    ("ASHAScheduler", "brackets+zero"): lambda: ASHAScheduler(brackets=0),
    ("ASHAScheduler", "stop_last_trials"): lambda: ASHAScheduler(stop_last_trials=False),
    ("HyperBandScheduler", "stop_last_trials"): lambda: HyperBandScheduler(stop_last_trials=False),
    # Given twice with different values: only one could be used.
    ("OptunaSearch", "metric+run"): _run(search_alg=OptunaSearch(metric="acc")),
    ("OptunaSearch", "sampler+not-a-sampler"): lambda: OptunaSearch(sampler="nsga2"),
    # Two search spaces (the searcher's and config's domains): only one could be searched (Ray refuses it too).
    ("OptunaSearch", "space+config-domains"): _run(search_alg=OptunaSearch(space=lambda t: t.suggest_float("a", 0, 1))),
    ("OptunaSearch", "points_to_evaluate+unknown-name"): _run(search_alg=OptunaSearch(points_to_evaluate=[{"z": 1}])),
    ("OptunaSearch", "points_to_evaluate+not-a-choice"): _run(search_alg=OptunaSearch(points_to_evaluate=[{"b": 7}])),
    ("OptunaSearch", "points_to_evaluate+more-than-num_samples"): _run(
        search_alg=OptunaSearch(points_to_evaluate=[{"a": 0.5}] * 5)
    ),
    ("OptunaSearch", "evaluated_rewards+define-by-run"): lambda: OptunaSearch(
        space=lambda t: None, points_to_evaluate=_POINTS, evaluated_rewards=[1.0]
    ),
    ("OptunaSearch", "evaluated_rewards+one-per-point"): lambda: OptunaSearch(
        points_to_evaluate=_POINTS, evaluated_rewards=[1.0, 2.0]
    ),
    ("Repeater", "repeat+num_samples-not-a-multiple"): _run(search_alg=Repeater(OptunaSearch(), repeat=3)),
    ("Repeater", "searcher+not-a-searcher"): lambda: Repeater(CLIReporter(), repeat=2),
    ("ASHAScheduler", "mode+run"): _run(scheduler=ASHAScheduler(mode="max")),
    ("RunConfig", "storage_options"): _tuner(run_config={"storage_options": {"key": "k"}}),
    ("run", "resume+ray-only-mode"): _run(resume="LOCAL"),
    ("run", "resume+without-name"): lambda: tune.run(trainable, config=SPACE, metric="loss", mode="min", resume=True),
}

# Applied to the finished experiment: see test_arguments_applied_after_the_run.
AFTER = {("run", "verbose"), ("run", "progress_reporter"), ("run", "raise_on_failed_trial"), ("run", "checkpoint_at_end")}
AFTER |= {("RunConfig", "verbose"), ("RunConfig", "progress_reporter")}
# Every trial's checkpoints are its MLflow run's artifacts with or without it (the trial's directory is saved).
AFTER |= {("MLflowLoggerCallback", "save_artifact")}


def _accepted() -> set[tuple[str, str]]:
    entry_points = {
        "run": tune.run,
        "TuneConfig": tune.TuneConfig,
        "RunConfig": tune.RunConfig,
        "OptunaSearch": OptunaSearch,
        "ASHAScheduler": ASHAScheduler,
        "MedianStoppingRule": MedianStoppingRule,
        "HyperBandScheduler": HyperBandScheduler,
        "FailureConfig": train.FailureConfig,
        "ConcurrencyLimiter": ConcurrencyLimiter,
        "BasicVariantGenerator": BasicVariantGenerator,
        "MLflowLoggerCallback": MLflowLoggerCallback,
        "Repeater": Repeater,
    }
    return {
        (where, name)
        for where, fn in entry_points.items()
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and name != "self"
    }


def test_every_accepted_argument_has_a_probe():
    probed = set(PLANNED) | {key for key in REFUSED if "+" not in key[1]} | AFTER
    assert _accepted() - probed == set(), "add a probe for each new argument (an effect, or a refusal)"
    assert probed - _accepted() == set(), "a probe names an argument that is no longer accepted"


@pytest.mark.parametrize("key", sorted(PLANNED), ids=lambda k: f"{k[0]}.{k[1]}")
def test_each_argument_changes_the_planned_experiment(plan, key):
    baseline, changed = PLANNED[key]
    assert plan(baseline) == plan(baseline), "the baseline must plan the same experiment twice (a seeded probe)"
    assert plan(changed) != plan(baseline), f"{key[0]}({key[1]}=...) was accepted and changed nothing"


@pytest.mark.parametrize("key", sorted(REFUSED), ids=lambda k: f"{k[0]}.{k[1]}")
def test_arguments_without_an_effect_here_are_refused_by_name(plan, key):
    name = key[1].split("+")[0]
    with pytest.raises((ValueError, TypeError), match=name):
        REFUSED[key]()


def _finished(status: TrialStatus, error: str | None = None) -> ExperimentAnalysis:
    result = TrialResult(
        trial_id="trial_0000", index=0, name="trial_0000", config={"a": 0.5}, status=status,
        last={"loss": 0.5, "training_iteration": 1}, error=error,
    )
    return ExperimentAnalysis([result], metric="loss", mode="min")


def test_arguments_applied_after_the_run(capsys, caplog):
    done = _finished(TrialStatus.COMPLETED)
    api.finish(done, ("a",), verbose=1, progress_reporter=None, raise_on_failed_trial=True)
    assert "trial_0000" in capsys.readouterr().out
    api.finish(done, ("a",), verbose=0, progress_reporter=None, raise_on_failed_trial=True)
    assert capsys.readouterr().out == ""  # verbose=0: no table

    reporter = CLIReporter(metric_columns={"loss": "LOSS-COLUMN"})
    api.finish(done, ("a",), verbose=1, progress_reporter=reporter, raise_on_failed_trial=True)
    assert "LOSS-COLUMN" in capsys.readouterr().out  # the user's reporter drew the table

    api.finish(done, (), verbose=0, progress_reporter=None, raise_on_failed_trial=True, checkpoint_at_end=False)
    assert "checkpoint_at_end" not in caplog.text
    api.finish(done, (), verbose=0, progress_reporter=None, raise_on_failed_trial=True, checkpoint_at_end=True)
    assert "checkpoint_at_end=True, but trials ['trial_0000'] ended without a checkpoint" in caplog.text

    failed = _finished(TrialStatus.FAILED, error="RuntimeError: boom")
    with pytest.raises(runner.TuneError, match="trial_0000.*boom"):
        api.finish(failed, (), verbose=0, progress_reporter=None, raise_on_failed_trial=True)
    assert api.finish(failed, (), verbose=0, progress_reporter=None, raise_on_failed_trial=False) is failed


def test_the_lowered_experiment_keeps_the_request_and_its_stop_rules_keep_the_schedulers_room_check(monkeypatch):
    """A script's request lowered to the one ``Experiment`` the pipeline runs too: the same sampler, the stop rules
    folded into the scheduler (which still refuses a synchronous population that cannot run at once), the trial
    template ranked by the metric, recorded as a Tune run under the experiment's path."""
    from sweepflow.tune.schedulers import PopulationBasedTraining

    planned = catching_plans(monkeypatch)
    pbt = PopulationBasedTraining(time_attr="training_iteration", hyperparam_mutations={"a": [0.1, 0.2]}, synch=True)
    request = planned(lambda: tune.run(trainable, **{**RUN, "stop": {"training_iteration": 3}}, scheduler=pbt))
    place = runner.ExperimentRecord(
        tracking_uri="sqlite:////nowhere/mlflow.db", scheduler_address=None, state_dir="/nowhere",
        experiment_path="/nowhere/tune/probe", resume_from="parent0",
    )
    exp = runner.lowered(request, place, run_name="probe-run")
    assert exp.sampler is request.sampler and exp.search_space == request.search_space
    assert (exp.metric, exp.mode, exp.template.max_reports) == ("loss", "min", 3)
    assert exp.placement.share_cores and exp.recording.kind == "tune" and exp.recording.run_name == "probe-run"
    assert exp.root_dir == "/nowhere/tune/probe" and exp.recording.artifact_root == "/nowhere/tune/probe/mlartifacts"
    assert exp.resume is not None and exp.resume.parent_run_id == "parent0" and exp.finalize is None
    with pytest.raises(ValueError, match="waits for all 4 trials"):
        exp.scheduler.check_room(trials=4, at_once=2)
    exp.scheduler.check_room(trials=4, at_once=4)


def test_an_unreachable_tracking_server_is_one_sentence_before_any_service_starts(monkeypatch, tmp_path):
    """The pipeline's pre-flight check, on Tune's face: MLflow's client would retry for minutes, after the
    flow run and the cluster had started."""
    import socket
    import time

    from sweepflow.tasks.checks import ServiceUnreachable

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("SWEEPFLOW_HOME", str(tmp_path / "home"))

    def trainable(config):
        tune.report(loss=1.0)

    started = time.monotonic()
    with pytest.raises(ServiceUnreachable, match=r"MLFLOW_TRACKING_URI.*did not answer its health check"):
        tune.run(trainable, config={"x": tune.grid_search([1, 2])}, name="unreachable")
    assert time.monotonic() - started < 15
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").iterdir())  # no service started
