"""The machine-dependent settings (``Settings``), read from the environment once, at the entry point, and the
pipeline config's defaults filled from them (``resolve_settings``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from sweepflow.flows.config import PipelineConfig

#: Environment variables read (once, by ``Settings.from_env``) to fill machine-dependent settings. S3
#: credentials and endpoint come from the standard AWS chain (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL_S3, ...),
#: which s3fs, boto3 and MLflow all honour.
SETTINGS_ENV = ("SWEEPFLOW_HOME", "SWEEPFLOW_STORAGE", "MLFLOW_TRACKING_URI", "DASK_SCHEDULER_ADDRESS")

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
