"""The pipeline's typed configuration: one pydantic model per component, validated before any work starts.

``PipelineConfig`` is also the flow's parameter schema, so the Prefect UI shows it as a form and
``prefect deployment run ... --param`` values are validated the same way. Everything that depends on the
machine (state directory, tracking URI, scheduler address) is resolved once, at the entry point, by
``resolve_settings`` (``sweepflow.flows.settings``); the flow's tasks each receive only their own part. The
credentials a config may hold are taken out before it becomes a flow run's parameters
(``sweepflow.flows.credentials``); a YAML file and ``--set`` overrides become a config in
``sweepflow.flows.config_file``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sweepflow.flows.scheduler_settings import (
    AshaSettings,
    SchedulerSettings,
)
from sweepflow.flows.section import Section as _Section
from sweepflow.tasks.datasets import DataConfig
from sweepflow.tasks.sweep.space import parse_space

# The Ray Tune CIFAR tutorial's search space (https://docs.ray.io/en/latest/tune/examples/tune-pytorch-cifar.html):
# l1, l2 = 2**randint(2, 9) (4..256), lr = loguniform(1e-4, 1e-1), batch_size = choice([2, 4, 8, 16]).
# Batch sizes are scaled up for the 8x8 digits set so a trial is not dominated by per-step overhead.
SEED_SEARCH_SPACE: dict[str, Any] = {
    "l1": {"type": "pow2", "low": 4, "high": 256},
    "l2": {"type": "pow2", "low": 4, "high": 256},
    "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
    "batch_size": {"type": "choice", "values": [16, 32, 64]},
}

DEFAULT_TRAIN_FN = "sweepflow.tasks.training.loop:train_image_classifier"
#: The built-in classifier's model_fn and evaluate_fn (sweepflow.tasks.training.builtin; not imported here).
BUILTIN_MODEL_FN = "sweepflow.tasks.training.builtin:model_fn"
BUILTIN_EVALUATE_FN = "sweepflow.tasks.training.builtin:evaluate_fn"





#: Which dataset, from where, and how it is split: the data library's own config (frozen pydantic, extra
#: fields forbidden), so the flow passes ``cfg.data`` to ``download_dataset`` as is.
DataSettings = DataConfig


#: A Searcher named by import path (``sweep.sampler``), as ``training.train_fn`` names a function.
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class SweepSettings(_Section):
    """The search: space (as data), sampler, budget."""

    search_space: dict[str, Any] = Field(
        default_factory=lambda: dict(SEED_SEARCH_SPACE),
        description="Hyperparameter -> domain, as data: {type: choice|grid, values: [...]}, {type: uniform|loguniform, "
        "low, high}, {type: randint|qrandint|pow2, low, high}, or a constant. Default: the Ray Tune CIFAR tutorial's",
    )
    sampler: str = Field(
        "random",
        description="random (seeded), grid (exhaustive), tpe (adaptive: Optuna TPE, asks as results arrive), or "
        "a Searcher subclass's import path 'package.module:Class' (Ray Tune's Searcher API, "
        "sweepflow.tune.search.Searcher), made with sampler_options",
    )
    sampler_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the Searcher class sampler names (an import path only)",
    )
    num_samples: int = Field(8, ge=1, description="Trials to sample (with grid parameters: per grid combination)")
    max_concurrent_trials: int | None = Field(
        None, ge=1, description="Default: as many trials as the cluster fits at once given the resources"
    )
    time_budget_s: float | None = Field(
        None, gt=0, description="Stop starting trials (and stop running ones) after"
    )
    seed: int = Field(0, description="Seed of the sampler (the same seed proposes the same trials)")

    @field_validator("search_space")
    @classmethod
    def _valid_space(cls, value: dict[str, Any]) -> dict[str, Any]:
        parse_space(value)  # raises ValueError naming the parameter and the fix
        return value

    @field_validator("sampler")
    @classmethod
    def _known_sampler(cls, value: str) -> str:
        if value not in ("random", "grid", "tpe") and not _IMPORT_PATH.fullmatch(value):
            raise ValueError(
                f"unknown sampler {value!r}: use 'random', 'grid' or 'tpe', or a Searcher subclass's import path "
                "'package.module:Class'"
            )
        return value

    @model_validator(mode="after")
    def _tpe_without_grids(self) -> SweepSettings:
        if self.sampler_options and self.sampler in ("random", "grid", "tpe"):
            raise ValueError(
                f"sampler_options are the keyword arguments of a Searcher class, and sampler={self.sampler!r} is "
                "built in: leave sampler_options out, or name your Searcher as sampler ('package.module:Class')"
            )
        grids = parse_space(self.search_space).grid_names
        if grids and _IMPORT_PATH.fullmatch(self.sampler):
            raise ValueError(
                f"sampler={self.sampler!r} (a Searcher) cannot search grid parameters {grids} (a grid is "
                'exhaustive): make them {"type": "choice", "values": [...]}, or use sampler="random"'
            )
        if self.sampler == "tpe" and grids:
            raise ValueError(
                f"sampler='tpe' cannot search grid parameters {grids} (a grid is exhaustive): make them "
                '{"type": "choice", "values": [...]}, or use sampler="random"'
            )
        return self


class TrainingSettings(_Section):
    """What each trial runs: a training function (import path) and its fixed config."""

    train_fn: str = Field(DEFAULT_TRAIN_FN, description="module:function run on every rank")
    epochs: int = Field(4, ge=1, description="Epochs per trial; a trial reports once per epoch")
    model: str = Field("net", description="The built-in classifier's model: net, resnet18 or small_cnn")
    base_config: dict[str, Any] = Field(
        default_factory=lambda: {"optimizer": "adam"},
        description="Fixed train_loop_config entries; sampled hyperparameters override them",
    )
    max_failures: int = Field(
        0,
        ge=-1,
        description="group restarts from the latest checkpoint per trial (Ray FailureConfig.max_failures); "
        "-1: unlimited",
    )
    system_metrics_interval_s: float = Field(
        5.0,
        ge=0,
        description="Longest seconds between samples of the system metrics (host and trial CPU, memory, GPU "
        "utilisation and memory where there is one) logged by each trial's rank 0 to its run as system/*: the first "
        "0.5 s after it starts training, then at gaps growing with its age up to this, and one at its end; 0: off. "
        "The samples travel with the trial's reports and the sweep writes them, so any MLflow store gets them",
    )
    hang_timeout_s: float | None = Field(
        None,
        gt=0,
        description="Longest a trial's DDP group may go without a report (set-up and first epoch included) "
        "before it is torn down as hung, naming the hung rank (ddp_runtime TorchConfig.hang_timeout_s); "
        "counts as a failure for max_failures. Default: no bound",
    )

    model_fn: str | None = Field(
        None,
        description="Your own model for the registry: 'package.module:function' called as model_fn(checkpoint: "
        "ddp_runtime.Checkpoint) -> torch.nn.Module or (module, input_example); logged with mlflow.pytorch "
        "(signature, input example). Needed with your own train_fn",
    )

    @field_validator("train_fn", "model_fn")
    @classmethod
    def _import_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        module, _, function = value.partition(":")
        if not module or not function:
            raise ValueError(f"{info.field_name} must be 'package.module:function', got {value!r}")
        return value

    @property
    def builtin(self) -> bool:
        """The built-in image classifier trains (its evaluation and registry model come with it)."""
        return self.train_fn == DEFAULT_TRAIN_FN

    @property
    def builtin_model(self) -> bool:
        """The registry's model is the built-in classifier's (read from its own checkpoints)."""
        return self.model_fn in (None, BUILTIN_MODEL_FN)


class EvaluationSettings(_Section):
    """The test-set evaluation of the best trial's best checkpoint."""

    evaluate_fn: str | None = Field(
        None,
        description="Your own evaluation: 'package.module:function' called as evaluate_fn(checkpoint: "
        "ddp_runtime.Checkpoint, data_path: str) -> dict[str, float], once, on a Dask worker; each metric is "
        "logged as test_<name> on the parent run and the best trial's run. Needed with your own train_fn",
    )

    @field_validator("evaluate_fn")
    @classmethod
    def _import_path(cls, value: str | None) -> str | None:
        if value is not None:
            module, _, function = value.partition(":")
            if not module or not function:
                raise ValueError(f"evaluate_fn must be 'package.module:function', got {value!r}")
        return value

    @property
    def builtin(self) -> bool:
        """The built-in classifier's evaluation (loss, accuracy, per class, the confusion matrix)."""
        return self.evaluate_fn in (None, BUILTIN_EVALUATE_FN)


class ResourceSettings(_Section):
    """Per-trial resources, like Ray Tune's resources_per_trial / gpus_per_trial."""

    ranks_per_trial: int = Field(2, ge=1, description="DDP ranks (Dask workers) per trial")
    gpus_per_rank: float = Field(0, ge=0, description="Fractions (0.5) share a GPU between 1-rank trials")
    cpus_per_rank: float | None = Field(
        None, gt=0, description="Cores reserved per rank (workers declare CPU=n)"
    )

    @model_validator(mode="after")
    def _fractional_gpus_only_alone(self) -> ResourceSettings:
        if self.ranks_per_trial > 1 and 0 < self.gpus_per_rank < 1:
            raise ValueError(
                f"gpus_per_rank={self.gpus_per_rank} with ranks_per_trial={self.ranks_per_trial}: a DDP group needs a "
                "whole GPU per rank (NCCL refuses two ranks on one GPU); use gpus_per_rank=1, or ranks_per_trial=1 "
                "to share GPUs between trials"
            )
        return self

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_rank > 0

    def resources_per_rank(self) -> dict[str, float]:
        resources: dict[str, float] = {}
        if self.gpus_per_rank:
            resources["GPU"] = self.gpus_per_rank
        if self.cpus_per_rank:
            resources["CPU"] = self.cpus_per_rank
        return resources


class DaskSettings(_Section):
    """Where trials run: an existing scheduler, or a local cluster started for the run."""

    scheduler_address: str | None = Field(None, description="tcp://host:8786; default: a local cluster")
    n_workers: int | None = Field(None, ge=1, description="Local cluster size; default: one worker per core")


class MlflowSettings(_Section):
    """Where runs are tracked and models registered."""

    tracking_uri: str | None = Field(
        None,
        description="Default: $MLFLOW_TRACKING_URI, else the local MLflow server `sweepflow run` starts (SQLite "
        "under the state dir); with --no-server, that SQLite store directly",
    )
    artifacts_destination: str | None = Field(
        None,
        description="Where the tracking server stores proxied (mlflow-artifacts:) artifacts, e.g. "
        "s3://bucket/mlflow: trainers then write checkpoints there directly. Default: <storage>/mlflow",
    )
    experiment_name: str = Field("sweepflow", description="MLflow experiment of the parent and trial runs")
    registered_model_name: str = Field(
        "sweepflow-classifier", description="Registered model the best trial becomes a version of"
    )


class SelectionSettings(_Section):
    """How the best trial is chosen, and which test metric decides the champion alias."""

    metric: str = Field("val_accuracy", description="Reported metric the best trial is chosen by (its best value)")
    mode: Literal["min", "max"] = Field("max", description="Whether a lower or higher metric is better")
    champion_metric: str = Field(
        "test_accuracy", description="Test metric that decides whether the new version becomes champion"
    )
    champion_mode: Literal["min", "max"] = Field("max", description="Whether a lower or higher one is better")


class PipelineConfig(_Section):
    """Everything one pipeline run needs. Defaults: the embedded run (digits, seed space, ASHA, 2-rank DDP)."""

    data: DataSettings = Field(default_factory=DataSettings)
    sweep: SweepSettings = Field(default_factory=SweepSettings)
    scheduler: SchedulerSettings = Field(default_factory=AshaSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    resources: ResourceSettings = Field(default_factory=ResourceSettings)
    dask: DaskSettings = Field(default_factory=DaskSettings)
    mlflow: MlflowSettings = Field(default_factory=MlflowSettings)
    selection: SelectionSettings = Field(default_factory=SelectionSettings)
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)
    project_dir: str | None = Field(
        None,
        description="Your project's directory: put on the import path of the flow and of every Dask worker while "
        "your functions (train_fn, prepare_fn, model_fn, evaluate_fn) run. Default: the directory of "
        "`sweepflow run --config FILE`'s file; a remote cluster's workers need the same path (a shared mount), "
        "else install your package on them",
    )
    state_dir: str | None = Field(None, description="Default: $SWEEPFLOW_HOME or ~/.sweepflow")
    storage: str | None = Field(
        None,
        description="Shared storage root (s3://bucket/prefix) for the dataset cache (<storage>/datasets) and, "
        "behind an MLflow server that proxies artifacts to <storage>/mlflow, checkpoints. Default: "
        "$SWEEPFLOW_STORAGE, else local disk under the state dir",
    )

    @model_validator(mode="after")
    def _epochs_cover_schedule(self) -> PipelineConfig:
        if self.scheduler.max_reports(self.training.epochs) > self.training.epochs:
            raise ValueError(
                f"scheduler.max_t={self.scheduler.max_t} exceeds training.epochs={self.training.epochs}: "
                "trials report once per epoch; lower max_t or raise epochs"
            )
        return self
