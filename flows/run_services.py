"""Which services a run uses: the one place that decides it, for ``sweepflow run`` and for ``sweepflow.tune``.

A service the user configured is used as given (PREFECT_API_URL or a Prefect set up in this process, a tracking
URI, a Dask scheduler address, from the environment or the config); each one not configured is the state dir's
background service, started (or reused) in parallel: a Prefect server, an MLflow server, a local Dask cluster (not
for GPU runs: a GPU cluster is the user's, given by address). The settings are read once, at the entry point,
and passed in.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sweepflow.flows.config import Settings


@dataclass(frozen=True)
class RunServices:
    """Where a run's tracking and trials go (``None``: not configured, and no local service was asked for)."""

    tracking_uri: str | None
    scheduler_address: str | None
    started: Mapping[str, str] = field(default_factory=dict)  # the local services used, by name -> address


def prefect_configured(settings: Settings) -> bool:
    """A Prefect API to use: PREFECT_API_URL, or one already set up in this process (e.g. a test harness)."""
    if settings.prefect_api_url:
        return True
    if "prefect" in sys.modules:
        from prefect.settings import PREFECT_API_URL

        return bool(PREFECT_API_URL.value())
    return False


def use_run_services(
    settings: Settings,
    state_dir: str,
    *,
    tracking_uri: str | None = None,
    scheduler_address: str | None = None,
    use_gpu: bool,
    n_workers: int | None = None,
    code_files: Sequence[str] = (),
    extra: Mapping[str, Callable[[], str]] | None = None,
) -> RunServices:
    """The run's services: ``tracking_uri`` and ``scheduler_address`` as configured (the config's, else the
    environment's), the state dir's background services for the rest (see the module's docstring), plus the
    ``extra`` services asked for (the CLI's warm launcher). Points this process's Prefect client at the Prefect
    server it starts."""
    from sweepflow.services.local import use_local_services
    from sweepflow.tasks import WORKER_PRELOAD

    tracking_uri = tracking_uri or settings.tracking_uri
    scheduler_address = scheduler_address or settings.scheduler_address
    started = use_local_services(
        state_dir,
        prefect=not prefect_configured(settings),
        mlflow=not tracking_uri,
        dask=not scheduler_address and not use_gpu,
        worker_preload=[WORKER_PRELOAD],  # the same for every caller: the state dir's one cluster serves all
        n_workers=n_workers,
        code_files=code_files,
        extra=extra,
    )
    return RunServices(
        tracking_uri=tracking_uri or started.get("mlflow"),
        scheduler_address=scheduler_address or started.get("dask"),
        started=started,
    )
