"""A training function named by import path (``module:function``), imported where it runs."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sweepflow.tasks.tracking.credentials import SecretEnv, tracking_auth_scope

F = TypeVar("F", bound=Callable[..., Any])


def with_checks(
    *, validate: Callable[[Mapping[str, Any]], None] | None = None, reports: Iterable[str] | None = None
) -> Callable[[F], F]:
    """Declare, beside a training function, what can be checked before a sweep starts::

        def validate(config): ...          # raise ValueError/TypeError naming the key and the fix

        @with_checks(validate=validate, reports=("epoch", "val_loss", "val_accuracy"))
        def train_fn(config): ...

    ``validate(config)`` is called (in the flow process, before any trial) on every config the sweep will
    give the function; ``reports`` lets the sweep refuse a selection or scheduler metric the function never
    reports. Both are optional attributes of the function (``fn.validate``, ``fn.reports``); the function
    itself is unchanged, so it still runs under plain ``TorchTrainer``.
    """

    def mark(fn: F) -> F:
        if validate is not None:
            fn.validate = validate  # type: ignore[attr-defined]
        if reports is not None:
            fn.reports = tuple(reports)  # type: ignore[attr-defined]
        return fn

    return mark


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


_SYSTEM_METRICS_FINISH_S = 10.0  # longest a trial's end waits for its last system metrics to be written


@dataclass(frozen=True)
class SystemMetrics:
    """Where rank 0 logs the trial's system metrics (``system/cpu_utilization_percentage``, the trial's own
    ``system/process_cpu_percentage``, memory, GPU; see ``system_metrics.py``) while it trains: from its start,
    at gaps growing up to ``interval_s`` seconds, and at its end, to run ``run_id`` on ``tracking_uri``.
    ``auth_env``: the flow's MLflow credentials (``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``) for a server that
    asks for them; they travel with the Dask task, are set on rank 0 only while it trains, and are never in a
    repr."""

    tracking_uri: str
    run_id: str
    interval_s: float
    auth_env: SecretEnv = field(default_factory=SecretEnv)

    def __repr__(self) -> str:  # the URI may hold credentials: never in a repr, log or message
        return f"SystemMetrics(run_id={self.run_id!r}, interval_s={self.interval_s!r})"


@contextlib.contextmanager
def _system_metrics(settings: SystemMetrics | None) -> Iterator[None]:
    """The trial's system-metrics sampler around the training function, on rank 0 only (one machine's view per
    trial). Every call to the tracking server happens in the sampler's thread, never the training thread's (a
    server that is away keeps MLflow's HTTP client retrying for minutes); the function's end waits at most
    _SYSTEM_METRICS_FINISH_S for the last sample to be written."""
    import ddp_runtime

    if settings is None or ddp_runtime.get_context().get_world_rank() != 0:
        yield
        return
    from sweepflow.tasks.training.system_metrics import TrialSampler

    # MLflow's client reads the auth variables on every request: they are set for as long as the sampler runs.
    with tracking_auth_scope(settings.auth_env):
        sampler = TrialSampler(settings.tracking_uri, settings.run_id, max_interval_s=settings.interval_s)
        sampler.start()
        try:
            yield
        finally:
            sampler.stop(_SYSTEM_METRICS_FINISH_S)


@dataclass(frozen=True)
class TrialRun:
    """The trial's own MLflow run, as the training function reaches it on its rank (``setup_mlflow``): where the
    tracking server is, which experiment and run. ``auth_env``: the flow's MLflow credentials for a server that
    asks for them (set while the function runs, once asked for); never in a repr."""

    tracking_uri: str
    experiment_id: str
    experiment_name: str
    run_id: str
    trial_id: str
    run_name: str  # the MLflow run's name
    auth_env: SecretEnv = field(default_factory=SecretEnv)

    def __repr__(self) -> str:  # the URI may hold credentials: never in a repr, log or message
        return f"TrialRun(trial_id={self.trial_id!r}, run_id={self.run_id!r})"


_trial_scope = threading.local()  # a worker runs each rank's function in a thread of its own


def current_trial_run() -> TrialRun | None:
    """The MLflow run of the trial whose training function runs in this thread (None: not inside one)."""
    return getattr(_trial_scope, "run", None)


def at_function_end(cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` on this rank when its training function returns or raises (last registered, first run)."""
    cleanups = getattr(_trial_scope, "cleanups", None)
    if cleanups is None:
        raise RuntimeError("at_function_end is for code running inside a trial's training function")
    cleanups.append(cleanup)


@contextlib.contextmanager
def _inside_trial(run: TrialRun | None) -> Iterator[None]:
    """The trial's run for ``current_trial_run`` while the function runs; then what ``at_function_end`` asked."""
    previous = (getattr(_trial_scope, "run", None), getattr(_trial_scope, "cleanups", None))
    cleanups: list[Callable[[], None]] = []
    _trial_scope.run, _trial_scope.cleanups = run, cleanups
    try:
        yield
    finally:
        _trial_scope.run, _trial_scope.cleanups = previous
        for cleanup in reversed(cleanups):
            cleanup()


@dataclass(frozen=True)
class TrainFunction:
    """The function every rank of a trial runs: either named by import path (``"module:function"``, imported
    where it runs, on the Dask workers, so the flow process never imports the training code nor torch; the
    module is located at once, so a typo fails before any group starts), or a function object (a user's script
    function, partial, closure or lambda), which Dask ships to the workers by value (cloudpickle)."""

    target: str | Callable[..., Any]
    system_metrics: SystemMetrics | None = None  # MLflow system metrics from rank 0 while it trains
    trial_run: TrialRun | None = None  # the trial's MLflow run (``current_trial_run`` on every rank)

    def __post_init__(self) -> None:
        if callable(self.target):
            return
        module_name = self.target.partition(":")[0]
        try:
            found = importlib.util.find_spec(module_name) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            raise ImportError(
                f"training.train_fn={self.target!r}: no module {module_name!r}; it must be importable in the flow "
                "process and on every Dask worker (install your package there, or put it on PYTHONPATH)"
            )

    def warm_up(self, *, system_metrics: bool = False) -> None:
        """Import the function's module where it will run, ahead of its first trial (the sweep's worker start-up:
        ``ddp_runtime.cluster.warm_up_workers``; a function object's modules came with it), and with
        ``system_metrics`` what the trial's system-metrics sampler writes with."""
        if isinstance(self.target, str):
            import_train_fn(self.target)
        if system_metrics:
            from sweepflow.tasks.training.system_metrics import warm_up

            warm_up()

    @property
    def path(self) -> str:
        """How to name it: the import path, or the function's module and qualified name."""
        if isinstance(self.target, str):
            return self.target
        fn = getattr(self.target, "func", self.target)  # functools.partial
        return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"

    def __call__(self, config: dict[str, Any]) -> Any:
        fn = import_train_fn(self.target) if isinstance(self.target, str) else self.target
        with _inside_trial(self.trial_run), _system_metrics(self.system_metrics):
            # As in Ray, a zero-argument training function simply does not see train_loop_config.
            return fn(config) if _takes_arguments(fn) else fn()


def _takes_arguments(fn: Callable[..., Any]) -> bool:
    try:
        return bool(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or an object without a signature: give it the config
        return True
