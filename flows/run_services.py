"""Which services a run uses: the one place that decides it, for ``sweepflow run`` and for ``sweepflow.tune``.

A service the user configured is used as given (PREFECT_API_URL or a Prefect set up in this process, a tracking
URI, a Dask scheduler address, from the environment or the config); each one not configured is the state dir's
background service, started (or reused) in parallel: a Prefect server, an MLflow server, a local Dask cluster (not
for GPU runs: a GPU cluster is the user's, given by address). The settings are read once, at the entry point,
and passed in.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sweepflow.flows.settings import Settings


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
    from sweepflow.infra.services.local import use_local_services
    from sweepflow.tasks import WORKER_PRELOAD

    tracking_uri = tracking_uri or settings.tracking_uri
    scheduler_address = scheduler_address or settings.scheduler_address
    ours = not prefect_configured(settings)  # no Prefect API given: the state dir's server
    started = use_local_services(
        state_dir,
        prefect=ours,
        mlflow=not tracking_uri,
        dask=not scheduler_address and not use_gpu,
        worker_preload=[WORKER_PRELOAD],  # the same for every caller: the state dir's one cluster serves all
        n_workers=n_workers,
        code_files=code_files,
        extra=extra,
        idle_stop_s=settings.services_idle_minutes * 60,
    )
    if ours and "prefect" in sys.modules:
        # Prefect read its settings from the environment when it was first imported (a script that imports it,
        # or a library that does, before sweepflow): without this its flows would go to a temporary server of
        # their own, not to the one just started.
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()
    return RunServices(
        tracking_uri=tracking_uri or started.get("mlflow"),
        scheduler_address=scheduler_address or started.get("dask"),
        started=started,
    )


#: How long ``sweepflow run --no-server`` waits for Prefect's temporary server when
#: PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS is not set. Prefect's own default (20 s) is shorter than its
#: start-up (imports, database migrations) takes on a loaded machine; the background services get 120 s too
#: (``sweepflow.infra.services.supervisor.START_TIMEOUT_S``).
TEMPORARY_SERVER_TIMEOUT_S = 120


class TemporaryServerError(RuntimeError):
    """Prefect's temporary server did not come up: the message says what happened and what to do."""


def temporary_server_timeout(settings: Settings) -> int:
    """The start-up bound of ``--no-server``'s temporary server, in whole seconds (Prefect's setting is one)."""
    if settings.prefect_startup_timeout is None:
        return TEMPORARY_SERVER_TIMEOUT_S
    try:
        bound = int(settings.prefect_startup_timeout)
    except ValueError:
        bound = 0
    if bound < 1:
        raise ValueError(
            f"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS={settings.prefect_startup_timeout!r} is not a "
            "whole number of seconds of at least 1; set it to e.g. 300, or unset it "
            f"(default {TEMPORARY_SERVER_TIMEOUT_S})"
        )
    return bound


def use_temporary_prefect(settings: Settings) -> None:
    """For ``sweepflow run --no-server`` without a configured Prefect API: start Prefect's temporary server now,
    before the flow, and wait for it up to ``temporary_server_timeout`` (Prefect would otherwise start it at the
    flow's first API call, give up after its own 20 s and fail the run with a traceback). The flow's clients then
    use this server (Prefect keeps one per process, stopped when the process exits). It runs with
    ``PREFECT_SERVER_SETTINGS`` (no telemetry), put into this process's environment, which it inherits.
    Raises ``TemporaryServerError`` if it does not answer in time or exits, ``ValueError`` for a bad bound."""
    if prefect_configured(settings):
        return  # PREFECT_API_URL (or a harness): that server is used, nothing is started
    from sweepflow.infra.services.local import PREFECT_SERVER_SETTINGS
    from sweepflow.tasks.compat import start_temporary_prefect_server

    bound = temporary_server_timeout(settings)
    os.environ.update(PREFECT_SERVER_SETTINGS)
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_ENABLED

    if not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return  # Prefect itself says that it needs PREFECT_API_URL, at the flow's start
    from sweepflow.infra.services.prefect_server import copy_prefect_template, skip_block_registration

    started = time.monotonic()
    # A new database starts as a copy of the migrated template a local server made (when there is one): the
    # server then skips Prefect's ~100 migrations and its block registration (17-18 -> 7.5 CPU-s to answer here).
    copied = copy_prefect_template()
    try:
        with skip_block_registration() if copied else contextlib.nullcontext():
            start_temporary_prefect_server(bound)
    except ChildProcessError as exc:
        what = f"exited with code {exc.errno} before it answered (its output is above)"
    except TimeoutError:
        waited = time.monotonic() - started
        what = f"did not answer within {bound} s (waited {waited:.0f} s; the machine is probably busy)"
    else:
        return
    raise TemporaryServerError(
        f"Prefect's temporary server (--no-server) {what}: run without --no-server, whose background "
        "services start once and are reused, or give it longer with "
        f"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=SECONDS (now {bound})"
    )
