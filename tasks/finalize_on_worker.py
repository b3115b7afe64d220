"""The worker side of ``sweepflow.tasks.finalize``: what its tasks run on a Dask worker of the sweep's cluster.

A module of its own, importing neither Prefect nor (until registration runs) MLflow: the worker unpickles these
functions by importing this module, and pays only for what it runs. Evaluation needs torch and the training code
(the workers' preload warmed them); registration imports mlflow.pytorch and torch.export (the pt2 export: ~9 s
on a cold worker, most of it torch._dynamo) on first use. ``warm_registry`` starts those imports in the background
as soon as the sweep ends, so they overlap the flow's report and the evaluation, and
``finalize.finalizing_worker`` sends evaluation and registration to the worker that has them (or is getting them).
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from ddp_runtime import Checkpoint
from sweepflow.tasks.tracking.credentials import SecretEnv, tracking_auth_scope

#: The module whose import makes registration cost seconds on a cold worker (mlflow.pytorch).
REGISTRY_MODULE = "sweepflow.tasks.tracking.registry"


#: The name of ``warm_registry``'s background thread (in a worker's thread dump).
WARM_THREAD = "sweepflow-warm-registry"
#: That thread, once started in this process.
_warming: threading.Thread | None = None


def holds_registry() -> bool:
    """Whether this process imported, or is importing, what registration needs (``client.run`` asks every
    worker)."""
    return REGISTRY_MODULE in sys.modules or (_warming is not None and _warming.is_alive())


def warm_registry() -> bool:
    """Start importing what registration needs in a background thread of this worker (``client.run``); returns
    whether it started (False: this worker has them, or is getting them). A failed import raises nothing here:
    the thread's error is in the worker's log, and the registration's own import raises it where it counts."""
    global _warming
    if holds_registry():
        return False
    _warming = threading.Thread(target=_import_registry, name=WARM_THREAD, daemon=True)
    _warming.start()
    return True


def _import_registry() -> None:
    importlib.import_module(REGISTRY_MODULE)
    import mlflow.pytorch  # noqa: F401 - log_model
    import torch

    # The first export imports torch._dynamo, sympy and the tracer (most of the ~9 s); a one-layer model's is
    # enough to pay it. Registration's own export waits for this one (``_registry_warmed``): two exports at
    # once in one process would share dynamo's global state.
    torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(2, 2),))
    # log_model's requirement check maps every installed package to its modules first (~2 s, once).
    from sweepflow.tasks.compat import build_mlflow_requirement_map

    build_mlflow_requirement_map()


def _registry_warmed() -> None:
    """Wait for this worker's ``warm_registry`` thread, if one runs, before registering."""
    if _warming is not None:
        _warming.join()


def evaluate_on_worker(
    checkpoint_path: str, data_path: str, storage_options: dict[str, Any] | None
) -> dict[str, Any]:
    """Test-set metrics and confusion matrix of the checkpoint's model (the flow draws the matrix)."""
    from sweepflow.tasks.training.evaluate import evaluate_checkpoint

    with Checkpoint(checkpoint_path, storage_options=storage_options).as_directory() as local:
        result = evaluate_checkpoint(local, data_path, split="test")
    return {
        "metrics": result.to_metrics(),
        "confusion_matrix": result.confusion_matrix,
        "class_names": result.class_names,
    }


def register_on_worker(
    checkpoint_path: str,
    data_path: str,
    storage_options: dict[str, Any] | None,
    registration_args: dict[str, Any],
    auth_env: SecretEnv,
) -> dict[str, Any]:
    """Log the checkpoint's model with mlflow.pytorch and register it (``log_and_register``); the registration's
    outcome as plain data."""
    from sweepflow.tasks.datasets import load_split
    from sweepflow.tasks.tracking.registry import log_and_register
    from sweepflow.tasks.training.loop import load_model_from_checkpoint

    _registry_warmed()

    with Checkpoint(checkpoint_path, storage_options=storage_options).as_directory() as local:
        model = load_model_from_checkpoint(local)
    x_test, _ = load_split(data_path, "test")
    with tracking_auth_scope(auth_env):  # the flow's MLflow credentials, for this registration only
        registration = log_and_register(model=model, input_example=x_test[:4].numpy(), **registration_args)
    return _outcome(registration)


def _outcome(registration: Any) -> dict[str, Any]:
    """A ``RegistrationResult`` as the plain data the flow gets back."""
    return {
        "name": registration.name,
        "version": registration.version,
        "model_uri": registration.model_uri,
        "became_champion": registration.became_champion,
        "champion_version": registration.champion_version,
        "previous_champion_version": registration.previous_champion_version,
    }


# --------------------------------------------------------------------------------- a project's own functions
def _project_function(target: str | Callable[..., Any]) -> Callable[..., Any]:
    """``"module:function"`` imported here (the project's directory is on the path), or a function as given."""
    if callable(target):
        return target
    from sweepflow.tasks.training.function import import_train_fn

    return import_train_fn(target)


def _shown(target: str | Callable[..., Any]) -> str:
    return target if isinstance(target, str) else getattr(target, "__qualname__", repr(target))


def evaluate_own_model(
    evaluate_fn: str | Callable[..., Any],
    project_dir: str | None,
    checkpoint_path: str,
    data_path: str,
    storage_options: dict[str, Any] | None,
) -> dict[str, float]:
    """The project's ``evaluate_fn(checkpoint, data_path) -> {name: value}``, its metrics as ``test_<name>``
    (an import path, or the function itself: ``sweepflow.tune.register_best`` runs it in the driver)."""
    from sweepflow.tasks.training.function import project_importable

    with project_importable(project_dir):
        metrics = _project_function(evaluate_fn)(Checkpoint(checkpoint_path, storage_options=storage_options), data_path)
    if not isinstance(metrics, dict) or not metrics:
        raise TypeError(
            f"evaluation.evaluate_fn={_shown(evaluate_fn)!r} returned {type(metrics).__name__}: return a non-empty dict "
            "{metric name: number}, e.g. {'rmse': 0.41, 'mae': 0.3}"
        )
    out: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            out[f"test_{name}"] = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"evaluation.evaluate_fn={_shown(evaluate_fn)!r} returned {name!r}: {value!r}, not a number"
            ) from None
    return out


def register_own_model(
    model_fn: str | Callable[..., Any],
    project_dir: str | None,
    checkpoint_path: str,
    storage_options: dict[str, Any] | None,
    registration_args: dict[str, Any],
    auth_env: SecretEnv,
) -> dict[str, Any]:
    """The project's ``model_fn(checkpoint)`` model (and input example), logged with mlflow.pytorch and
    registered (``log_and_register``)."""
    import numpy as np
    import torch

    from sweepflow.tasks.tracking.registry import log_and_register
    from sweepflow.tasks.training.function import project_importable

    _registry_warmed()

    with project_importable(project_dir):
        built = _project_function(model_fn)(Checkpoint(checkpoint_path, storage_options=storage_options))
        module, example = built if isinstance(built, tuple) and len(built) == 2 else (built, None)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(
                f"training.model_fn={_shown(model_fn)!r} returned {type(module).__name__}: return the trained "
                "torch.nn.Module, or (module, input_example)"
            )
        if example is None:
            raise TypeError(
                f"training.model_fn={_shown(model_fn)!r} returned a module without an input example: return (module, "
                "input_example), a batch of a few inputs (numpy array or tensor) that MLflow stores with the "
                "model and infers its signature from"
            )
        if isinstance(example, torch.Tensor):
            example = example.detach().cpu().numpy()
        example = np.asarray(example)
        with tracking_auth_scope(auth_env):
            registration = log_and_register(model=module, input_example=example, **registration_args)
    return _outcome(registration)
