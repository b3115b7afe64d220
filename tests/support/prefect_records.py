"""Reading what a Prefect server recorded of a flow run, in tests.

The server's task-run recorder writes task runs and their states in batches, up to a second after the flow sent
them (``sweepflow.infra.services.local.PREFECT_SERVER_SETTINGS``): a test that reads them right after its run waits
for them here, bounded, as a user refreshing the UI would."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

WAIT_S = 30.0
FINAL_STATE_TYPES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
T = TypeVar("T")


def recorded(read: Callable[[], T], ready: Callable[[T], bool], what: str, *, timeout: float = WAIT_S) -> T:
    """``read()``'s answer once ``ready`` accepts it, read again every 0.2 s for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        answer = read()
        if ready(answer):
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not recorded within {timeout:g} s; last read: {answer}")
        time.sleep(0.2)


def final_task_run(client: Any, task_run_id: Any, *, timeout: float = WAIT_S) -> Any:
    """The task run, once the server holds it in a final state."""
    from prefect.exceptions import ObjectNotFound

    def read() -> Any:
        try:
            return client.read_task_run(task_run_id)
        except ObjectNotFound:
            return None

    return recorded(
        read,
        lambda t: t is not None and t.state is not None and t.state.is_final(),
        f"task run {task_run_id} in a final state",
        timeout=timeout,
    )


def final_task_runs(client: Any, flow_run_id: Any, *, at_least: int, timeout: float = WAIT_S) -> list[Any]:
    """The flow run's task runs, once the server holds at least ``at_least`` of them, each in a final state."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    return recorded(
        lambda: client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))),
        lambda runs: len(runs) >= at_least and all(t.state is not None and t.state.is_final() for t in runs),
        f"flow run {flow_run_id}: at least {at_least} task runs, each in a final state",
        timeout=timeout,
    )
