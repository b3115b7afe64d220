"""What a script hooks into an experiment, applied to its plan before any service starts: ``callbacks``
(``tune.run`` / ``RunConfig``), with what ``MLflowLoggerCallback`` asks of the trials' MLflow recording, and
``trial_name_creator`` / ``trial_dirname_creator`` (``tune.run`` / ``TuneConfig``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sweepflow.tune._internal import runner
from sweepflow.tune._internal.trial_names import trial_namers
from sweepflow.tune.callback import check_callbacks, recording, tune_callbacks
from sweepflow.tune.file_loggers import experiment_logs_dir


def with_hooks(
    experiment: runner.TuneRequest,
    *,
    where: str,
    callbacks: Any = None,
    trial_name_creator: Any = None,
    trial_dirname_creator: Any = None,
    num_samples: int,
) -> runner.TuneRequest:
    """``experiment`` with the script's hooks; each is checked here (``where``: "tune.run" or "RunConfig"), and
    a conflicting MLflow setting refused, before any work."""
    checked = check_callbacks(callbacks, where)
    asked = recording(checked, environment_tracking_uri=experiment.settings.tracking_uri)
    template = replace(
        experiment.template,
        **trial_namers(
            trial_name_creator,
            trial_dirname_creator,
            trainable_name=experiment.trainable_name,
            varying_names=experiment.varying_names,
        ),
        run_tags=dict(asked.tags) if asked else {},
    )
    return replace(
        experiment,
        template=template,
        observer=tune_callbacks(
            checked,
            trainable_name=experiment.trainable_name,
            stop=experiment.stop,
            num_samples=num_samples,
            varying_names=experiment.varying_names,
            logs_dir=experiment_logs_dir(
                runner.experiment_path(experiment, experiment.settings.home),
                experiment.settings.home,
                experiment.name,
            ),
        ),
        tracking_uri=asked.tracking_uri if asked else None,
        mlflow_experiment=asked.experiment_name if asked else None,
    )
