"""Ray Tune's ``Callback``: ``tune.run(callbacks=[...])`` and ``RunConfig(callbacks=[...])``, with Ray's hook names
and arguments (always passed by keyword, as Ray does).

The hooks run in the script's own process (the experiment's Prefect flow runs there, its trials as task runs in
its threads), one call at a time, never on a Dask worker: ``setup`` before the first trial; ``on_step_begin`` /
``on_step_end`` around each step of the driver loop (it starts the trials that can start, then takes one
trial's end or a freed slot); per trial ``on_trial_start``, ``on_trial_result`` for each report (after the
scheduler decided on it), then ``on_trial_complete`` (ended, or stopped early: Ray's TERMINATED) or
``on_trial_error``; ``on_experiment_end`` once every trial has ended and its MLflow run is written. The
``trial`` objects are ``sweepflow.tune.analysis.Trial`` (Ray's ``trial_id``, ``config``, ``status``,
``last_result``, ``trainable_name``, ``experiment_tag``, ``path``; ``str(trial)`` is its name), kept up to date
as the trial runs; ``trials`` lists those started so far.

An ``on_trial_result`` that sets ``result["should_checkpoint"] = True`` (``sweepflow.tune.result.SHOULD_CHECKPOINT``)
has the trial checkpointed at that report, as Ray 2.49+ does: a class trainable's ``save_checkpoint`` runs before
its next step; a function trainable keeps only the checkpoints it reports itself (in Ray too).

A hook that raises fails the experiment with a ``CallbackError`` naming the callback and the hook: the running
trials stop at their next report (their MLflow runs end KILLED), none starts, no hook is called again.

Not called here, so refused when a callback overrides them (rather than silently never called):
``on_checkpoint`` / ``on_trial_save``, ``on_trial_restore`` and ``on_trial_recover``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from sweepflow.tasks.sweep.events import SweepObserver
from sweepflow.tune.result import SHOULD_CHECKPOINT

if TYPE_CHECKING:
    from sweepflow.tasks.sweep.results import TrialResult
    from sweepflow.tasks.sweep.template import SweepTrial
    from sweepflow.tune.analysis import Trial

F = TypeVar("F", bound=Callable[..., Any])

#: Hooks the experiment never calls -> why, and where the callback's work can go instead.
NEVER_CALLED: dict[str, str] = {
    "on_checkpoint": "checkpoints go straight to the trial's MLflow run as it reports them; do the work in "
    "on_trial_result (the result of a report with a checkpoint) or on_trial_complete (trial.checkpoint)",
    "on_trial_save": "checkpoints go straight to the trial's MLflow run as it reports them; do the work in "
    "on_trial_result or on_trial_complete (trial.checkpoint)",
    "on_trial_restore": "a trial is never paused and restored as an actor here; a resumed experiment's trials "
    "call on_trial_start again, so do the work there",
    "on_trial_recover": "a failed trial's DDP group is restarted inside the trial (FailureConfig.max_failures), "
    "which hooks do not see; its restarts are the sweepflow.restarts tag of its MLflow run",
    "log_trial_save": "checkpoints go straight to the trial's MLflow run; log in log_trial_result or log_trial_end",
    "log_trial_restore": "a trial is never restored as an actor here; log in log_trial_start",
}


def never_called(method: F) -> F:
    """Marks a base class's default for a hook in ``NEVER_CALLED``: a subclass overriding it is refused."""
    method._sweepflow_never_called = True  # type: ignore[attr-defined]
    return method


class CallbackError(RuntimeError):
    """A callback's hook raised; the experiment stopped (its running trials stopped, none started)."""


@dataclass(frozen=True)
class Recording:
    """How a logger callback asks the experiment's trials to be recorded in MLflow (``MLflowLoggerCallback``).
    Every trial is already an MLflow run, so these settings shape that recording instead of adding another."""

    source: str  # the callback, for messages
    tracking_uri: str | None = None
    experiment_name: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)


class Callback:
    """Ray Tune's ``Callback``: subclass it and override the hooks you need (see the module's documentation for
    when each is called). Every hook does nothing by default."""

    def setup(
        self,
        stop: Any = None,
        num_samples: int | None = None,
        total_num_samples: int | None = None,
        **info: Any,
    ) -> None:
        """Called once, before the first trial starts: the experiment's ``stop`` criteria, ``num_samples`` and
        the number of trials it proposes (``total_num_samples``, grid repeats included)."""

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        """Called at the start of each step of the driver loop (``iteration`` counts them from 1)."""

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        """Called at the end of each step of the driver loop."""

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Called when a trial starts (its MLflow run is open, its DDP group about to start)."""

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        """Called for each report of a trial, after the scheduler decided on it. ``result``: the reported
        metrics with ``training_iteration``, ``time_total_s``, ``trial_id``, ``config``, ``timestamp``."""

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Called when a trial ended without an error (completed, or stopped early by the scheduler or a stopper)."""

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Called when a trial failed (``trial.error_msg`` says why)."""

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Called once every trial has ended and the experiment's MLflow runs are written."""

    @never_called
    def on_checkpoint(self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Any, **info: Any) -> None:
        """Not called here (see ``NEVER_CALLED``)."""

    @never_called
    def on_trial_save(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Not called here (see ``NEVER_CALLED``)."""

    @never_called
    def on_trial_restore(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Not called here (see ``NEVER_CALLED``)."""

    @never_called
    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Not called here (see ``NEVER_CALLED``)."""

    def get_state(self) -> dict[str, Any] | None:
        """Ray saves it with the experiment; here a resumed experiment starts its callbacks afresh."""
        return None

    def set_state(self, state: dict[str, Any]) -> None:
        """See ``get_state``."""

    def sweepflow_recording(self) -> Recording | None:
        """How this callback shapes the trials' MLflow recording (``MLflowLoggerCallback``); None: it does not."""
        return None


def check_callbacks(callbacks: Any, where: str) -> tuple[Callback, ...]:
    """``callbacks=`` as given to ``where`` ("tune.run" / "RunConfig"), checked before any work."""
    if callbacks is None:
        return ()
    if isinstance(callbacks, Callback) or not isinstance(callbacks, list | tuple):
        raise TypeError(f"{where}(callbacks=...) takes a list of callbacks, e.g. callbacks=[MyCallback()]; got {callbacks!r}")
    for callback in callbacks:
        if isinstance(callback, type) and issubclass(callback, Callback):
            raise TypeError(
                f"{where}(callbacks=[...]): {callback.__name__} is a class; pass an instance: {callback.__name__}()"
            )
        if not isinstance(callback, Callback):
            raise TypeError(
                f"{where}(callbacks=[...]): {callback!r} is not a sweepflow.tune.Callback; subclass it "
                "(from sweepflow.tune import Callback) and override the hooks you need"
            )
        for hook, why in NEVER_CALLED.items():
            method = getattr(type(callback), hook, None)
            if method is not None and not getattr(method, "_sweepflow_never_called", False):
                raise ValueError(
                    f"{where}(callbacks=[...]): {type(callback).__name__}.{hook} would never be called: {why}"
                )
    return tuple(callbacks)


def recording(callbacks: Sequence[Callback], *, environment_tracking_uri: str | None) -> Recording | None:
    """What the callbacks ask of the trials' MLflow recording, merged; conflicting asks are refused, as is a
    tracking URI other than the one the environment names (``MLFLOW_TRACKING_URI``): the trials are recorded
    once, in one place."""
    from sweepflow.tasks.datasets.uris import redact, split_userinfo

    asks = [ask for ask in (callback.sweepflow_recording() for callback in callbacks) if ask is not None]
    if not asks:
        return None
    merged: dict[str, tuple[str, str]] = {}  # setting -> (value, which callback asked)
    tags: dict[str, tuple[str, str]] = {}
    for ask in asks:
        for setting in ("tracking_uri", "experiment_name"):
            value = getattr(ask, setting)
            if value is None:
                continue
            if setting in merged and merged[setting][0] != value:
                raise ValueError(
                    f"{ask.source} and {merged[setting][1]} ask for different MLflow {setting}s "
                    f"({redact(value)!r} and {redact(merged[setting][0])!r}): every trial is recorded once, in one "
                    "place; give them the same value or drop one"
                )
            merged.setdefault(setting, (value, ask.source))
        for key, value in ask.tags.items():
            if key in tags and tags[key][0] != value:
                raise ValueError(
                    f"{ask.source} and {tags[key][1]} set MLflow tag {key!r} to different values ({value!r} and "
                    f"{tags[key][0]!r}): give it one value"
                )
            tags.setdefault(key, (value, ask.source))
    uri, uri_source = merged.get("tracking_uri", (None, ""))
    if uri is not None:
        if split_userinfo(uri)[1] is not None:
            raise ValueError(
                f"{uri_source}: the tracking URI {redact(uri)!r} holds credentials; give it without them and put "
                "them in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (the flow and its workers read them)"
            )
        if environment_tracking_uri and environment_tracking_uri.rstrip("/") != uri.rstrip("/"):
            raise ValueError(
                f"{uri_source} records to {redact(uri)!r}, but MLFLOW_TRACKING_URI is "
                f"{redact(environment_tracking_uri)!r}: every trial is recorded once, in one place (and its "
                "trainable's setup_mlflow writes there too); unset MLFLOW_TRACKING_URI, or drop the callback's "
                "tracking_uri"
            )
    return Recording(
        source=", ".join(ask.source for ask in asks),
        tracking_uri=uri,
        experiment_name=merged.get("experiment_name", (None, ""))[0],
        tags={key: value for key, (value, _) in tags.items()},
    )


class TuneCallbacks(SweepObserver):
    """The sweep's events as Ray's hooks on the user's callbacks, in their order (``SweepRuntime.notify`` calls
    one event at a time)."""

    def __init__(
        self,
        callbacks: Sequence[Callback],
        *,
        trainable_name: str,
        stop: Any,
        num_samples: int,
        varying_names: Sequence[str] = (),
        logs_dir: str | None = None,
    ) -> None:
        self.callbacks = tuple(callbacks)
        self.logs_dir = logs_dir  # the trials' local directories go under it (trial.local_path)
        self.trainable_name = trainable_name
        self.stop = stop
        self.num_samples = num_samples
        self.varying_names = tuple(varying_names)
        self.iteration = 0
        self.trials: dict[str, Trial] = {}  # started so far, by trial id (in starting order)

    def __repr__(self) -> str:
        return f"TuneCallbacks([{', '.join(type(c).__name__ for c in self.callbacks)}])"

    def _call(self, hook: str, **arguments: Any) -> None:
        """Call ``hook`` on every callback, in their order, with Ray's keyword arguments."""
        trial = arguments.get("trial")
        for callback in self.callbacks:
            try:
                getattr(callback, hook)(**arguments)
            except Exception as exc:
                which = f" for trial {trial.trial_id}" if trial is not None else ""
                raise CallbackError(
                    f"callback {type(callback).__name__}.{hook} raised {type(exc).__name__}: {exc}{which}; the "
                    f"experiment stopped. Fix {type(callback).__name__}.{hook}, or leave it out of callbacks=[...]"
                ) from exc

    def _listed(self) -> list[Trial]:
        return list(self.trials.values())

    def _trial(self, spec_or_result: Any, **where: Any) -> Trial:
        """A Ray ``Trial`` for the trial (kept up to date from here on)."""
        from sweepflow.tasks.sweep.results import TrialResult, TrialStatus
        from sweepflow.tune.analysis import Trial

        found = self.trials.get(spec_or_result.trial_id)
        if found is not None:
            return found
        result = (
            spec_or_result
            if isinstance(spec_or_result, TrialResult)
            else TrialResult(**spec_or_result.identity(), status=TrialStatus.NOT_STARTED)
        )
        trial = Trial(
            result,
            trainable_name=self.trainable_name,
            experiment_tag=experiment_tag(result.index, result.config, self.varying_names),
            **where,
        )
        self.trials[trial.trial_id] = trial
        return trial

    # ---- the sweep's events
    def sweep_started(self, total: int) -> None:
        """Call every callback's ``setup`` (``stop``, ``num_samples``, ``total_num_samples``)."""
        self._call("setup", stop=self.stop, num_samples=self.num_samples, total_num_samples=total)

    def step_begin(self) -> None:
        """Count a new driver-loop step and call ``on_step_begin``."""
        self.iteration += 1
        self._call("on_step_begin", iteration=self.iteration, trials=self._listed())

    def step_end(self) -> None:
        """Call ``on_step_end`` for the current step."""
        self._call("on_step_end", iteration=self.iteration, trials=self._listed())

    def trial_started(self, spec: SweepTrial, run_id: str, storage: str) -> None:
        """Mark the trial RUNNING (with its MLflow run id and checkpoint storage) and call ``on_trial_start``.
        """
        trial = self._trial(spec, path=storage)
        trial.status, trial.mlflow_run_id = "RUNNING", run_id
        if self.logs_dir is not None:
            trial.local_path = os.path.join(self.logs_dir, spec.dirname or spec.trial_id)
        self._call("on_trial_start", iteration=self.iteration, trials=self._listed(), trial=trial)

    def trial_result(self, spec: SweepTrial, result: Mapping[str, Any]) -> bool:
        """Call ``on_trial_result`` with Ray's full result (``trial_id``, ``experiment_tag``, ``config``,
        ``timestamp``, ``done``).

        Returns:
            Whether a callback set ``result["should_checkpoint"]``: the sweep then has the trial checkpointed
                at this
            report (Ray 2.49+).
        """
        trial = self._trial(spec)
        trial.config = trial.evaluated_params = dict(spec.params)  # PBT changes it as the trial goes on
        full = {
            **result,
            "trial_id": spec.trial_id,
            "experiment_tag": trial.experiment_tag,
            "config": dict(spec.params),
            "timestamp": int(time.time()),
            "done": False,
        }
        trial.last_result = full
        trial.metric_history.append(full)
        self._call(
            "on_trial_result", iteration=self.iteration, trials=self._listed(), trial=trial, result=full
        )
        # Ray (2.49+): a callback may set result["should_checkpoint"] to have the trial checkpointed at this report.
        return bool(full.get(SHOULD_CHECKPOINT))

    def trial_ended(self, result: TrialResult) -> None:
        """Update the trial from its final result and call ``on_trial_error`` (failed) or
        ``on_trial_complete``.
        """
        from sweepflow.tasks.sweep.results import TrialStatus

        trial = self._trial(result)
        trial._update(result)
        hook = "on_trial_error" if result.status is TrialStatus.FAILED else "on_trial_complete"
        self._call(hook, iteration=self.iteration, trials=self._listed(), trial=trial)

    def sweep_ended(self, results: Sequence[TrialResult]) -> None:
        """Bring every trial up to date (a resumed experiment's read-back ones too), in trial order, and call
        ``on_experiment_end``.
        """
        for result in sorted(results, key=lambda r: r.index):  # a resumed experiment's read-back trials too
            self._trial(result)._update(result)
        self.trials = dict(sorted(self.trials.items(), key=lambda item: item[1].result.index))
        self._call("on_experiment_end", trials=self._listed())


def experiment_tag(index: int, config: Mapping[str, Any], varying_names: Sequence[str]) -> str:
    """Ray's ``Trial.experiment_tag``: the trial's number and its searched values, e.g. ``"3_lr=0.01,width=8"``."""
    from sweepflow.tasks.sweep.naming import describe_trial

    shown = [name for name in varying_names if name in config]
    return f"{index}_{describe_trial(config, shown)}" if shown else str(index)


def tune_callbacks(
    callbacks: Sequence[Callback],
    *,
    trainable_name: str,
    stop: Any,
    num_samples: int,
    varying_names: Sequence[str],
    logs_dir: str | None = None,
) -> TuneCallbacks | None:
    """The experiment's observer calling ``callbacks``' hooks (None without callbacks); ``logs_dir``: where the
    trials' local directories go."""
    if not callbacks:
        return None
    return TuneCallbacks(
        callbacks,
        trainable_name=trainable_name,
        stop=stop,
        num_samples=num_samples,
        varying_names=varying_names,
        logs_dir=logs_dir,
    )
