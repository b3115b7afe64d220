"""One experiment, whichever face asked for it: the pipeline's ``PipelineConfig``, ``tune.run`` and
``Tuner.fit`` each *lower* to an ``Experiment``, and one lifecycle (``sweepflow.flows.experiment``) runs it: the
cluster and the trials' placement, the MLflow parent run (new or resumed), the sweep, its recording, and the
evaluation and registration of the best trial when asked.

Plain typed data, built and checked before any service starts; nothing here talks to Prefect, MLflow or Dask.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

from sweepflow.tasks.sweep.events import SweepObserver
from sweepflow.tasks.sweep.samplers import Sampler
from sweepflow.tasks.sweep.template import TrialTemplate
from sweepflow.tasks.sweep.trial_scheduler import TrialScheduler

#: What a face prepares on the cluster for the experiment's trials, around the sweep (the Tune face: its
#: ``with_parameters`` objects sent to every worker once, its reused trainables cleaned up at the end): given the
#: Dask client, the placed template and a logger, a context manager that yields the template the trials run.
OnCluster = Callable[[Any, TrialTemplate, Callable[[str], None]], AbstractContextManager[TrialTemplate]]


@dataclass(frozen=True)
class Placement:
    """Where the trials run and how they are fitted onto the cluster."""

    scheduler_address: str | None  # a running Dask scheduler; None: a local cluster started for the experiment
    use_gpu: bool = False  # the local cluster has one worker per GPU
    n_workers: int | None = None  # the local cluster's CPU workers (None: its default)
    preload: tuple[str, ...] = ()  # modules every local worker imports at start
    # Ray's rule on one host: a trial asking more CPUs than one worker declares shares the host's cores (its ranks
    # run that many threads, fewer trials at once) instead of being refused (the Tune face; see placement.py)
    share_cores: bool = False
    asked_by: str = "the trial's resources"  # the setting to name when no trial fits


@dataclass(frozen=True)
class Recording:
    """Where and how the experiment is recorded in MLflow: its parent run (every setting credential-free) and
    the sweep report."""

    tracking_uri: str
    experiment_name: str  # the MLflow experiment
    run_name: str  # the parent run's name
    kind: str  # the parent run's ``sweepflow.kind`` tag: "pipeline" or "tune"
    params: Mapping[str, Any]  # the few settings runs are filtered and compared by
    settings: Mapping[str, Any]  # every setting, as the artifact config/<settings_file>
    settings_file: str
    resume_key: Mapping[str, Any]  # what a resumed run must share with the interrupted one
    title: str  # the sweep report's title
    tags: Mapping[str, str] = field(default_factory=dict)  # more parent-run tags (e.g. the data's checksum)
    same_on_resume: Mapping[str, str] = field(default_factory=dict)  # tags a resume must find unchanged -> what
    artifact_root: str | None = None  # a local store's artifact directory (None: the server's)
    artifacts_destination: str | None = None  # the server's artifact root, when known (direct writes)
    resume_hint: str | None = None  # logged with the parent run's id: how to resume it if interrupted


@dataclass(frozen=True)
class Resume:
    """The interrupted run an experiment continues: its ended trials are read back, its running ones continue
    from their checkpoints; ``errored``: its failed trials are kept ("keep"), continued ("resume") or restarted."""

    parent_run_id: str
    errored: Literal["keep", "resume", "restart"] = "keep"


@dataclass(frozen=True)
class Finalize:
    """The stages after the sweep, when asked: the best trial's best checkpoint evaluated on the test split, then
    registered (a new champion only if it beats the current one by ``champion_metric``). Both faces ask for them
    the same way: the pipeline's ``evaluation``/``selection`` sections, and ``tune.register_best`` on a grid."""

    data_path: str | None  # the prepared data (None: no evaluation, no input example from it)
    registered_model_name: str
    champion_metric: str  # test_<metric> (or, with no evaluation, a reported metric): decides the champion
    champion_mode: Literal["min", "max"]
    data_checksum: str = ""  # tagged on the version when known
    # "pkg.mod:fn", or the function itself (a Tune script's, called in its process); None: the built-in ones
    evaluate_fn: str | Callable[..., Any] | None = None
    model_fn: str | Callable[..., Any] | None = None
    project_dir: str | None = None  # on the import path while the project's functions run
    # False: no test-set evaluation; the best trial's last reported metrics decide the champion
    # (``tune.register_best`` without ``evaluate_fn``)
    evaluate: bool = True
    champion_setting: str = "selection.champion_metric"  # the setting a refusal names


@dataclass(frozen=True)
class Experiment:
    """Everything one experiment runs, checked before any work."""

    name: str
    sampler: Sampler  # the search: what each trial tries, in order
    scheduler: TrialScheduler  # early stopping, pausing, exploiting (stop rules included)
    template: TrialTemplate  # what each trial runs, ranked by its selection metric
    search_space: Mapping[str, Any]  # as data (the report's axes)
    placement: Placement
    recording: Recording
    search_label: str  # how the search is named in the sweep's log line ("tpe sampler", "random search", ...)
    root_dir: str  # local files on their way somewhere: staging/ (checkpoints), tmp/ (artifacts)
    max_concurrent_trials: int | None = None  # None: as many as the cluster fits
    time_budget_s: float | None = None  # running trials stop once it is spent; none starts
    fail_fast: bool = False  # the first failed trial ends the sweep
    resume: Resume | None = None
    finalize: Finalize | None = None
    observer: SweepObserver | None = None  # told the sweep's events as they happen (a Tune script's callbacks)
    on_cluster: OnCluster | None = None
    # A multi-objective search's (metric, mode) pairs (the Tune face's OptunaSearch): the sweep's Pareto front is
    # recorded on the parent run and drawn in the report. Empty: the sweep has one objective, its metric.
    objectives: tuple[tuple[str, str], ...] = ()

    @property
    def metric(self) -> str | None:
        return self.template.selection_metric

    @property
    def mode(self) -> str:
        return self.template.selection_mode or "max"
