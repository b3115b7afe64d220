"""A training function named by import path (``module:function``), imported where it runs."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sweepflow.tasks.tracking.credentials import SecretEnv

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


_SYSTEM_METRICS_FINISH_S = 10.0  # longest a trial's end waits for its sampler's last sample


@dataclass(frozen=True)
class SystemMetrics:
    """How rank 0 samples the trial's system metrics (``system/cpu_utilization_percentage``, the trial's own
    ``system/process_cpu_percentage``, memory, GPU; see ``system_metrics.py``) while it trains: from its start,
    at gaps growing up to ``interval_s`` seconds, and at its end. The samples travel to the sweep with the
    trial's reports (``ddp_runtime.session.side_channel``), which writes them to the trial's MLflow run: the
    ranks never talk to the tracking server for them."""

    interval_s: float


@contextlib.contextmanager
def _system_metrics(settings: SystemMetrics | None) -> Iterator[None]:
    """The trial's system-metrics sampler around the training function, on rank 0 only (one machine's view per
    trial); the function's end waits at most _SYSTEM_METRICS_FINISH_S for the last sample."""
    import ddp_runtime.session

    if settings is None:
        yield
        return
    post = ddp_runtime.session.side_channel(flush_after_s=settings.interval_s)
    if post is None:  # not rank 0
        yield
        return
    from sweepflow.tasks.training.system_metrics import TrialSampler

    sampler = TrialSampler(post, max_interval_s=settings.interval_s)
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


def driver_script_dir() -> str | None:
    """Where the driver script's own modules import from: its ``sys.path[0]`` (the script's directory; the
    current directory under ``python -m``/``-c`` or in a notebook). None when that is no directory (a zipapp)."""
    if not sys.path:
        return None
    directory = os.path.abspath(sys.path[0] or os.getcwd())
    return directory if os.path.isdir(directory) else None


_paths_lock = threading.Lock()


@dataclass
class _PathUse:
    """One directory ``_importable`` put on this process's path: how many trials here use it, whether it was
    put there by us (else it stays), and the modules already loaded before (never forgotten)."""

    added: bool
    known: set[str]
    trials: int = 0


_path_users: dict[str, _PathUse] = {}
_held = threading.local()  # .directories: the script directories _importable holds for this thread, innermost last


@contextlib.contextmanager
def _importable(directory: str | None) -> Iterator[None]:
    """The driver script's directory on this process's sys.path while a trial's function runs here, as Ray puts
    it on its workers' path: the script's sibling modules (``from my_model import Net``) import on the ranks.

    Counted, for trials sharing a worker process. The last one out takes it off again and forgets the modules
    imported from it, so the next experiment from that directory gets its modules as they are then, not as this
    long-lived worker first imported them. A directory already on the path (a local cluster the script started
    inherits the script's path) is left as it is."""
    if directory is None:
        yield
        return
    with _paths_lock:
        use = _path_users.get(directory)
        if use is None:
            added = directory not in sys.path
            if added:
                sys.path.insert(0, directory)
                importlib.invalidate_caches()
            use = _path_users[directory] = _PathUse(added=added, known=set(sys.modules.copy()))
        use.trials += 1
    held = _held.__dict__.setdefault("directories", [])
    held.append(directory)
    try:
        yield
    finally:
        held.pop()
        _leave(directory, use)


def _leave(directory: str, use: _PathUse) -> None:
    with _paths_lock:
        use.trials -= 1
        if use.trials == 0:
            del _path_users[directory]
            if use.added:
                _forget(directory, known=use.known)


def hold_script_modules() -> Callable[[], None]:
    """Keep the calling trial's script directory on the path, and the modules imported from it loaded, after the
    trial ends, until the returned function is called (once; later calls do nothing).

    For an object a trial leaves behind for a later trial in this process (``reuse_actors``): its classes stay
    the ones the later trial imports, so pickling what it holds (a ``DataLoader`` starting workers with
    ``spawn``/``forkserver``) still finds them. Outside a trial, the returned function does nothing."""
    held = getattr(_held, "directories", None)
    if not held:
        return lambda: None
    directory = held[-1]
    with _paths_lock:
        use = _path_users[directory]
        use.trials += 1
    released = threading.Event()

    def release() -> None:
        if not released.is_set():
            released.set()
            _leave(directory, use)

    return release


def project_importable(directory: str | None) -> contextlib.AbstractContextManager[None]:
    """A project's directory (``PipelineConfig.project_dir``) on this process's import path for the block, where
    the project's functions are imported and run (the flow's checks and preparation, each rank, the evaluation
    and the registration on their worker); taken off again after, as for a driver script's directory."""
    return _importable(directory)


def _forget(directory: str, *, known: set[str]) -> None:
    """Take ``directory`` off sys.path, and forget the modules it gave since (not in ``known``): the top-level
    modules and packages that live right in it, with their submodules. Nothing else, even from below it: a
    package that was imported before (ddp_runtime, sweepflow's own in a source checkout) keeps its modules."""
    with contextlib.suppress(ValueError):  # someone else took it off already
        sys.path.remove(directory)
    given = set()
    # A copy taken in one step: another thread of the worker may be importing meanwhile (registration's warm-up,
    # finalize_on_worker.warm_registry), and iterating sys.modules itself then raised "dictionary changed size".
    for name, module in sys.modules.copy().items():
        if "." in name or name in known:
            continue
        file = getattr(module, "__file__", None) or ""
        place = os.path.dirname(file)
        if place == directory or (
            os.path.basename(file) == "__init__.py" and os.path.dirname(place) == directory
        ):
            given.add(name)
    for name in list(sys.modules):
        if name.partition(".")[0] in given:
            sys.modules.pop(name, None)


class _FromScript:
    """A function object from the user's script on its way to the ranks: cloudpickled on the driver, unpickled on
    its rank only once the script's directory is on the path there. cloudpickle sends the script's own functions
    by value but the modules beside it (``my_model``) by name, and Dask's scheduler unpickles the task arguments
    it is sent: sent as bytes, they are unpickled where they can be imported."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        import cloudpickle

        self.payload = cloudpickle.dumps(fn)
        self.name = name

    def load(self, directory: str | None) -> Callable[..., Any]:
        import cloudpickle

        try:
            return cloudpickle.loads(self.payload)
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                f"the training function {self.name} needs module {exc.name!r}, which this Dask worker cannot "
                f"import: it is not in the driver script's directory {directory} as this worker's host sees it, "
                "nor installed here; install it on the workers, or put its directory on their PYTHONPATH",
                name=exc.name,
            ) from exc


@dataclass(frozen=True)
class TrainFunction:
    """The function every rank of a trial runs: either named by import path (``"module:function"``, imported
    where it runs, on the Dask workers, so the flow process never imports the training code nor torch; the
    module is located at once, so a typo fails before any group starts), or a function object (a user's script
    function, partial, closure or lambda), which travels to the workers cloudpickled and is unpickled on each rank
    with the driver script's directory on the path (its sibling modules import there, as on Ray's workers)."""

    target: str | Callable[..., Any]
    system_metrics: SystemMetrics | None = None  # sample system metrics on rank 0 while it trains
    trial_run: TrialRun | None = None  # the trial's MLflow run (``current_trial_run`` on every rank)
    # A function object's: the driver script's directory, importable on the ranks while it runs (default: the
    # directory of the process that builds this, the driver's: ``driver_script_dir``).
    script_dir: str | None = None

    def __post_init__(self) -> None:
        if callable(self.target):
            if self.script_dir is None:
                object.__setattr__(self, "script_dir", driver_script_dir())
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

    def warm_up(self) -> None:
        """Import the function's module where it will run, ahead of its first trial (the sweep's worker start-up:
        ``ddp_runtime.cluster.warm_up_workers``; a function object's modules came with it)."""
        if isinstance(self.target, str):
            with _importable(self.script_dir):
                import_train_fn(self.target)

    @property
    def path(self) -> str:
        """How to name it: the import path, or the function's module and qualified name."""
        if isinstance(self.target, str):
            return self.target
        if isinstance(self.target, _FromScript):
            return self.target.name
        fn = getattr(self.target, "func", self.target)  # functools.partial
        return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"

    def __getstate__(self) -> dict[str, Any]:
        """A function object travels as bytes, unpickled on its rank once the script's directory is importable."""
        state = dict(self.__dict__)
        if callable(self.target) and self.script_dir is not None:
            state["target"] = _FromScript(self.target, self.path)
        return state

    def __call__(self, config: dict[str, Any]) -> Any:
        with _importable(self.script_dir):
            if isinstance(self.target, str):
                fn = import_train_fn(self.target)
            elif isinstance(self.target, _FromScript):
                fn = self.target.load(self.script_dir)
            else:
                fn = self.target
            with _inside_trial(self.trial_run), _system_metrics(self.system_metrics):
                # As in Ray, a zero-argument training function simply does not see train_loop_config.
                return fn(config) if _takes_arguments(fn) else fn()


def _takes_arguments(fn: Callable[..., Any]) -> bool:
    try:
        return bool(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or an object without a signature: give it the config
        return True
