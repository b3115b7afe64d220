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
    data_path: str | None,
    storage_options: dict[str, Any] | None,
    registration_args: dict[str, Any],
    auth_env: SecretEnv,
) -> dict[str, Any]:
    """The project's ``model_fn(checkpoint)`` model, logged with mlflow.pytorch and registered
    (``log_and_register``). ``model_fn`` returns the module, or ``(module, input_example)``; for the module alone
    the example is the prepared test split's first rows (``find_input_example``) when the module accepts them,
    else there is none and the model is logged without a signature (pickled, with its package's code). The
    outcome's ``input_example`` says which, in a sentence the flow logs."""
    from sweepflow.tasks.datasets.examples import find_input_example
    from sweepflow.tasks.tracking.registry import ExportError, log_and_register
    from sweepflow.tasks.training.function import project_importable

    _registry_warmed()

    shown = _shown(model_fn)
    with project_importable(project_dir):
        built = _project_function(model_fn)(Checkpoint(checkpoint_path, storage_options=storage_options))
        module, example = own_model(built, shown)
        if example is not None:
            said = f"the input example training.model_fn={shown!r} returned"
        else:
            found = find_input_example(data_path, storage_options) if data_path else None
            example = found.array if found is not None and accepts(module, found.array) else None
            said = (
                f"{found.source} of {data_path}" if example is not None and found is not None
                else f"none: training.model_fn={shown!r} returned the module alone and the data "
                f"({data_path or 'none given'}) holds no test split the module accepts (test.csv/.parquet with schema.json, test.npz, "
                "test/<class>/<image>), so the model is registered without a signature, pickled with its "
                "code; return (module, input_example) to add one (and a pt2 graph that loads without your code)"
            )
        pickled = {"serialization_format": "pickle", "code_paths": model_code_paths(module, project_dir)}
        with tracking_auth_scope(auth_env):
            try:
                registration = log_and_register(
                    model=module, input_example=example, **registration_args, **({} if example is not None else pickled)
                )
            except ExportError as exc:  # raised before anything was written: the same model, pickled
                registration = log_and_register(model=module, input_example=example, **registration_args, **pickled)
                said += f"; pickled with its code, not pt2: {str(exc).split(' (')[0]} (data-dependent control flow?)"
    return {**_outcome(registration), "input_example": said}


def own_model(built: Any, shown: str) -> tuple[Any, Any]:
    """``model_fn``'s return value as ``(module, input example or None)``, the example as a numpy array; a
    return value of another shape is refused naming the function."""
    import numpy as np
    import torch

    module, example = built if isinstance(built, tuple) and len(built) == 2 else (built, None)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"training.model_fn={shown!r} returned {type(module).__name__}: return the trained "
            "torch.nn.Module, or (module, input_example)"
        )
    if isinstance(example, torch.Tensor):
        example = example.detach().cpu().numpy()
    return module, None if example is None else np.asarray(example)


def accepts(module: Any, example: Any) -> bool:
    """Whether ``module`` (in eval mode, on the CPU, no gradients) maps the numpy batch ``example`` to one
    tensor: an example it does not accept would register a signature the model contradicts. The module's own
    mode and device are left as they were."""
    import copy

    import torch

    core = module.module if isinstance(module, torch.nn.parallel.DistributedDataParallel) else module
    probe = copy.deepcopy(core).to("cpu").eval()
    try:
        with torch.no_grad():
            out = probe(torch.from_numpy(example))
    except (RuntimeError, TypeError, ValueError, IndexError, KeyError, AttributeError):
        return False  # a shape, dtype or layout the model was not built for: not this example
    return isinstance(out, torch.Tensor)


def model_code_paths(module: Any, project_dir: str | None) -> list[str]:
    """The package (or module file) inside ``project_dir`` that defines ``module``'s class: stored with a
    pickled model so that loading it needs only the model's own imports. Empty when the class is defined
    elsewhere (an installed package: the loading environment installs it too)."""
    import os

    defined_in = sys.modules.get(type(module).__module__)
    path = getattr(defined_in, "__file__", None)
    if not path or not project_dir:
        return []
    root, path = os.path.realpath(project_dir), os.path.realpath(path)
    if os.path.commonpath([root, path]) != root:
        return []
    top = type(module).__module__.split(".")[0]
    package = os.path.join(root, top)
    return [package] if os.path.isdir(package) else [os.path.join(root, f"{top}.py")]
