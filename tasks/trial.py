"""One trial = one Prefect task run that drives one ddp_runtime DDP group on the Dask cluster.

The task is thin: it opens the trial's MLflow child run, runs ``TorchTrainer.fit()`` with an ``on_report``
callback that logs each report to MLflow and asks the shared trial scheduler (ASHA) whether to go on, and
closes the run with the trial's status. Checkpoints are written straight into the child run's artifact
location when trainers can reach it (local store, or s3:// artifact roots), so there is no second copy.

Live objects (the Dask client, the scheduler, the tracker) are not task parameters: they live in a
``SweepRuntime`` registered under an id for the duration of the sweep, and tasks receive the id.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from distributed import Client
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from sweepflow.tasks.sweep.schedulers import STOP, TrialScheduler
from sweepflow.tasks.tracking.runs import RunTracker, RunWriter, direct_storage_uri

import ddp_runtime as train
from ddp_runtime.torch import TorchTrainer

COMPLETED, STOPPED, FAILED = "COMPLETED", "STOPPED", "FAILED"
_SCHEDULED_AFTER_S = 1.0  # a trial queued longer than this shows as SCHEDULED in MLflow until it starts
NOT_STARTED = "NOT_STARTED"  # queued, then the sweep's time budget ran out before it got a slot
_MLFLOW_STATUS = {COMPLETED: "FINISHED", STOPPED: "KILLED", FAILED: "FAILED"}


@dataclass(frozen=True)
class TrialSpec:
    """What one trial runs (plain data: it is the Prefect task's parameter)."""

    trial_id: str
    index: int  # the trial's number: trials start in this order
    name: str
    params: dict[str, Any]  # the sampled hyperparameters
    train_fn: str  # "module:function"
    train_loop_config: dict[str, Any]  # base config + params + data path
    num_ranks: int
    resources_per_rank: dict[str, float]
    use_gpu: bool
    selection_metric: str
    selection_mode: str
    max_reports: int  # the scheduler's max_t: a stop there means the trial is complete
    max_failures: int = 0


@dataclass
class SweepProgress:
    """Counts and best-so-far across trials; every change is logged as one line."""

    metric: str
    mode: str
    total: int
    log: Callable[[str], None]
    started_at: float = field(default_factory=time.monotonic)
    running: set[str] = field(default_factory=set)
    finished: dict[str, str] = field(default_factory=dict)
    best: tuple[float, str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _better(self, value: float) -> bool:
        return self.best is None or (value > self.best[0] if self.mode == "max" else value < self.best[0])

    def update(
        self, trial_id: str, *, metrics: dict[str, Any] | None = None, status: str | None = None
    ) -> None:
        with self._lock:
            if status is None:
                self.running.add(trial_id)
            else:
                self.running.discard(trial_id)
                self.finished[trial_id] = status
            value = (metrics or {}).get(self.metric)
            if isinstance(value, int | float) and self._better(float(value)):
                self.best = (float(value), trial_id)
            line = self.line()
        self.log(line)

    def line(self) -> str:
        statuses = list(self.finished.values())
        pending = self.total - len(self.running) - len(self.finished)
        best = f"{self.metric}={self.best[0]:.4f} ({self.best[1]})" if self.best else "-"
        return (
            f"[{time.monotonic() - self.started_at:6.1f}s] trials: {len(self.running)} running, "
            f"{statuses.count(STOPPED)} stopped early, {statuses.count(COMPLETED)} completed, "
            f"{statuses.count(FAILED)} failed, {pending} pending | best {best}"
        )


class _Slot:
    def __init__(self, slots: TrialSlots) -> None:
        self._slots = slots
        self._held = True

    def release(self) -> None:
        """Give the slot back (idempotent)."""
        self._slots._give_back(self)


class TrialSlots:
    """At most ``limit`` trials train at once, started in their order (turn 0, 1, 2, ...).

    A trial holds its slot from its start until its final report is answered (ASHA stopped it, or it reached
    max_t, or the time budget ran out), or until its task ends: after a final verdict its group only tears
    down, so the next trial, already queued with its MLflow run open, starts at once. Its group's reservation
    waits on the Dask scheduler for the workers the finishing group is about to free. Turns keep the start
    order that of the trials' numbers whichever task thread gets here first; a trial that ends before taking
    its turn forfeits it, so the ones after it do not wait forever.
    """

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._next_turn = 0
        self._forfeited: set[int] = set()
        self._cond = threading.Condition()
        self.acquired = 0  # slots taken so far (trials started)
        self.on_acquire: Callable[[], None] | None = None  # e.g. wakes the sweep to queue the next trial

    def acquire(self, turn: int, *, timeout: float | None = None) -> _Slot | None:
        """Wait (at most ``timeout`` seconds; None: for ever) for this turn and a free slot."""
        with self._cond:

            def ready() -> bool:
                return self._free > 0 and self._next_turn == turn

            if not self._cond.wait_for(ready, timeout):
                return None
            self._free -= 1
            self.acquired += 1
            self._advance()
        if self.on_acquire is not None:
            self.on_acquire()
        return _Slot(self)

    def _give_back(self, slot: _Slot) -> None:
        with self._cond:
            if slot._held:
                slot._held = False
                self._free += 1
                self._cond.notify_all()

    def forfeit(self, turn: int) -> None:
        """The trial with this turn will not start (it failed before it got a slot)."""
        with self._cond:
            self._forfeited.add(turn)
            if turn == self._next_turn:
                self._advance(taken=False)

    def _advance(self, *, taken: bool = True) -> None:
        if taken or self._next_turn in self._forfeited:
            self._forfeited.discard(self._next_turn)
            self._next_turn += 1
        while self._next_turn in self._forfeited:
            self._forfeited.discard(self._next_turn)
            self._next_turn += 1
        self._cond.notify_all()


@dataclass
class SweepRuntime:
    client: Client
    slots: TrialSlots
    scheduler: TrialScheduler
    tracker: RunTracker
    parent_run_id: str
    progress: SweepProgress
    staging_dir: str  # for checkpoints when the artifact store is proxied by the tracking server
    deadline: float | None = None  # time.monotonic() after which running trials are stopped
    storage_options: dict[str, Any] | None = None
    artifacts_destination: str | None = None  # the tracking server's --artifacts-destination, when known
    writers: list[RunWriter] = field(default_factory=list)  # the child runs' writers, joined by the sweep

    def join_writers(self) -> None:
        """Wait for every child run's queued MLflow writes; raise if any of them failed."""
        errors = []
        for writer in self.writers:
            try:
                writer.join()
            except RuntimeError as exc:
                errors.append(str(exc))
        if errors:
            raise RuntimeError("some trial results did not reach MLflow:\n" + "\n".join(errors))


_RUNTIMES: dict[str, SweepRuntime] = {}


@contextlib.contextmanager
def registered_runtime(runtime: SweepRuntime) -> Iterator[str]:
    runtime_id = uuid.uuid4().hex
    _RUNTIMES[runtime_id] = runtime
    try:
        yield runtime_id
    finally:
        _RUNTIMES.pop(runtime_id, None)


def import_train_fn(path: str) -> Callable[..., Any]:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"training.train_fn={path!r}: cannot import {module_name!r} ({exc}); it must be importable in the flow "
            "process and on every Dask worker (install your package there, or put it on PYTHONPATH)"
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise AttributeError(f"training.train_fn={path!r}: {module_name!r} has no function {attr!r}")
    return fn


@dataclass(frozen=True)
class TrainFunction:
    """A training function named by import path and imported where it runs, on the Dask workers: the flow
    process never imports the training code (nor torch). The module is located at once, so a typo fails the
    trial before any group starts."""

    path: str

    def __post_init__(self) -> None:
        module_name = self.path.partition(":")[0]
        try:
            found = importlib.util.find_spec(module_name) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            raise ImportError(
                f"training.train_fn={self.path!r}: no module {module_name!r}; it must be importable in the flow "
                "process and on every Dask worker (install your package there, or put it on PYTHONPATH)"
            )

    def __call__(self, config: dict[str, Any]) -> Any:
        fn = import_train_fn(self.path)
        # As in Ray, a zero-argument training function simply does not see train_loop_config.
        return fn(config) if inspect.signature(fn).parameters else fn()


def _best(history: list[dict[str, Any]], metric: str, mode: str) -> float | None:
    values = [float(m[metric]) for m in history if isinstance(m.get(metric), int | float)]
    if not values:
        return None
    return max(values) if mode == "max" else min(values)


@task(name="train-trial", cache_policy=NO_CACHE, retries=0)
def run_trial(spec: TrialSpec, runtime_id: str) -> dict[str, Any]:
    """Train one trial as a DDP group; returns its summary (status, metrics, best checkpoint, MLflow run).

    The sweep submits one trial more than it runs at once: that one opens its MLflow run (status SCHEDULED)
    and waits for a slot, so a trial's Prefect task and MLflow run cost no time between two trainings."""
    task_start = time.perf_counter()
    rt = _RUNTIMES[runtime_id]
    logger = get_run_logger()
    slot = None
    try:
        # One round trip to MLflow (the run and its artifact location); every other write of the child run
        # (params, metrics, tags, status, end) goes through its background writer, in order.
        run_id, artifact_uri = rt.tracker.create_run(
            spec.name,
            parent_run_id=rt.parent_run_id,
            tags={"sweepflow.trial_id": spec.trial_id, "sweepflow.train_fn": spec.train_fn},
        )
        writer = RunWriter(rt.tracker, run_id)
        rt.writers.append(writer)
        writer.log_params(
            {**spec.params, "num_ranks": spec.num_ranks, "resources_per_rank": spec.resources_per_rank}
        )
        storage = direct_storage_uri(artifact_uri, rt.artifacts_destination)
        proxied = storage is None
        if proxied:
            storage = os.path.join(rt.staging_dir, run_id)
        mlflow_start_s = time.perf_counter() - task_start

        wait_start = time.perf_counter()
        slot = rt.slots.acquire(spec.index, timeout=_SCHEDULED_AFTER_S)
        if slot is None:  # a longer wait shows in MLflow (each status change is a request to the server)
            writer.set_status("SCHEDULED")
            slot = rt.slots.acquire(spec.index)
            writer.set_status("RUNNING")
        slot_wait_s = time.perf_counter() - wait_start
        if rt.deadline is not None and time.monotonic() > rt.deadline:
            logger.warning("%s: the sweep's time budget ran out while it was queued; not started", spec.name)
            writer.delete()  # a trial that never ran leaves no run behind
            return {"trial_id": spec.trial_id, "name": spec.name, "status": NOT_STARTED, "run_id": run_id}
        summary = _train(spec, rt, logger, writer, slot, storage, proxied)
    finally:
        if slot is None:
            rt.slots.forfeit(spec.index)
        else:
            slot.release()
    # The sweep subtracts the wait and the training from the trial's wall time: what is left is bookkeeping.
    summary["slot_wait_s"] = slot_wait_s  # queued for a slot: not overhead, the cluster was busy
    summary["phases_s"] = {"mlflow_start": round(mlflow_start_s, 4), **summary["phases_s"]}
    return summary


def _train(
    spec: TrialSpec,
    rt: SweepRuntime,
    logger: Any,
    writer: RunWriter,
    slot: _Slot,
    storage: str,
    proxied: bool,
) -> dict[str, Any]:
    run_id = writer.run_id
    rt.scheduler.on_trial_add(spec.trial_id)
    rt.progress.update(spec.trial_id)
    budget_reached = False

    def on_report(metrics: dict[str, Any]) -> bool:
        nonlocal budget_reached
        step = int(metrics.get("epoch", metrics["training_iteration"]))
        writer.log(metrics, step=step)
        decision = rt.scheduler.on_trial_result(spec.trial_id, metrics)
        if decision == STOP and metrics["training_iteration"] >= spec.max_reports:
            budget_reached = True  # the scheduler's max_t: the trial is done, not pruned (Ray: TERMINATED)
            slot.release()
            return True
        out_of_time = rt.deadline is not None and time.monotonic() > rt.deadline
        if decision == STOP or out_of_time:
            logger.info(
                "%s: stopping at report %s (%s)",
                spec.name,
                step,
                "ASHA" if decision == STOP else "time budget",
            )
            slot.release()  # the group only tears down from here: the next trial may start
            return True
        return False

    trainer = TorchTrainer(
        TrainFunction(spec.train_fn),
        train_loop_config=spec.train_loop_config,
        scaling_config=train.ScalingConfig(
            num_workers=spec.num_ranks,
            use_gpu=spec.use_gpu,
            resources_per_worker=spec.resources_per_rank or None,
        ),
        run_config=train.RunConfig(
            name="checkpoints",
            storage_path=storage,
            storage_options=rt.storage_options,
            checkpoint_config=train.CheckpointConfig(
                num_to_keep=1,  # plus the latest, always kept
                checkpoint_score_attribute=spec.selection_metric,
                checkpoint_score_order=spec.selection_mode,
            ),
            failure_config=train.FailureConfig(max_failures=spec.max_failures),
        ),
        client=rt.client,
        on_report=on_report,
    )
    error = None
    fit_start = time.perf_counter()
    try:
        result = trainer.fit()
    except train.TrainingFailedError as exc:
        result, error = exc.result, exc.result.error
    except BaseException:
        # Not a training failure (e.g. the cluster can never fit the trial): close the child run, then fail.
        rt.scheduler.on_trial_error(spec.trial_id)
        writer.finish("FAILED")
        raise
    fit_s = time.perf_counter() - fit_start
    status = (
        FAILED if error is not None else STOPPED if result.stopped_early and not budget_reached else COMPLETED
    )
    if status == FAILED:
        rt.scheduler.on_trial_error(spec.trial_id)
        writer.set_tags({"sweepflow.error": str(error)[:5000]})
        logger.error("%s failed: %s", spec.name, error)
    else:
        rt.scheduler.on_trial_complete(spec.trial_id, result.metrics)
    if proxied and os.path.isdir(os.path.join(storage, "checkpoints")):
        writer.log_artifacts(os.path.join(storage, "checkpoints"), "checkpoints")
    writer.set_tags({"sweepflow.status": status, "sweepflow.epochs": len(result.metrics_history)})
    writer.finish(_MLFLOW_STATUS[status])
    best_checkpoint = result.best_checkpoints[0][0].path if result.best_checkpoints else None
    summary = {
        "trial_id": spec.trial_id,
        "name": spec.name,
        "params": spec.params,
        "status": status,
        "run_id": run_id,
        "epochs": len(result.metrics_history),
        "last": result.metrics or {},
        "best": _best(result.metrics_history, spec.selection_metric, spec.selection_mode),
        "best_checkpoint": best_checkpoint,
        "error": str(error) if error is not None else None,
        "train_time_s": result.train_time_s,
    }
    rt.progress.update(spec.trial_id, metrics=result.metrics, status=status)
    # Where and when rank 0 trained: consecutive trials on one worker show how long it sat idle in between.
    summary["rank0"] = {
        "worker": result.rank0_worker,
        "started_at": result.started_at,
        "ended_at": result.ended_at,
    }
    summary["phases_s"] = {
        "group_overhead": round(fit_s - result.train_time_s, 4),  # reserve, launch, rendezvous, teardown
        "mlflow_end": round(time.perf_counter() - fit_start - fit_s, 4),  # queued: written in the background
    }
    return summary
