"""``tune.run`` (classic Ray Tune) and ``Tuner(...).fit()`` (current Ray Tune): thin faces over the sweep driver."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import ddp_runtime as train
from ddp_runtime import CheckpointConfig
from sweepflow.flows.settings import Settings
from sweepflow.tasks.datasets.uris import redact
from sweepflow.tune import notebook
from sweepflow.tune._internal import runner, searchers
from sweepflow.tune._internal.hooks import with_hooks
from sweepflow.tune._internal.trainable import plan_trial, trainable_name
from sweepflow.tune.analysis import ExperimentAnalysis, ResultGrid
from sweepflow.tune.class_trainable import ClassTrainableRun
from sweepflow.tune.reporter import CLIReporter
from sweepflow.tune.schedulers import resolve as resolve_scheduler

log = logging.getLogger(__name__)


def run(
    run_or_experiment: Any,
    *,
    name: str | None = None,
    metric: str | None = None,
    mode: str | None = None,
    stop: Mapping[str, float] | Callable[[str, dict[str, Any]], bool] | None = None,
    time_budget_s: float | None = None,
    config: Mapping[str, Any] | None = None,
    resources_per_trial: Mapping[str, float] | None = None,
    num_samples: int = 1,
    local_dir: str | None = None,
    storage_path: str | None = None,
    search_alg: Any = None,
    scheduler: Any = None,
    checkpoint_at_end: bool = False,
    checkpoint_freq: int = 0,
    keep_checkpoints_num: int | None = None,
    checkpoint_score_attr: str | None = None,
    verbose: int = 3,
    progress_reporter: CLIReporter | None = None,
    max_failures: int = 0,
    fail_fast: bool | str = False,
    max_concurrent_trials: int | None = None,
    raise_on_failed_trial: bool = True,
    seed: int | None = None,
    resume: bool | str = False,
    callbacks: list[Any] | None = None,
    trial_name_creator: Callable[[Any], str] | None = None,
    trial_dirname_creator: Callable[[Any], str] | None = None,
    reuse_actors: bool | None = None,
) -> ExperimentAnalysis:
    """Classic Ray Tune: run ``num_samples`` trials of the trainable over ``config``; returns the analysis.

    Checkpoints are the ones the trainable writes (``tune.checkpoint_dir`` / ``report(checkpoint=...)``); each
    trial keeps the best ``keep_checkpoints_num`` by ``checkpoint_score_attr`` (``"min-<metric>"`` for lowest
    first; default: the experiment's metric and mode) plus its latest. Without ``keep_checkpoints_num`` a trial
    keeps its best and its latest. ``checkpoint_freq`` and ``checkpoint_at_end`` drive a class trainable's
    ``save_checkpoint``; a function trainable saves its own, so ``checkpoint_freq`` is refused for it, and
    ``checkpoint_at_end=True`` (which Ray's CIFAR tutorial passes with a function trainable) asks for every trial to end with a checkpoint: the trials that did not are
    named in a warning when the experiment ends.

    ``resume="AUTO"`` picks up the newest interrupted run of the experiment ``name`` with the same settings (its
    ended trials are read back from MLflow, its running ones continue from their checkpoints, the rest start)
    or starts anew when there is none; ``resume=True`` requires one.

    ``callbacks``: ``sweepflow.tune.Callback`` objects whose hooks run in this process (``sweepflow.tune.callback``);
    ``trial_name_creator`` / ``trial_dirname_creator``: see ``sweepflow.tune._internal.trial_names``."""
    experiment = _experiment(
        run_or_experiment,
        param_space=config or {},
        num_samples=num_samples,
        metric=metric,
        mode=mode,
        scheduler=scheduler,
        search_alg=search_alg,
        resources_per_trial=resources_per_trial,
        name=name,
        storage_path=storage_path or local_dir,
        stop=stop,
        time_budget_s=time_budget_s,
        max_failures=max_failures,
        fail_fast=train.FailureConfig(max_failures=max_failures, fail_fast=fail_fast).fail_fast,
        max_concurrent_trials=max_concurrent_trials,
        seed=seed,
        checkpoint_config=_keep_checkpoints(keep_checkpoints_num, checkpoint_score_attr),
        resume=resume,
        checkpoint_frequency=checkpoint_freq,
        checkpoint_at_end=checkpoint_at_end,
    )
    experiment = replace(experiment, reuse_actors=_reuse_actors(reuse_actors, experiment))
    experiment = with_hooks(
        experiment,
        where="tune.run",  # the notebook reporter (by default, in a notebook) sees the trials through the hooks
        callbacks=notebook.with_live(callbacks, progress_reporter := _reporter(progress_reporter, verbose, experiment), verbose),
        trial_name_creator=trial_name_creator,
        trial_dirname_creator=trial_dirname_creator,
        num_samples=num_samples,
    )
    return _run_classic(experiment, verbose, progress_reporter, raise_on_failed_trial, checkpoint_at_end)


def _reporter(progress_reporter: CLIReporter | None, verbose: int, experiment: runner.TuneRequest) -> CLIReporter | None:
    """The experiment's progress reporter (in a notebook, by default, ``JupyterNotebookReporter``)."""
    return notebook.choose(
        progress_reporter,
        verbose,
        metric=experiment.metric,
        mode=experiment.mode,
        searched=searchers.shown(experiment.searched, experiment.sampler),
    )


def _run_classic(
    experiment: runner.TuneRequest,
    verbose: int,
    progress_reporter: CLIReporter | None,
    raise_on_failed_trial: bool,
    checkpoint_at_end: bool,
) -> ExperimentAnalysis:
    """``tune.run``'s experiment, run; then its trials table, warnings and failed trials (``finish``)."""
    sweep, record = runner.run(experiment)
    analysis = ExperimentAnalysis(sweep.trials, metric=experiment.metric, mode=experiment.mode, record=record, objectives=experiment.objectives)
    return finish(
        analysis,
        searchers.shown(experiment.searched, experiment.sampler),
        verbose=verbose,
        progress_reporter=progress_reporter,
        raise_on_failed_trial=raise_on_failed_trial,
        checkpoint_at_end=checkpoint_at_end,
    )


def finish(
    analysis: ExperimentAnalysis,
    searched: tuple[str, ...],
    *,
    verbose: int,
    progress_reporter: CLIReporter | None,
    raise_on_failed_trial: bool,
    checkpoint_at_end: bool = False,
) -> ExperimentAnalysis:
    """After the run: the trials table (unless ``verbose=0``), a warning naming the trials that ended without
    a checkpoint when ``checkpoint_at_end``, then Ray's ``TuneError`` for failed trials."""
    if isinstance(progress_reporter, notebook.JupyterNotebookReporter) and verbose:
        progress_reporter.report(analysis.trials, searched, links=notebook.run_links(analysis.trials, analysis.record))
    elif verbose:
        (progress_reporter or CLIReporter()).report(analysis.trials, searched)
    without = [t.trial_id for t in analysis.trials if t.status != "ERROR" and t.checkpoint is None]
    if checkpoint_at_end and without:
        log.warning(
            "checkpoint_at_end=True, but trials %s ended without a checkpoint: a function trainable saves its "
            "own, with tune.checkpoint_dir(...) or tune.report(..., checkpoint=...)",
            without,
        )
    failed = [t.trial_id for t in analysis.trials if t.status == "ERROR"]
    if failed and raise_on_failed_trial:
        errors = "; ".join(f"{t.trial_id}: {(t.error_msg or '').splitlines()[0]}" for t in analysis.trials if t.error_msg)
        raise runner.TuneError(f"Trials did not complete: {failed} ({errors})")
    return analysis


def _resume_mode(resume: Any, *, name: str | None, metric: str | None) -> str | None:
    """``tune.run(resume=...)`` as the experiment's resume mode: None, "auto" or "required"."""
    if resume is None or resume is False:
        return None
    if resume is True:
        mode = "required"
    elif isinstance(resume, str) and resume.upper() == "AUTO":
        mode = "auto"
    else:
        raise ValueError(
            f"resume={resume!r}: use resume='AUTO' (resume an interrupted run of the experiment if there is one, "
            "else start) or resume=True (there must be one); the experiment's trials live in MLflow, so Ray's "
            "LOCAL/REMOTE/PROMPT/ERRORED_ONLY do not apply"
        )
    if not name:
        raise ValueError(f"resume={resume!r} needs name=...: the experiment whose interrupted run to pick up")
    if not metric:
        raise ValueError(
            f"resume={resume!r} needs metric=... (and mode): an ended trial's result is read back by its metric"
        )
    return mode


def _keep_checkpoints(keep: int | None, score_attr: str | None) -> CheckpointConfig | None:
    """Classic Tune's ``keep_checkpoints_num``/``checkpoint_score_attr`` as a checkpoint config (None: defaults)."""
    if keep is None and score_attr is None:
        return None
    if score_attr is not None and (not isinstance(score_attr, str) or not score_attr.removeprefix("min-")):
        raise ValueError(f"checkpoint_score_attr must name a reported metric (e.g. 'min-loss'), got {score_attr!r}")
    order = "min" if score_attr and score_attr.startswith("min-") else "max"
    return CheckpointConfig(
        num_to_keep=1 if keep is None else keep,
        checkpoint_score_attribute=score_attr.removeprefix("min-") if score_attr else None,
        checkpoint_score_order=order,
    )


@dataclass
class TuneConfig:
    """How ``Tuner.fit()`` searches (Ray's ``tune.TuneConfig``): the metric, the search and scheduler, how
    many trials.

    Ray's fields not listed here (e.g. ``chdir_to_trial_dir``) are not accepted: building the config raises
    ``TypeError``.

    Attributes:
        metric: the reported metric the search, the scheduler and ``ResultGrid.get_best_result`` rank by; give
            it with ``mode`` (an ``OptunaSearch`` or scheduler may carry them instead).
        mode: ``"min"`` or ``"max"``.
        search_alg: ``OptunaSearch``, ``ConcurrencyLimiter``, ``BasicVariantGenerator`` or ``Repeater``; None:
            random and grid search over ``param_space``.
        scheduler: one of ``sweepflow.tune.schedulers``; None: FIFO (every trial runs to its end).
        num_samples: trials to run (times each grid combination).
        max_concurrent_trials: the most trials running at once; None: as many as the cluster has room for.
        time_budget_s: the experiment's time limit in seconds; running trials are stopped when it is reached.
        seed: seeds the search's sampling, so the same script samples the same configs.
        trial_name_creator: ``Trial -> str``, the trial's name (see ``sweepflow.tune._internal.trial_names``).
        trial_dirname_creator: ``Trial -> str``, the trial's directory name.
        reuse_actors: a class trainable's object is offered to the next trial on its worker
            (``reset_config``). Function trainables already run in reused worker processes, so for them it
            changes nothing; None (Ray's default) is off.
    """
    metric: str | None = None
    mode: str | None = None
    search_alg: Any = None
    scheduler: Any = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    time_budget_s: float | None = None
    seed: int | None = None
    trial_name_creator: Callable[[Any], str] | None = None  # see sweepflow.tune._internal.trial_names
    trial_dirname_creator: Callable[[Any], str] | None = None
    reuse_actors: bool | None = None  # see _reuse_actors


def _reuse_actors(reuse: bool | None, experiment: runner.TuneRequest) -> bool:
    """Ray's ``reuse_actors``: a class trainable's object is offered to the next trial on its worker
    (``reset_config``; cleaned up when the experiment ends). Function trainables always run in reused worker
    processes here (what the flag saves in Ray), so for them it changes nothing; None is Ray's default (off for
    class trainables)."""
    if reuse is not None and not isinstance(reuse, bool):
        raise TypeError(f"reuse_actors must be True, False or None, got {reuse!r}")
    return bool(reuse) and isinstance(experiment.template.train_fn, ClassTrainableRun)


#: Ray's ``tune.RunConfig`` is ``train.RunConfig``: here too, one class (``ddp_runtime.RunConfig``).
RunConfig = train.RunConfig

_STATE_VERSION = 1  # of what Tuner.fit saves for Tuner.restore


_ERRORED = {(False, False): "keep", (True, False): "resume", (False, True): "restart"}


class Tuner:
    """Current Ray Tune: ``Tuner(trainable, param_space=..., tune_config=TuneConfig(...), run_config=RunConfig(...))
    .fit()``: the run config's name, storage path, stop criteria, failure and checkpoint configs shape the
    experiment; its progress reporter and verbosity, the trials table.

    ``fit()`` writes the Tuner's settings to the experiment's path (printed as the experiment starts, and
    ``ResultGrid.experiment_path``), so ``Tuner.restore(path, trainable)`` picks the experiment up after its
    script died: the trials that ended are read back from MLflow, the running ones continue from their
    checkpoints in their own runs, the rest start."""

    def __init__(
        self,
        trainable: Any,
        *,
        param_space: Mapping[str, Any] | None = None,
        tune_config: TuneConfig | None = None,
        run_config: Any = None,
    ) -> None:
        self.trainable = trainable
        self.param_space = dict(param_space or {})
        self.tune_config = tune_config or TuneConfig()
        self.run_config = run_config or RunConfig()
        self._errored: str | None = None  # set by restore(): what becomes of the experiment's failed trials
        self._results: ResultGrid | None = None  # what fit() returned
        self._reporter: CLIReporter | None = None  # fit()'s progress reporter (in a notebook, by default, its own)

    @classmethod
    def restore(
        cls,
        path: str,
        trainable: Any = None,
        *,
        resume_unfinished: bool = True,
        resume_errored: bool = False,
        restart_errored: bool = False,
        param_space: Mapping[str, Any] | None = None,
        storage_filesystem: Any = None,
    ) -> Tuner:
        """The experiment at ``path`` (its ``ResultGrid.experiment_path``), to ``fit()`` again: ended trials are
        read back, interrupted ones continue from their latest checkpoint; failed ones stay failed, unless
        ``resume_errored`` (they continue from their latest checkpoint) or ``restart_errored`` (they start over in
        a new MLflow run; the failed one is kept, tagged ``sweepflow.restarted``). ``trainable``: give it again,
        as Ray asks (the one saved with the experiment is used when it could be pickled); ``param_space``: the
        same space again, for objects that could not be saved."""
        if storage_filesystem is not None:
            raise ValueError(
                "Tuner.restore(storage_filesystem=...): give the path as a URL fsspec opens (s3://bucket/exp, with "
                "the credentials in the environment) instead of a filesystem object"
            )
        if resume_unfinished is not True:
            raise ValueError(
                "Tuner.restore(resume_unfinished=False) is not supported: an interrupted trial continues from its "
                "checkpoint. To leave it, start a new experiment with Tuner(...).fit()"
            )
        if resume_errored and restart_errored:
            raise ValueError(
                "Tuner.restore: give resume_errored=True (failed trials continue from their latest checkpoint) or "
                "restart_errored=True (they start over), not both"
            )
        state = cls._saved_state(path)
        found = trainable if trainable is not None else state.get("trainable")
        if found is None:
            raise ValueError(
                f"Tuner.restore({path!r}): the trainable could not be saved with the experiment; pass it again: "
                "Tuner.restore(path, trainable=my_trainable)"
            )
        tuner = cls(
            found,
            param_space=param_space if param_space is not None else state["param_space"],
            tune_config=state["tune_config"],
            run_config=state["run_config"],
        )
        tuner._errored = _ERRORED[(bool(resume_errored), bool(restart_errored))]
        return tuner

    @classmethod
    def can_restore(cls, path: str) -> bool:
        """Whether ``path`` holds an experiment ``Tuner.restore`` can pick up (its settings were saved there)."""
        return runner.load_restore_state(path) is not None

    @staticmethod
    def _saved_state(path: str) -> dict[str, Any]:
        import cloudpickle

        saved = runner.load_restore_state(path)
        if saved is None:
            raise ValueError(
                f"Tuner.restore: {redact(str(path))!r} holds no experiment (no {runner.RESTORE_STATE_FILE}); give the "
                "path the experiment printed as it started ('Experiment path: ...'), which is also "
                "ResultGrid.experiment_path"
            )
        state = cloudpickle.loads(saved)
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"Tuner.restore: the experiment at {redact(str(path))!r} was saved by another sweepflow version "
                f"(format {state.get('version')!r}, this one reads {_STATE_VERSION}); restore it with that version"
            )
        return state

    def _state(self, name: str) -> bytes | None:
        """The settings ``restore`` builds the Tuner from again; None (with a warning) when they cannot be pickled."""
        import cloudpickle

        trainable: Any = self.trainable
        try:
            cloudpickle.dumps(trainable)
        except (TypeError, AttributeError, cloudpickle.pickle.PicklingError) as e:
            log.info("the trainable is not saved with the experiment (%s): Tuner.restore will need it again", e)
            trainable = None
        try:
            return cloudpickle.dumps(
                {
                    "version": _STATE_VERSION,
                    "trainable": trainable,
                    "param_space": self.param_space,
                    "tune_config": self.tune_config,
                    "run_config": replace(self.run_config, name=name),
                }
            )
        except (TypeError, AttributeError, cloudpickle.pickle.PicklingError) as e:
            log.warning(
                "Tuner.restore will not be able to pick this experiment up: its settings cannot be pickled (%s). "
                "Rerun it with tune.run(..., name=..., resume='AUTO') instead",
                e,
            )
            return None

    def get_results(self) -> ResultGrid:
        """The experiment's results without running anything: what ``fit()`` returned, or, for a Tuner that has not
        fit (``Tuner.restore(path)``), its newest run read back from MLflow -- the ended trials as they ended, the
        ones its process left running (status ``PENDING``) with their reports so far."""
        if self._results is not None:
            return self._results
        experiment = self._request()
        trials, record = runner.results_of(experiment)
        return ResultGrid(trials, metric=experiment.metric, mode=experiment.mode, record=record, objectives=experiment.objectives)

    def _request(self) -> runner.TuneRequest:
        """What ``fit()`` runs, every argument checked."""
        tc, rc = self.tune_config, self.run_config
        if not isinstance(rc, RunConfig):
            raise TypeError(f"run_config={rc!r}: use sweepflow.tune.RunConfig (it is ddp_runtime.RunConfig)")
        if rc.storage_options is not None:
            raise ValueError(
                "RunConfig(storage_options=...): a Tune experiment keeps its trials' checkpoints in MLflow's artifact "
                "store; give the store's credentials in the environment (AWS_* for S3), not in the run config"
            )
        # The default CheckpointConfig() means "not given": each trial keeps its best checkpoint and its latest.
        checkpoint = None if rc.checkpoint_config == CheckpointConfig() else rc.checkpoint_config
        experiment = _experiment(
            self.trainable,
            param_space=self.param_space,
            num_samples=tc.num_samples,
            metric=tc.metric,
            mode=tc.mode,
            scheduler=tc.scheduler,
            search_alg=tc.search_alg,
            resources_per_trial=None,
            name=rc.name,
            storage_path=rc.storage_path,
            stop=rc.stop,
            time_budget_s=tc.time_budget_s,
            max_failures=rc.failure_config.max_failures,
            fail_fast=rc.failure_config.fail_fast,
            max_concurrent_trials=tc.max_concurrent_trials,
            seed=tc.seed,
            checkpoint_config=checkpoint,
            checkpoint_frequency=rc.checkpoint_config.checkpoint_frequency,
            checkpoint_at_end=rc.checkpoint_config.checkpoint_at_end,
            refuse_at_end_for_functions=True,
            restoring=self._errored is not None,
        )
        experiment = replace(
            experiment,
            errored=self._errored or "keep",
            restore_state=self._state(experiment.name),
            reuse_actors=_reuse_actors(tc.reuse_actors, experiment),
        )
        self._reporter = _reporter(rc.progress_reporter, rc.verbose, experiment)
        return with_hooks(
            experiment,
            where="RunConfig",
            callbacks=notebook.with_live(rc.callbacks, self._reporter, rc.verbose),
            trial_name_creator=tc.trial_name_creator,
            trial_dirname_creator=tc.trial_dirname_creator,
            num_samples=tc.num_samples,
        )

    def fit(self) -> ResultGrid:
        """Run the experiment: a Prefect flow run with one task run per trial, recorded in MLflow (Ray's
        ``Tuner.fit``).

        The trials table is printed as the experiment ends (``RunConfig.verbose``,
        ``RunConfig.progress_reporter``). As in Ray, failed trials do not raise: they are in the returned grid
        (``ResultGrid.errors``); with ``FailureConfig(fail_fast="raise")`` a failed trial raises
        ``TuneError``.

        Returns:
            One ``Result`` per trial, in trial order.

        Raises:
            TypeError: ``run_config`` is not a ``sweepflow.tune.RunConfig``.
            ValueError: an argument that is refused here (e.g. ``RunConfig(storage_options=...)``), checked
                before any trial runs.
            TuneError: a trial failed and ``fail_fast="raise"``.
        """
        rc = self.run_config
        experiment = self._request()
        sweep, record = runner.run(experiment)
        finish(  # the trials table; a Tuner's failed trials are in its ResultGrid (``result.error``), not raised
            ExperimentAnalysis(sweep.trials, metric=experiment.metric, mode=experiment.mode, record=record, objectives=experiment.objectives),
            searchers.shown(experiment.searched, experiment.sampler),
            verbose=rc.verbose,
            progress_reporter=self._reporter,
            raise_on_failed_trial=rc.failure_config.fail_fast == "raise",  # else they are in the grid
        )
        self._results = ResultGrid(sweep.trials, metric=experiment.metric, mode=experiment.mode, record=record, objectives=experiment.objectives)
        return self._results


def _experiment(
    trainable: Any,
    *,
    param_space: Mapping[str, Any],
    num_samples: int,
    metric: str | None,
    mode: str | None,
    scheduler: Any,
    search_alg: Any,
    resources_per_trial: Mapping[str, float] | None,
    name: str | None,
    storage_path: str | None,
    stop: Any,
    time_budget_s: float | None,
    max_failures: int,
    fail_fast: bool | str,
    max_concurrent_trials: int | None,
    seed: int | None,
    checkpoint_config: CheckpointConfig | None = None,
    resume: bool | str = False,
    checkpoint_frequency: int = 0,
    checkpoint_at_end: bool | None = False,
    refuse_at_end_for_functions: bool = False,
    restoring: bool = False,
) -> runner.TuneRequest:
    """Every argument checked, and the trial template made, before any service starts or any trial runs."""
    # Ray's wrappers: a limiter lowers the experiment's concurrency; the variant generator is the default search.
    search_alg, repeater, max_concurrent_trials, seed = searchers.unwrap(search_alg, max_concurrent_trials, seed)
    resume_mode = _resume_mode(resume, name=name, metric=metric or getattr(scheduler, "metric", None) or getattr(search_alg, "metric", None))
    if mode not in (None, "min", "max"):
        raise ValueError(f"mode={mode!r}: use 'min' (e.g. for a loss) or 'max' (e.g. for accuracy)")
    if metric is not None and not isinstance(metric, str):
        raise TypeError(f"metric must be the name of a reported metric, got {metric!r}")
    if (metric is None) != (mode is None) and search_alg is None and getattr(scheduler, "metric", None) is None:
        raise ValueError(f"give metric and mode together (got metric={metric!r}, mode={mode!r})")
    if not isinstance(param_space, Mapping):
        raise TypeError(f"config/param_space must be a dict, got {type(param_space).__name__}")
    if max_concurrent_trials is not None and max_concurrent_trials < 1:
        raise ValueError(f"max_concurrent_trials must be >= 1, got {max_concurrent_trials}")
    if stop is not None and not callable(stop) and not isinstance(stop, Mapping):
        raise TypeError(f'stop must be a dict like {{"training_iteration": 10}} or a function, got {stop!r}')
    template = plan_trial(
        trainable,
        resources_per_trial,
        dict(param_space),
        checkpoint_frequency=checkpoint_frequency,
        checkpoint_at_end=bool(checkpoint_at_end),
        refuse_at_end_for_functions=refuse_at_end_for_functions,
    )
    # The search's sampler; an OptunaSearch's metric/mode become the experiment's (a different one is refused).
    search = searchers.plan(
        search_alg, repeater, param_space, num_samples=num_samples, metric=metric, mode=mode, seed=seed
    )
    metric, mode = search.metric, search.mode
    sched = resolve_scheduler(scheduler)
    sched.set_search_properties(metric, mode)  # a scheduler left without a metric/mode fails here, with the fix
    return runner.TuneRequest(
        template=template,
        trainable_name=trainable_name(trainable),
        sampler=search.sampler,
        name=name or f"{trainable_name(trainable)}_{time.strftime('%Y-%m-%d_%H-%M-%S')}",
        scheduler=sched,
        metric=metric or getattr(sched, "metric", None),
        mode=mode or getattr(sched, "mode", None),
        stop=stop,
        max_concurrent_trials=max_concurrent_trials,
        time_budget_s=time_budget_s,
        max_failures=max_failures,
        fail_fast=fail_fast,
        storage_path=storage_path,
        varying_names=search.varying_names,
        searched=search.searched,
        search=search.label,
        checkpoint_config=checkpoint_config,
        resume="restore" if restoring else resume_mode,
        search_space=search.search_space,
        objectives=search.objectives,
        settings=Settings.from_env(),  # the one read of the machine's settings for this call
    )
