"""Ray's ``ray.air.integrations.mlflow`` on sweepflow: ``MLflowLoggerCallback`` and ``setup_mlflow``.

Every trial of a Tune experiment is already an MLflow run (params, every report, checkpoints, status) under the
experiment's parent run, so neither makes a run of its own:

* ``MLflowLoggerCallback(tracking_uri=, experiment_name=, tags=, save_artifact=)`` shapes that recording: the
  experiment is recorded in MLflow experiment ``experiment_name`` (default: the Tune experiment's name), at
  ``tracking_uri`` (default: ``MLFLOW_TRACKING_URI``, else the tracking server sweepflow starts), with ``tags``
  on every trial's run. Settings that conflict (with another callback, or a tracking URI other than
  ``MLFLOW_TRACKING_URI``) are refused before any work.
* ``mlflow = setup_mlflow(config)`` inside a trainable returns the ``mlflow`` module with the trial's own run
  active in the calling thread: ``mlflow.log_metric(...)``, ``mlflow.log_artifact(...)`` or autologging land in
  the trial's run. Other ranks of a DDP trial get a module that does nothing (``rank_zero_only=True``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sweepflow.tune.callback import Recording
from sweepflow.tune.logger import LoggerCallback

if TYPE_CHECKING:
    from sweepflow.tasks.training.function import TrialRun

__all__ = ["MLflowLoggerCallback", "setup_mlflow"]

_RESERVED_TAG_PREFIXES = ("sweepflow.", "mlflow.")


def _checked_tags(tags: Any, where: str) -> dict[str, str]:
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise TypeError(f"{where}(tags=...) takes a dict of tag names to values, got {tags!r}")
    for key in tags:
        if not isinstance(key, str) or not key:
            raise TypeError(f"{where}(tags=...): tag names must be non-empty strings, got {key!r}")
        if key.startswith(_RESERVED_TAG_PREFIXES):
            raise ValueError(
                f"{where}(tags=...): {key!r} is one of sweepflow's or MLflow's own tags (they start with "
                f"{' or '.join(_RESERVED_TAG_PREFIXES)}); name yours otherwise"
            )
    return {key: str(value) for key, value in tags.items()}


class MLflowLoggerCallback(LoggerCallback):
    """Ray's ``MLflowLoggerCallback``, mapped onto the trials' own MLflow runs (see the module's documentation):
    no second run per trial, and nothing logged twice.

    ``save_artifact``: each trial's directory (its checkpoints) is its run's artifacts already, with or without
    it. Refused: ``registry_uri`` (a Tune experiment registers no model), ``tracking_token`` (give it as
    ``MLFLOW_TRACKING_TOKEN`` in the environment of the script and the Dask workers) and
    ``log_params_on_trial_end=True`` (a trial's sampled config is its run's params from its start; PBT's later
    configs are in the run's ``pbt/config_history.json``)."""

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        registry_uri: str | None = None,
        experiment_name: str | None = None,
        tags: dict[str, Any] | None = None,
        tracking_token: str | None = None,
        save_artifact: bool = False,
        log_params_on_trial_end: bool = False,
    ) -> None:
        if registry_uri is not None:
            raise ValueError(
                "MLflowLoggerCallback(registry_uri=...): a Tune experiment registers no model; register the best "
                "trial's model after the run (mlflow.register_model) with the registry URI set there"
            )
        if tracking_token is not None:
            raise ValueError(
                "MLflowLoggerCallback(tracking_token=...): give the token as MLFLOW_TRACKING_TOKEN in the "
                "environment of the script and of the Dask workers (it is a credential: it is not passed around "
                "in arguments)"
            )
        if log_params_on_trial_end:
            raise ValueError(
                "MLflowLoggerCallback(log_params_on_trial_end=True): a trial's sampled config is logged as its "
                "run's params when it starts (PBT's later configs are in the run's pbt/config_history.json); "
                "drop the argument"
            )
        if tracking_uri is not None and (not isinstance(tracking_uri, str) or not tracking_uri):
            raise TypeError(f"MLflowLoggerCallback(tracking_uri=...) must be a URI string, got {tracking_uri!r}")
        if experiment_name is not None and (not isinstance(experiment_name, str) or not experiment_name.strip()):
            raise TypeError(
                f"MLflowLoggerCallback(experiment_name=...) must be a non-empty name, got {experiment_name!r}"
            )
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.tags = _checked_tags(tags, "MLflowLoggerCallback")
        self.should_save_artifact = bool(save_artifact)

    def __repr__(self) -> str:  # the URI is not shown: it may hold credentials (refused, but never printed)
        return f"MLflowLoggerCallback(experiment_name={self.experiment_name!r}, tags={self.tags!r})"

    def sweepflow_recording(self) -> Recording:
        """The experiment's MLflow recording as this callback asks for it: its tracking URI, experiment name
        and tags.

        Checked against the other callbacks' asks before any trial runs
        (``sweepflow.tune.callback.recording``).
        """
        return Recording(
            source="MLflowLoggerCallback",
            tracking_uri=self.tracking_uri,
            experiment_name=self.experiment_name,
            tags=dict(self.tags),
        )


class _NoopModule:
    """What ``setup_mlflow`` gives the ranks other than 0: every attribute and call does nothing (as in Ray)."""

    def __getattr__(self, item: str) -> _NoopModule:
        return _NoopModule()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def setup_mlflow(
    config: dict[str, Any] | None = None,
    tracking_uri: str | None = None,
    registry_uri: str | None = None,
    experiment_id: str | None = None,
    experiment_name: str | None = None,
    tracking_token: str | None = None,
    artifact_location: str | None = None,
    run_name: str | None = None,
    create_experiment_if_not_exists: bool = False,
    tags: dict[str, Any] | None = None,
    rank_zero_only: bool = True,
) -> ModuleType | _NoopModule:
    """Ray's ``setup_mlflow``, called inside a trainable: the ``mlflow`` module with the trial's own MLflow run
    active in this thread, until the training function returns (the run stays open: the experiment ends it with
    the trial's status). ``config``: its entries the run does not have yet are logged as params (the sampled
    ones are there already; the ``"mlflow"`` entry is left out, as Ray does); ``tags`` are set on the run.

    ``tracking_uri``, ``experiment_id``, ``experiment_name`` and ``run_name`` may be given when they are the
    trial's own (a different one is refused: the trial has one run, named by ``trial_name_creator``);
    ``artifact_location`` and ``create_experiment_if_not_exists`` change nothing, the experiment exists (as in
    Ray for an existing experiment); ``registry_uri`` is set for this process; ``tracking_token`` is set as
    ``MLFLOW_TRACKING_TOKEN`` while the function runs. ``rank_zero_only``: the other ranks of a DDP trial get a
    module that does nothing."""
    import ddp_runtime
    from sweepflow.tasks.training.function import current_trial_run

    run = current_trial_run()
    if run is None:
        raise RuntimeError(
            "setup_mlflow(...) binds mlflow to the trial's own MLflow run: call it inside the trainable that "
            "tune.run / Tuner.fit runs (outside a trial, use mlflow directly)"
        )
    if rank_zero_only and ddp_runtime.get_context().get_world_rank() != 0:
        return _NoopModule()
    _check_own_run(
        run,
        tracking_uri=tracking_uri,
        experiment_id=experiment_id,
        experiment_name=experiment_name,
        run_name=run_name,
    )
    import mlflow

    run_tags = _checked_tags(tags, "setup_mlflow")
    _activate_trial_run(mlflow, run, tracking_token)
    if registry_uri is not None:
        mlflow.set_registry_uri(registry_uri)
    if run_tags:
        mlflow.set_tags(run_tags)
    if config:
        _log_missing_params(mlflow, run, config)
    return mlflow


def _check_own_run(
    run: TrialRun,
    *,
    tracking_uri: str | None,
    experiment_id: str | None,
    experiment_name: str | None,
    run_name: str | None,
) -> None:
    """``setup_mlflow``'s arguments that name the trial's run: each must be the trial's own. A SQLite store
    is refused: only the experiment's own process writes it."""
    from sweepflow.tasks.datasets.uris import redact

    given = {
        "tracking_uri": (tracking_uri, run.tracking_uri),
        "experiment_id": (experiment_id, run.experiment_id),
        "experiment_name": (experiment_name, run.experiment_name),
        "run_name": (run_name, run.run_name),
    }
    for name, (value, own) in given.items():
        if value is not None and str(value).rstrip("/") != own.rstrip("/"):
            raise ValueError(
                f"setup_mlflow({name}={redact(str(value))!r}): trial {run.trial_id} is recorded in its own MLflow "
                f"run, whose {name} is {redact(own)!r}. Drop the argument (mlflow then logs to that run); "
                + (
                    "name trials with tune.run(trial_name_creator=...) / TuneConfig(trial_name_creator=...)"
                    if name == "run_name"
                    else "to record the experiment elsewhere, give MLflowLoggerCallback(experiment_name=..., "
                    "tracking_uri=...) in callbacks=[...] or set MLFLOW_TRACKING_URI"
                )
            )
    if run.tracking_uri.startswith("sqlite:"):
        raise RuntimeError(
            "setup_mlflow: this experiment records to a SQLite file, which only the experiment's own process "
            "writes (a second writer would lock it); give it a tracking server (MLFLOW_TRACKING_URI=http://...), "
            "or unset MLFLOW_TRACKING_URI to let sweepflow start one"
        )


def _activate_trial_run(mlflow: ModuleType, run: TrialRun, tracking_token: str | None) -> None:
    """The trial's run made the active one in this thread (with its credentials and tracking URI) until the
    training function returns; nothing to do when it already is."""
    from sweepflow.tasks.compat import detach_active_run, tracking_uri_scope
    from sweepflow.tasks.tracking.credentials import tracking_auth_scope
    from sweepflow.tasks.training.function import at_function_end

    active = mlflow.active_run()
    if active is None or active.info.run_id != run.run_id:
        if active is not None:
            raise RuntimeError(
                f"setup_mlflow: MLflow run {active.info.run_id} is already active in this thread; end it "
                "(mlflow.end_run()) before setup_mlflow, which makes the trial's own run the active one"
            )
        scope = contextlib.ExitStack()  # undone when the training function returns (or raises)
        at_function_end(scope.close)
        auth = dict(run.auth_env)
        if tracking_token is not None:
            auth["MLFLOW_TRACKING_TOKEN"] = tracking_token
        scope.enter_context(tracking_auth_scope(auth))
        scope.enter_context(tracking_uri_scope(run.tracking_uri))
        mlflow.start_run(run_id=run.run_id)  # the trial's run: it is RUNNING, and stays so
        scope.callback(detach_active_run, run.run_id)  # let go of it without ending it


def _log_missing_params(mlflow: ModuleType, run: TrialRun, config: dict[str, Any]) -> None:
    """``config``'s entries the trial's run lacks, logged as its params (the ``"mlflow"`` entry left out)."""
    from sweepflow.tasks.tracking.runs import param_items

    # The flow writes the run's sampled config (with ``num_ranks``) in the background, a moment after the run
    # starts: wait for it (bounded), or both would insert the same params at once and one would fail.
    deadline = time.monotonic() + 30
    present = mlflow.get_run(run.run_id).data.params
    while "num_ranks" not in present and time.monotonic() < deadline:
        time.sleep(0.2)
        present = mlflow.get_run(run.run_id).data.params
    wanted = param_items({key: value for key, value in config.items() if key != "mlflow"})
    # Only what the run lacks: its sampled config is there already, and a value that changed since (PBT)
    # is in its config history, not a param (MLflow refuses to change one).
    missing = {param.key: param.value for param in wanted if param.key not in present}
    if missing:
        mlflow.log_params(missing)
