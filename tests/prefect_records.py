"""Reading what a Prefect server recorded of a flow run, in tests.

The server's task-run recorder writes task runs and their states in batches, up to a second after the flow sent
them (``sweepflow.services.local.PREFECT_SERVER_SETTINGS``): a test that reads them right after its run waits
for them here, bounded, as a user refreshing the UI would."""

from __future__ import annotations

import time
from typing import Any

WAIT_S = 30.0


def final_task_run(client: Any, task_run_id: Any, *, timeout: float = WAIT_S) -> Any:
    """The task run, once the server holds it in a final state."""
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout
    while True:
        try:
            task_run = client.read_task_run(task_run_id)
        except ObjectNotFound:
            task_run = None
        if task_run is not None and task_run.state is not None and task_run.state.is_final():
            return task_run
        if time.monotonic() > deadline:
            raise AssertionError(
                f"task run {task_run_id} not recorded in a final state within {timeout:g} s: {task_run}"
            )
        time.sleep(0.2)


def final_task_runs(client: Any, flow_run_id: Any, *, at_least: int, timeout: float = WAIT_S) -> list[Any]:
    """The flow run's task runs, once the server holds at least ``at_least`` of them, each in a final state."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout
    while True:
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
        if len(task_runs) >= at_least and all(t.state is not None and t.state.is_final() for t in task_runs):
            return task_runs
        if time.monotonic() > deadline:
            states = [(t.name, t.state_name) for t in task_runs]
            raise AssertionError(
                f"flow run {flow_run_id}: {len(task_runs)} task runs recorded within {timeout:g} s, "
                f"expected at least {at_least}, all final: {states}"
            )
        time.sleep(0.2)
