"""The pre-flight checks that need Dask's client or MLflow's own rules: the adapters' half of ``checks`` (which
imports neither, so the CLI and its tests use it before anything heavy is loaded)."""

from __future__ import annotations

from sweepflow.tasks.checks import REACH_TIMEOUT_S, PreflightError, ServiceUnreachable
from sweepflow.tasks.datasets.uris import redact


def check_registered_model_name(name: str, *, field: str = "mlflow.registered_model_name") -> None:
    """MLflow's own rules for registered model names (checked at registration, after the whole sweep)."""
    from sweepflow.tasks.compat import mlflow_model_name_problem

    problem = mlflow_model_name_problem(name)
    if problem:
        raise PreflightError(
            field, name, f"MLflow rejects it ({problem})", "use letters, digits, '-', '_' or '.'"
        )


def check_dask_scheduler(
    address: str, *, field: str = "dask.scheduler_address", timeout_s: float = REACH_TIMEOUT_S
):
    """A connected ``distributed.Client`` of the scheduler at ``address`` (the caller closes it)."""
    from distributed import Client

    try:
        return Client(address, timeout=f"{timeout_s}s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ServiceUnreachable(
            field,
            address,
            f"no Dask scheduler answered within {timeout_s:g} s ({type(exc).__name__}: {redact(str(exc))})",
            "start it (`dask scheduler`, or `sweepflow stack up`), fix the address (tcp://host:8786), or leave it "
            "unset for a local cluster",
        ) from None
