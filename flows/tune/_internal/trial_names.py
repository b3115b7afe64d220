"""Ray Tune's ``trial_name_creator`` and ``trial_dirname_creator`` (``tune.run`` and ``TuneConfig``): functions of a
``Trial`` (``trial_id``, ``config``, ``trainable_name``, ``experiment_tag``; status PENDING) returning a string.

The name is the trial's Prefect task run's name and its MLflow run's name (shown in both UIs, and as
``str(trial)`` to callbacks); without a creator, the task run is named ``trial_0003-lr=0.01,...`` and the MLflow
run ``trial_0003``. The directory name is that of the directory the trial's checkpoints are staged in, under
the experiment's path (``<storage_path>/<name>/staging/<dirname>``, else named by its run id), when the tracking
server stores the artifacts itself (``--artifacts-destination``, proxied). When the trials write straight into
MLflow's artifact store (an S3 or local artifact root: the tracking server sweepflow starts does that) their
directory is their run's artifact location, which MLflow names: the name is then only recorded, as the run's
``sweepflow.trial_dirname`` tag (always set), and the trial's log says so. Both are called when a trial is about
to start, in the script's process; a resumed experiment calls them again for its trials, so they must give a
trial the same names again (they do when they depend on the trial's id and config only).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from sweepflow.tasks.sweep.results import TrialResult, TrialStatus
from sweepflow.tasks.sweep.template import SweepTrial


class TrialNamer:
    """A user's ``trial_name_creator`` or ``trial_dirname_creator`` as the sweep calls it, with its result checked."""

    def __init__(
        self, creator: Callable[[Any], str], *, what: str, trainable_name: str, varying_names: Sequence[str]
    ) -> None:
        self.creator, self.what = creator, what
        self.trainable_name, self.varying_names = trainable_name, tuple(varying_names)
        self.given: dict[str, str] = {}  # name -> the trial it was given to (directory names must differ)

    def __repr__(self) -> str:
        return f"{self.what}={getattr(self.creator, '__qualname__', repr(self.creator))}"

    def __call__(self, spec: SweepTrial) -> str:
        from sweepflow.tune.analysis import Trial
        from sweepflow.tune.callback import experiment_tag

        trial = Trial(
            TrialResult(**spec.identity(), status=TrialStatus.NOT_STARTED),
            trainable_name=self.trainable_name,
            experiment_tag=experiment_tag(spec.index, spec.params, self.varying_names),
        )
        try:
            name = self.creator(trial)
        except Exception as exc:
            raise ValueError(
                f"{self.what} raised {type(exc).__name__}: {exc} for trial {spec.trial_id} (config {spec.params}); "
                "it takes a Trial (trial_id, config, trainable_name, experiment_tag) and returns a string"
            ) from exc
        if not isinstance(name, str) or not name.strip():
            raise TypeError(
                f"{self.what} returned {name!r} for trial {spec.trial_id}: it must return a non-empty string"
            )
        if self.what == "trial_dirname_creator":
            self._check_directory(name, spec.trial_id)
        return name

    def _check_directory(self, name: str, trial_id: str) -> None:
        if name in (".", "..") or "/" in name or os.sep in name:
            raise ValueError(
                f"trial_dirname_creator returned {name!r} for trial {trial_id}: it names one directory (no "
                "'/', not '.' or '..'); the experiment's path is put in front of it"
            )
        owner = self.given.setdefault(name, trial_id)
        if owner != trial_id:
            raise ValueError(
                f"trial_dirname_creator returned {name!r} for trials {owner} and {trial_id}: each trial needs a "
                "directory of its own; put trial.trial_id in the name"
            )


def trial_namers(
    trial_name_creator: Any,
    trial_dirname_creator: Any,
    *,
    trainable_name: str,
    varying_names: Sequence[str],
) -> dict[str, TrialNamer]:
    """The ``TrialTemplate`` fields (``name_trial``, ``dirname_trial``) for the creators given, checked."""
    fields: dict[str, TrialNamer] = {}
    for field_name, what, creator in (
        ("name_trial", "trial_name_creator", trial_name_creator),
        ("dirname_trial", "trial_dirname_creator", trial_dirname_creator),
    ):
        if creator is None:
            continue
        if not callable(creator):
            raise TypeError(
                f"{what} must be a function taking a Trial and returning a string, e.g. "
                f"{what}=lambda trial: f\"{{trial.trainable_name}}_{{trial.trial_id}}\"; got {creator!r}"
            )
        fields[field_name] = TrialNamer(
            creator, what=what, trainable_name=trainable_name, varying_names=varying_names
        )
    return fields
