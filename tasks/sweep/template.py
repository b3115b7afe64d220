"""What a trial runs (``TrialTemplate``: the function on every rank, the DDP group's shape, how the sweep ranks,
checkpoints and restarts it) and which trial it is (``SweepTrial``: its number and sampled hyperparameters).

The pipeline (``sweepflow run``) and ``sweepflow.tune`` (from the trainable) both build a template; the sweep
driver makes each ``SweepTrial`` from it, and the ``train-trial`` task runs one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sweepflow.tasks.sweep.naming import describe_trial

if TYPE_CHECKING:
    from sweepflow.tasks.sweep.resume import ResumeFrom


@dataclass(frozen=True)
class TrialTemplate:
    """What a trial runs: the function every rank runs, its group's shape, and how the sweep ranks, checkpoints
    and restarts it. Every trial of a sweep shares it; a ``SweepTrial`` adds its number and sampled hyperparameters.
    ``sweepflow run``'s pipeline and ``sweepflow.tune`` (from the trainable) both build one."""

    train_fn: str | Callable[..., Any]  # "module:function", or a function object (shipped by value); every rank
    train_loop_config: dict[str, Any] = field(default_factory=dict)  # fixed entries; the sampled ones override
    num_ranks: int = 1
    resources_per_rank: dict[str, float] = field(default_factory=dict)  # Dask worker resources, e.g. {"GPU": 1}
    use_gpu: bool = False
    threads_per_rank: int | None = None  # torch threads per rank when not its CPU resource (cores shared as Ray does)
    selection_metric: str | None = None  # what the sweep ranks trials by (None: Tune without a metric)
    selection_mode: str = "max"
    max_reports: int = 0  # the scheduler's max_t (epochs for FIFO; 0: none): a stop there means the trial is complete
    seed: int | None = 0  # trial i trains with config["seed"] = seed + i (None: no seed entry)
    varying_names: tuple[str, ...] = ()  # the hyperparameters that differ between trials (for names)
    max_failures: int = 0
    hang_timeout_s: float | None = None  # TorchConfig.hang_timeout_s: a group this long without a report hung
    system_metrics_interval_s: float = 0.0  # longest gap between rank 0's system-metrics samples (any MLflow store); 0: off
    # Checkpoint retention per trial: the best ``checkpoints_to_keep`` by ``checkpoint_score`` (default: the
    # selection metric and mode), plus always the latest (a restart resumes from it); None keeps them all.
    checkpoints_to_keep: int | None = 1
    checkpoint_score: str | None = None
    checkpoint_score_mode: str | None = None
    # How trials are named (Ray's trial_name_creator / trial_dirname_creator; None: the defaults): the name is
    # its Prefect task run's and its MLflow run's; the directory, the one its checkpoints are staged in.
    name_trial: Callable[[SweepTrial], str] | None = None
    dirname_trial: Callable[[SweepTrial], str] | None = None
    run_tags: dict[str, str] = field(default_factory=dict)  # on every trial's MLflow run, from its creation
    # A project's directory (PipelineConfig.project_dir): on the ranks' import path while train_fn runs
    import_dir: str | None = None
    # A TorchTrainer trainable's ``datasets`` (ddp_runtime.data.Dataset by name) and ``dataset_config``: every
    # trial's group gets them, each rank its shard (``get_dataset_shard``)
    datasets: dict[str, Any] = field(default_factory=dict)
    dataset_config: Any = None
    # Each trial's group from its config (``tune.with_resources`` given a function of the config): the template
    # fields it sets (num_ranks, resources_per_rank, use_gpu, threads_per_rank), as the cluster grants them once
    # placed; None: every trial's group is this template's.
    per_trial: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ValueError(f"a trial needs at least one rank, got num_ranks={self.num_ranks}")
        if self.selection_mode not in ("min", "max"):
            raise ValueError(f"selection_mode must be 'min' or 'max', got {self.selection_mode!r}")
        if self.max_reports < 0:
            raise ValueError(f"max_reports must be >= 0 (the scheduler's max_t; 0: none), got {self.max_reports}")

    @property
    def gpus_per_rank(self) -> float:
        return float(self.resources_per_rank.get("GPU", 0.0))

    def trial(self, index: int, params: dict[str, Any], resume: ResumeFrom | None = None) -> SweepTrial:
        """Trial number ``index`` of the sweep, with its sampled ``params`` (``resume``: it continues in its run)."""
        if self.per_trial is not None:
            return replace(self, per_trial=None, **self.per_trial(params)).trial(index, params, resume)
        trial_id = f"trial_{index:04d}"
        shown = [name for name in self.varying_names if name in params]
        name = f"{trial_id}-{describe_trial(params, shown)}" if shown else trial_id
        trial = SweepTrial(template=self, trial_id=trial_id, index=index, name=name, params=params, resume=resume)
        if self.name_trial is not None:
            named = self.name_trial(trial)
            trial = replace(trial, name=named, run_name=named)
        if self.dirname_trial is not None:
            trial = replace(trial, dirname=self.dirname_trial(trial))
        return trial


@dataclass(frozen=True)
class SweepTrial:
    """One trial of a sweep: which one it is, and its template (plain data: it is the Prefect task's parameter)."""

    template: TrialTemplate
    trial_id: str
    index: int  # the trial's number: trials start in this order
    name: str
    params: dict[str, Any]  # the sampled hyperparameters
    resume: ResumeFrom | None = None  # it was running when its sweep died: continue in that run
    run_name: str | None = None  # its MLflow run's name (None: its trial id, short enough for the runs table)
    dirname: str | None = None  # its staging directory's name (None: its MLflow run id)

    @property
    def train_loop_config(self) -> dict[str, Any]:
        """The template's fixed entries, the sampled ones over them, and the trial's seed."""
        seed = self.template.seed
        return {
            **self.template.train_loop_config,
            **self.params,
            **({"seed": seed + self.index} if seed is not None else {}),
        }

    def identity(self) -> dict[str, Any]:
        """The ``TrialResult`` fields that say which trial it is."""
        return {"trial_id": self.trial_id, "index": self.index, "name": self.name, "config": self.params}
