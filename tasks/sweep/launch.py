"""How a sweep starts its trials (``Sweep(launcher=...)``): as Prefect task runs, or as plain threads.

    PrefectTasks()      each trial a ``train-trial`` task run of the flow run the sweep is in (the default)
    Threads()           each trial a thread of this process: no Prefect at all (tests; a notebook)

A launcher hands back a future per trial: ``add_done_callback(fn)`` calls ``fn(future)`` once it has ended,
``result()`` is the trial's ``TrialResult`` (or raises the trial's own error). The sweep's decisions (which trial
starts, when it stops) do not depend on which launcher runs them.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any, Protocol

from sweepflow.tasks.sweep.runtime import SweepRuntime
from sweepflow.tasks.sweep.template import SweepTrial


class TrialLauncher(Protocol):
    """Starts a trial's work (``trial.train_trial``) and hands back its future."""

    def submit(self, spec: SweepTrial, rt: SweepRuntime) -> Any:
        """Start the trial; return its future (``add_done_callback``, ``result``)."""
        ...

    def wait(self, future: Any) -> None:
        """Block until the trial's future has ended (the sweep waits for running trials when it stops)."""
        ...

    def ended(self, future: Any) -> None:
        """The trial's result has been read: let go of what was kept for it."""
        ...

    def close(self) -> None:
        """The sweep is over (every trial has ended)."""
        ...


class PrefectTasks:
    """Each trial a ``train-trial`` task run of the current flow run (Prefect's thread pool runs it)."""

    def submit(self, spec: SweepTrial, rt: SweepRuntime) -> Any:
        from prefect.utilities.annotations import quote

        from sweepflow.tasks.sweep.trial import run_trial

        # quote(): Prefect would otherwise look for earlier tasks' results among the arguments (by object
        # identity: a shared int or string is enough) and draw dependency arrows between independent trials.
        return run_trial.submit(quote(spec), quote(rt))

    def wait(self, future: Any) -> None:
        future.wait()

    def ended(self, future: Any) -> None:
        from sweepflow.tasks.compat import forget_ended_task_run

        forget_ended_task_run(future.task_run_id)

    def close(self) -> None:
        return None  # the flow run owns its task runner


class Threads:
    """Each trial a thread of this process, logging to ``logger``: the sweep runs with no Prefect server or flow
    run (as an Optuna study runs in memory). ``max_workers``: the pool's size; the sweep's slots already bound
    how many trials run at once, so the default (64) only caps a paused trial's waits."""

    def __init__(self, *, logger: logging.Logger | None = None, max_workers: int = 64) -> None:
        self.logger = logger or logging.getLogger("sweepflow.trials")
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="trial")

    def submit(self, spec: SweepTrial, rt: SweepRuntime) -> concurrent.futures.Future[Any]:
        from sweepflow.tasks.sweep.trial import train_trial

        return self._pool.submit(train_trial, spec, rt, self.logger)

    def wait(self, future: concurrent.futures.Future[Any]) -> None:
        concurrent.futures.wait([future])

    def ended(self, future: concurrent.futures.Future[Any]) -> None:
        return None  # a finished future holds nothing the pool keeps

    def close(self) -> None:
        self._pool.shutdown(wait=True)
