"""The pipeline's typed configuration: one pydantic model per component, validated before any work starts.

``PipelineConfig`` is also the flow's parameter schema, so the Prefect UI shows it as a form and
``prefect deployment run ... --param`` values are validated the same way. Everything that depends on the
machine (state directory, tracking URI, scheduler address) is resolved once, at the entry point, by
``resolve_settings``; the flow's tasks each receive only their own part.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sweepflow.flows.scheduler_settings import (
    SCHEDULER_SECTIONS,
    SCHEDULER_TYPES,
    AshaSettings,
    SchedulerSettings,
)
from sweepflow.flows.section import Section as _Section
from sweepflow.tasks.datasets import DataConfig, DataCredentials
from sweepflow.tasks.datasets.uris import redact
from sweepflow.tasks.sweep.space import parse_space
from sweepflow.tasks.tracking.credentials import split_tracking_credentials

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

#: Environment variables read (once, by ``Settings.from_env``) to fill machine-dependent settings. S3
#: credentials and endpoint come from the standard AWS chain (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL_S3, ...),
#: which s3fs, boto3 and MLflow all honour.
SETTINGS_ENV = ("SWEEPFLOW_HOME", "SWEEPFLOW_STORAGE", "MLFLOW_TRACKING_URI", "DASK_SCHEDULER_ADDRESS")




#: Which dataset, from where, and how it is split: the data library's own config (frozen pydantic, extra
#: fields forbidden), so the flow passes ``cfg.data`` to ``download_dataset`` as is.
DataSettings = DataConfig


class SweepSettings(_Section):
    """The search: space (as data), sampler, budget."""

    search_space: dict[str, Any] = Field(
        default_factory=lambda: dict(SEED_SEARCH_SPACE),
        description="Hyperparameter -> domain, as data: {type: choice|grid, values: [...]}, {type: uniform|loguniform, "
        "low, high}, {type: randint|qrandint|pow2, low, high}, or a constant. Default: the Ray Tune CIFAR tutorial's",
    )
    sampler: Literal["random", "grid", "tpe"] = Field(
        "random",
        description="random (seeded), grid (exhaustive), tpe (adaptive: Optuna TPE, asks as results arrive)",
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

    @model_validator(mode="after")
    def _tpe_without_grids(self) -> SweepSettings:
        grids = parse_space(self.search_space).grid_names
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


#: How long the local services stay up unused (``Settings.services_idle_minutes``): an hour after a run, its
#: MLflow and Prefect UIs still answer; after that the services cost nothing until the next run starts them.
DEFAULT_SERVICES_IDLE_MINUTES = 60.0


@dataclass(frozen=True)
class Settings:
    """The machine-dependent settings, read from the environment once, at the entry point (the CLI, or the
    flow's start under a deployment), and passed down from there: nothing below the entry point reads them."""

    home: str  # $SWEEPFLOW_HOME (default ~/.sweepflow), absolute: state, data cache, local services
    storage: str | None = None  # $SWEEPFLOW_STORAGE: shared storage root (s3://bucket/prefix)
    tracking_uri: str | None = None  # $MLFLOW_TRACKING_URI
    scheduler_address: str | None = None  # $DASK_SCHEDULER_ADDRESS
    prefect_api_url: str | None = None  # $PREFECT_API_URL (Prefect reads it itself; the CLI needs to know)
    stack_dir: str | None = None  # $SWEEPFLOW_STACK_DIR: the stack `infra/stack` manages (set by stack.env)
    # $SWEEPFLOW_STACK_DATABASE_URL: the PostgreSQL server of the stack's Prefect and MLflow databases (it holds
    # a password: never shown, see sweepflow.infra.services.database)
    stack_database_url: str | None = field(default=None, repr=False)
    # $PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, as given (checked where it is used): how long
    # `sweepflow run --no-server` waits for Prefect's temporary server (sweepflow.flows.run_services)
    prefect_startup_timeout: str | None = None
    # $SWEEPFLOW_SERVICES_IDLE_MINUTES: the local services stop themselves once unused for this long (0: never);
    # see sweepflow.infra.services.idle
    services_idle_minutes: float = DEFAULT_SERVICES_IDLE_MINUTES

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            home=os.path.abspath(
                os.path.expanduser(env.get("SWEEPFLOW_HOME") or os.path.join("~", ".sweepflow"))
            ),
            storage=(env.get("SWEEPFLOW_STORAGE") or "").rstrip("/") or None,
            tracking_uri=env.get("MLFLOW_TRACKING_URI") or None,
            scheduler_address=env.get("DASK_SCHEDULER_ADDRESS") or None,
            prefect_api_url=env.get("PREFECT_API_URL") or None,
            stack_dir=env.get("SWEEPFLOW_STACK_DIR") or None,
            stack_database_url=env.get("SWEEPFLOW_STACK_DATABASE_URL") or None,
            prefect_startup_timeout=env.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or None,
            services_idle_minutes=_idle_minutes(env.get("SWEEPFLOW_SERVICES_IDLE_MINUTES")),
        )


def _idle_minutes(value: str | None) -> float:
    if not value:
        return DEFAULT_SERVICES_IDLE_MINUTES
    try:
        minutes = float(value)
    except ValueError:
        minutes = -1.0
    if not minutes >= 0 or minutes == float("inf"):
        raise ValueError(
            f"SWEEPFLOW_SERVICES_IDLE_MINUTES={value!r} is not a number of minutes >= 0; set e.g. 60 (the "
            "local services stop themselves after an hour unused), 0 (they stay up), or unset it"
        )
    return minutes


def resolve_settings(
    config: PipelineConfig, settings: Settings | None = None, *, env: Mapping[str, str] | None = None
) -> PipelineConfig:
    """Fill the config's machine-dependent defaults from ``settings`` (default: read from ``env`` or the
    process environment), once, at the entry point. Values set in the config win."""
    settings = settings or Settings.from_env(env)
    state_dir = os.path.abspath(os.path.expanduser(config.state_dir or settings.home))
    tracking_uri = (
        config.mlflow.tracking_uri
        or settings.tracking_uri
        or f"sqlite:///{os.path.join(state_dir, 'mlflow.db')}"
    )
    storage = (config.storage or "").rstrip("/") or settings.storage
    cache_dir = config.data.cache_dir or (
        f"{storage}/datasets" if storage else os.path.join(state_dir, "data")
    )
    artifacts_destination = config.mlflow.artifacts_destination or (f"{storage}/mlflow" if storage else None)
    scheduler_address = config.dask.scheduler_address or settings.scheduler_address
    return config.model_copy(
        update={
            "state_dir": state_dir,
            "storage": storage,
            "data": config.data.model_copy(
                update={
                    "cache_dir": cache_dir,
                    "staging_dir": config.data.staging_dir
                    or os.path.join(state_dir, "data", "remote-staging"),
                }
            ),
            "mlflow": config.mlflow.model_copy(
                update={"tracking_uri": tracking_uri, "artifacts_destination": artifacts_destination}
            ),
            "dask": config.dask.model_copy(update={"scheduler_address": scheduler_address}),
        }
    )


# ------------------------------------------------------------------------------------------------ credentials

#: Where a credential in a URI cannot be carried safely, and what to do instead.
_NO_CREDENTIALS = {
    "dask.scheduler_address": "a Dask address has no place for credentials: secure the scheduler with TLS "
    "(distributed.comm.tls.* in the Dask config) and give the address as tls://host:8786",
    "storage": "give S3 credentials through the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or "
    "AWS_PROFILE) and the storage as s3://bucket/prefix",
    "mlflow.artifacts_destination": "give S3 credentials through the environment (AWS_ACCESS_KEY_ID / "
    "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) and the destination as s3://bucket/prefix",
}

@dataclass(frozen=True, repr=False)
class Credentials:
    """The secrets ``split_credentials`` took out of a PipelineConfig (``repr`` shows none of them)."""

    tracking_env: Mapping[str, str] = field(default_factory=dict)  # MLFLOW_TRACKING_USERNAME / _PASSWORD
    data: DataCredentials = field(default_factory=DataCredentials)  # data.source's user:password@, options

    def __repr__(self) -> str:
        return "Credentials(<hidden>)"

    def install(self) -> None:
        """MLflow's auth variables into this process's environment, for the flow it runs: MLflow's client reads
        them there on every request. The data credentials go to the flow explicitly (``with_credentials``)."""
        os.environ.update(self.tracking_env)


def _refuse_credentials(values: Mapping[str, str | None]) -> None:
    for name, value in values.items():
        if value and redact(value) != value:
            fix = _NO_CREDENTIALS[name.split(" ", 1)[0]]
            raise ValueError(
                f"{name}={redact(value)!r} holds credentials, which it cannot carry safely; {fix}"
            )


def split_credentials(config: PipelineConfig, settings: Settings) -> tuple[PipelineConfig, Credentials]:
    """``config`` with no credential left in it, and the credentials. The config becomes the flow run's
    parameters, which Prefect stores and shows, so the CLI hands the flow this one as its parameter and the
    credentials beside it, never a parameter (``with_credentials`` puts the data ones back in the flow). An
    HTTP(S) tracking URI's ``user:password@`` becomes MLflow's MLFLOW_TRACKING_USERNAME / _PASSWORD; the data
    source's and storage options stay in the process. Raises ValueError naming the field where a credential
    has no safe place (a Dask address, the S3 storage and artifact URIs, a database tracking URI)."""
    _refuse_credentials(
        {
            "dask.scheduler_address (or DASK_SCHEDULER_ADDRESS)": config.dask.scheduler_address
            or settings.scheduler_address,
            "storage (or SWEEPFLOW_STORAGE)": config.storage or settings.storage,
            "mlflow.artifacts_destination": config.mlflow.artifacts_destination,
        }
    )
    tracking_uri, tracking_env = config.mlflow.tracking_uri, {}
    if tracking_uri and redact(tracking_uri) != tracking_uri:
        tracking_uri, tracking_env = split_tracking_credentials(tracking_uri)
        if not tracking_env:
            raise ValueError(
                f"mlflow.tracking_uri={redact(tracking_uri)!r} holds credentials, and the config is stored as the "
                "Prefect flow run's parameters; set this URI in MLFLOW_TRACKING_URI instead (read by the process "
                "that runs the flow, never stored)"
            )
    data, data_secrets = config.data.without_credentials()
    public = config.model_copy(
        update={"mlflow": config.mlflow.model_copy(update={"tracking_uri": tracking_uri}), "data": data}
    )
    return public, Credentials(tracking_env, data_secrets)


def with_credentials(cfg: PipelineConfig, credentials: Credentials) -> PipelineConfig:
    """The flow's side of ``split_credentials``, on its resolved config: the data ``credentials`` its entry point
    took out (none for a deployment's run: ``Credentials()``) put back, and an HTTP(S) tracking URI's
    ``user:password@`` (from a deployment's parameters or MLFLOW_TRACKING_URI) moved into MLflow's auth
    variables, so no URI the flow uses, logs or shows holds one."""
    _refuse_credentials(
        {
            "dask.scheduler_address (or DASK_SCHEDULER_ADDRESS)": cfg.dask.scheduler_address,
            "storage (or SWEEPFLOW_STORAGE)": cfg.storage,
            "mlflow.artifacts_destination": cfg.mlflow.artifacts_destination,
        }
    )
    tracking_uri, tracking_env = split_tracking_credentials(cfg.mlflow.tracking_uri or "")
    os.environ.update(tracking_env)
    data = cfg.data.with_credentials(credentials.data)
    return cfg.model_copy(
        update={"mlflow": cfg.mlflow.model_copy(update={"tracking_uri": tracking_uri or None}), "data": data}
    )


def config_problem(error: Mapping[str, Any]) -> str:
    """One of pydantic's errors as ``key: reason``, the key as a user writes it: a scheduler's type is the value
    of ``scheduler.type``, not a level of keys (pydantic puts the tagged union's tag in the location)."""
    parts = [str(part) for part in error["loc"]]
    reason = str(error["msg"]).removeprefix("Value error, ")
    if len(parts) >= 2 and parts[0] == "scheduler" and parts[1] in SCHEDULER_TYPES:
        kind = parts.pop(1)
        if error["type"] == "extra_forbidden":
            reason = f"not a setting of scheduler.type={kind!r} ({SCHEDULER_SECTIONS[kind].__doc__.split(':')[0]})"
    field = ".".join(parts)
    return f"{field}: {reason}" if field else reason


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings (values parsed as YAML: numbers, bools, lists, dicts)."""
    import yaml

    result = {k: v for k, v in raw.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects key=value (e.g. sweep.num_samples=4), got {item!r}")
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        node[parts[-1]] = yaml.safe_load(text)
    return result


def load_config_file(path: str | os.PathLike[str] | None, overrides: list[str] = ()) -> PipelineConfig:  # type: ignore[assignment]
    """A ``PipelineConfig`` from a YAML file (``sweepflow run --config FILE``, a project's deployment) and
    ``key=value`` overrides. Paths in the file are relative to the file: ``project_dir`` (default: the file's
    directory) and a local ``data.source``. Raises ValueError saying what is wrong (pydantic's field and reason)."""
    import yaml

    raw: dict[str, Any] = {}
    if path:
        with open(path) as f:
            try:
                raw = yaml.safe_load(f) or {}
            except yaml.YAMLError as exc:  # says where: line and column
                raise ValueError(f"{path} is not valid YAML: {exc}; fix the file's syntax") from None
        if not isinstance(raw, dict):
            raise ValueError(
                f"{path} must hold a mapping of PipelineConfig sections (data:, sweep:, ...), got a {type(raw).__name__}"
            )
        base = os.path.dirname(os.path.abspath(path))
        raw = dict(raw)
        raw["project_dir"] = os.path.join(base, os.path.expanduser(str(raw.get("project_dir") or ".")))
        raw["project_dir"] = os.path.normpath(raw["project_dir"])
        data = raw.get("data")
        source = data.get("source") if isinstance(data, dict) else None
        if isinstance(source, str) and "://" not in source and not os.path.isabs(os.path.expanduser(source)):
            raw["data"] = {**data, "source": os.path.normpath(os.path.join(base, source))}
    try:
        return PipelineConfig.model_validate(apply_overrides(raw, list(overrides)))
    except yaml.YAMLError as exc:  # a --set value that is not YAML
        raise ValueError(f"a --set value is not valid YAML: {exc}") from None
