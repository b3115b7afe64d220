"""Credentials for the tracking server, kept out of the tracking URI: MLflow's own auth variables.

A tracking URI is stored and shown in many places (a Prefect flow parameter, MLflow params, error messages),
so an HTTP(S) URI's ``user:password@`` is moved into ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``,
which MLflow's client reads on every request, in this process; a Dask worker that talks to the server on the
flow's behalf receives them with its task (``tracking_auth_env`` / ``tracking_auth_scope``). Light on purpose
(no MLflow import): the CLI uses it before anything heavy is loaded.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from sweepflow.tasks.datasets.uris import split_userinfo

#: MLflow's own variables for a tracking server's basic auth: its client reads them on every request.
TRACKING_AUTH_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def split_tracking_credentials(tracking_uri: str) -> tuple[str, dict[str, str]]:
    """An HTTP(S) tracking URI without its ``user:password@``, and those as MLflow's auth variables
    (``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``), so the URI that clients use, errors quote and Prefect stores
    holds no secret. Other URIs come back as they are, with no variables."""
    if not tracking_uri.startswith(("http://", "https://")):
        return tracking_uri, {}
    bare, user, password = split_userinfo(tracking_uri)
    env = {
        name: value
        for name, value in zip(TRACKING_AUTH_ENV, (user, password), strict=True)
        if value is not None
    }
    return bare, env


class SecretEnv(dict[str, str]):
    """Environment variables that hold secrets, e.g. shipped to a Dask worker: ``repr`` (a log line, Dask's
    "Compute Failed" report of a task's arguments) names the variables, never their values."""

    def __repr__(self) -> str:
        return f"SecretEnv({sorted(self)})"


def tracking_auth_env() -> SecretEnv:
    """This process's MLflow auth variables (set by the entry point, or the deployment's environment): what a
    Dask worker that talks to the tracking server on the flow's behalf needs (see ``tracking_auth_scope``)."""
    return SecretEnv({name: os.environ[name] for name in TRACKING_AUTH_ENV if os.environ.get(name)})


@contextlib.contextmanager
def tracking_auth_scope(env: Mapping[str, str]) -> Iterator[None]:
    """MLflow's auth variables set to ``env`` for the block (on a Dask worker), then restored."""
    previous = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
