"""The credentials a pipeline config may hold, taken out before it becomes a Prefect flow run's parameters
(``split_credentials``, at the entry point) and put back in the flow (``with_credentials``): no credential is
stored, logged or shown as a parameter."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from sweepflow.flows.config import PipelineConfig
from sweepflow.flows.settings import Settings
from sweepflow.tasks.datasets import DataCredentials
from sweepflow.tasks.datasets.uris import redact
from sweepflow.tasks.tracking.credentials import split_tracking_credentials

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
