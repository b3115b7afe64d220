"""Where the stack's services listen and how they authenticate their clients (``sweepflow stack up --host``).

The services that other machines need (S3, MLflow, Prefect API, Dask scheduler and workers) bind ``host``;
health endpoints, the Dask dashboards and the Prefect worker's health server stay on 127.0.0.1. Authentication is
passed through: Prefect's API auth string (server env, and ``stack.env`` for its clients: never argv or logs),
MLflow's basic-auth app (admin from the server's env, clients' ``MLFLOW_TRACKING_USERNAME/PASSWORD`` in
``stack.env``) and ``--allowed-hosts``, Dask TLS (scheduler, workers, and the clients' Dask config in
``stack.env``). A host other than 127.0.0.1 without Prefect auth, MLflow auth and Dask TLS is refused before
anything starts, unless ``insecure``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import os

from sweepflow.infra.services import supervisor as services

HOST = services.LOOPBACK  # the default bind address of every service
# Internal endpoints (health checks, Dask dashboards, the Prefect worker's health server) stay here always.
INTERNAL = services.LOOPBACK


@dataclasses.dataclass(frozen=True)
class Exposure:
    """Where the stack's services listen and how they authenticate their clients (see the module doc)."""

    host: str = HOST
    prefect_auth_string: str | None = dataclasses.field(default=None, repr=False)  # "user:password"
    mlflow_auth: str | None = dataclasses.field(default=None, repr=False)  # "user:password": basic-auth app
    mlflow_allowed_hosts: str | None = None  # mlflow server --allowed-hosts (Host header check)
    tls_ca_file: str | None = None  # Dask TLS: all three or none
    tls_cert: str | None = None
    tls_key: str | None = None
    insecure: bool = False  # accept a non-loopback host without Prefect auth / Dask TLS

    @property
    def tls(self) -> bool:
        return self.tls_ca_file is not None

    def check(self) -> None:
        """Refuse a configuration that cannot work or would expose the services unprotected (ValueError)."""
        if self.host in ("", "0.0.0.0", "::", "*"):
            raise ValueError(
                f"--host {self.host!r} is a wildcard, but the stack also gives this address to its clients "
                "(stack.env, Dask's advertised addresses): pass this machine's address that the other machines "
                "reach, e.g. --host \"$(hostname -I | cut -d' ' -f1)\""
            )
        try:
            services.free_port(self.host)
        except OSError as exc:
            raise ValueError(
                f"--host {self.host}: cannot listen there ({exc.strerror}); give an address of this machine "
                "(`hostname -I` lists them)"
            ) from None
        tls_files = {
            "--tls-ca-file": self.tls_ca_file,
            "--tls-cert": self.tls_cert,
            "--tls-key": self.tls_key,
        }
        given = [flag for flag, path in tls_files.items() if path]
        if given and len(given) != len(tls_files):
            missing = sorted(set(tls_files) - set(given))
            raise ValueError(
                f"Dask TLS needs --tls-ca-file, --tls-cert and --tls-key together; add {missing}"
            )
        for flag, path in tls_files.items():
            if path and not os.path.isfile(path):
                raise ValueError(f"{flag} {path}: no such file; give the PEM file's path")
        for flag, value in [
            ("--prefect-auth-file", self.prefect_auth_string),
            ("--mlflow-auth-file", self.mlflow_auth),
        ]:
            if value is not None and ":" not in value:
                raise ValueError(f"the {flag} file must hold USER:PASSWORD on its first line")
        if self.mlflow_auth and not installed("flask_wtf"):
            raise ValueError(
                "MLflow's basic-auth app (--mlflow-auth-file) needs Flask-WTF, which is not installed: "
                "install it with `.venv/bin/python -m pip install 'mlflow[auth]'`"
            )
        if not is_loopback(self.host) and not self.insecure:
            missing = [
                what
                for what, ok in [
                    ("--prefect-auth-file FILE (Prefect API basic auth)", self.prefect_auth_string),
                    ("--mlflow-auth-file FILE (MLflow's basic-auth app)", self.mlflow_auth),
                    ("--tls-ca-file/--tls-cert/--tls-key (Dask TLS)", self.tls),
                ]
                if not ok
            ]
            if missing:
                raise ValueError(
                    f"--host {self.host} makes the services reachable from other machines, but without "
                    f"{' and '.join(missing)} anyone who reaches them can run code on this machine; add "
                    "them (see docs/exposing.md), or pass --insecure on a trusted network"
                )


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def url_host(host: str) -> str:
    """``host`` as it goes into a URL (IPv6 literals in brackets)."""
    return f"[{host}]" if ":" in host else host
