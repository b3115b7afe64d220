"""Log a trained model into its MLflow run and register it with champion/challenger aliases.

MLflow is the system of record: every trial that finishes gets a model version, the newest is always
``@challenger``, and ``@champion`` moves only to a version whose metric beats the current champion's, so
``models:/NAME@champion`` is what serving loads. The metric a version was judged on lives in tags on the
version itself (``sweepflow.metric_name``, ``sweepflow.metric_value``, ``sweepflow.higher_is_better``), so the
comparison survives restarts and can be audited in the UI without finding the run.

Decisions, and why:

* **Serialization ``pt2`` (``torch.export``) by default, not pickle.** A pt2 archive is a self-contained
  graph: loading it needs torch, not the training code. A pickled module stores its class *by reference*, so
  ``mlflow.pyfunc.load_model`` in a process without the training package fails with
  ``ModuleNotFoundError`` (checked: a model class from an importable module, loaded in a fresh process).
  Unpickling also executes arbitrary code. With an input example of batch >= 2 the exported batch dimension
  is dynamic (MLflow marks it ``Dim.AUTO``): predictions on batches of 1 and 7 worked from an example of 4.
  Cost, measured on the 2-core dev machine with a Linear(64, 10) model: the *first* pt2 ``log_model`` in a
  process took 11-13 s, nearly all of it importing ``torch._dynamo``/``torch.export`` once; later calls
  0.4 s (pickle: 0.26 s). Per trial process that is a one-off, cheap next to training. Models that
  ``torch.export`` cannot trace (data-dependent Python control flow) fail a pre-flight export *before*
  anything is written to MLflow, with a message pointing to ``serialization_format="pickle"``.
* **An example with batch 1 is doubled to batch 2**: ``torch.export`` specializes size-1 dimensions to
  constants, which would make the logged model reject every other batch size.
* **The LoggedModel is created here, in the run's experiment, and passed to ``log_model(model_id=...)``.**
  ``log_model(run_id=...)`` without an active run creates the LoggedModel in the *active/default*
  experiment (checked: experiment 0, not the run's); ``mlflow.start_run(run_id=...)`` would fix that but
  marks the (parent) run FINISHED when its block exits, while the flow may still be logging to it.
* **The model is logged as a CPU copy in eval mode** (unwrapped from DDP): pt2 bakes the module's mode into
  the graph (dropout/batch-norm in train mode would be exported as such), and the caller's module is left
  untouched.

Concurrency: registrations in one process are serialized by a lock (``mlflow.pytorch.log_model`` reads the
process-global tracking URI, which this module sets temporarily, and the champion update is a
read-compare-write). Between *processes* the read-compare-write is not atomic: MLflow has no compare-and-set
for aliases, so two trials finishing in the same instant can, rarely, leave the worse one as champion.
Register from one place (the flow) when that matters.
"""

from __future__ import annotations

import copy
import importlib.metadata
import logging
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import mlflow
import numpy as np
import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.models import infer_signature
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode
from packaging.version import Version

from sweepflow.tasks.compat import tracking_uri_scope

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.models import ModelSignature

__all__ = [
    "CHALLENGER_ALIAS",
    "CHAMPION_ALIAS",
    "TAG_HIGHER_IS_BETTER",
    "TAG_METRIC_NAME",
    "TAG_METRIC_VALUE",
    "RegistrationResult",
    "current_champion",
    "log_and_register",
]

logger = logging.getLogger(__name__)

CHAMPION_ALIAS = "champion"
CHALLENGER_ALIAS = "challenger"
TAG_METRIC_NAME = "sweepflow.metric_name"
TAG_METRIC_VALUE = "sweepflow.metric_value"
TAG_HIGHER_IS_BETTER = "sweepflow.higher_is_better"
_RESERVED_TAGS = (TAG_METRIC_NAME, TAG_METRIC_VALUE, TAG_HIGHER_IS_BETTER)

#: Artifact name of the model inside its LoggedModel / run.
MODEL_NAME = "model"

_REGISTRY_LOCK = threading.Lock()


@dataclass(frozen=True)
class RegistrationResult:
    """What ``log_and_register`` did: the new version and where ``@champion`` points afterwards."""

    name: str
    version: int
    #: Registry URI of the new version, ``models:/NAME/VERSION``.
    model_uri: str
    became_champion: bool
    champion_version: int
    previous_champion_version: int | None
    previous_champion_value: float | None


@dataclass(frozen=True)
class _Champion:
    version: int
    value: float | None
    metric_name: str | None
    higher_is_better: bool | None


def _is_not_found(exc: MlflowException) -> bool:
    return exc.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST)


def _champion(client: MlflowClient, name: str) -> _Champion | None:
    """The version ``@champion`` points to and the metric tags stored on it; None if there is none yet."""
    try:
        registered = client.get_registered_model(name)
    except MlflowException as exc:
        if _is_not_found(exc):
            return None
        raise
    version = registered.aliases.get(CHAMPION_ALIAS)
    if version is None:
        return None
    tags = client.get_model_version(name, str(version)).tags
    raw_value = tags.get(TAG_METRIC_VALUE)
    raw_direction = tags.get(TAG_HIGHER_IS_BETTER)
    try:
        value = float(raw_value) if raw_value is not None else None
    except ValueError:
        value = None
    return _Champion(
        version=int(version),
        value=value if value is not None and not math.isnan(value) else None,
        metric_name=tags.get(TAG_METRIC_NAME),
        higher_is_better=None if raw_direction is None else raw_direction.lower() == "true",
    )


def _require_comparable(champion: _Champion, name: str, metric_name: str, higher_is_better: bool) -> float:
    """The champion's metric value, or an error saying how to repair a champion we cannot compare against."""
    if champion.value is None:
        raise ValueError(
            f"Model {name!r}: @{CHAMPION_ALIAS} points to version {champion.version}, which has no numeric "
            f"{TAG_METRIC_VALUE!r} tag (was the alias set by hand?). Set it, e.g. "
            f"MlflowClient().set_model_version_tag({name!r}, '{champion.version}', {TAG_METRIC_VALUE!r}, "
            f"'<value>') together with {TAG_METRIC_NAME!r}, or delete the alias to let the next model become "
            "champion."
        )
    if champion.metric_name is not None and champion.metric_name != metric_name:
        raise ValueError(
            f"Model {name!r}: the champion (version {champion.version}) was judged on "
            f"{champion.metric_name!r}, this model on {metric_name!r}; comparing them would be meaningless. "
            "Use the same metric_name for one registered model, or register under another name."
        )
    if champion.higher_is_better is not None and champion.higher_is_better != higher_is_better:
        raise ValueError(
            f"Model {name!r}: the champion (version {champion.version}) was registered with "
            f"higher_is_better={champion.higher_is_better}, this call says {higher_is_better}. "
            f"Pass higher_is_better={champion.higher_is_better} for {metric_name!r}."
        )
    return champion.value


def current_champion(name: str, tracking_uri: str | None = None) -> tuple[int, float] | None:
    """``(version, metric value)`` of ``models:/NAME@champion``, or None if the model or alias does not exist.

    Raises ValueError if the champion carries no metric tag (an alias set outside this module), since
    returning a made-up value would silently decide future comparisons.
    """
    champion = _champion(MlflowClient(tracking_uri), name)
    if champion is None:
        return None
    if champion.value is None:
        raise ValueError(
            f"Model {name!r}: @{CHAMPION_ALIAS} points to version {champion.version}, which has no numeric "
            f"{TAG_METRIC_VALUE!r} tag. Set the tag on that version or move the alias with log_and_register."
        )
    return champion.version, champion.value


def _beats(value: float, champion_value: float, higher_is_better: bool) -> bool:
    """Strictly better only: on a tie the sitting champion stays, so aliases do not churn between equals."""
    return value > champion_value if higher_is_better else value < champion_value


def _pip_requirements(serialization_format: str) -> list[str]:
    """Pinned requirements of the logged model; passing them skips MLflow's ~10 s inference of them.

    Local version labels (``2.14.1+cu130``) are dropped: the public index has no such wheel, and the
    serving side picks its own torch build (CPU or CUDA) for the same release.
    """
    packages = ["mlflow", "torch", "numpy"]
    if serialization_format == "pickle":
        packages.append("cloudpickle")  # mlflow.pytorch's default pickle module
    return [f"{p}=={Version(importlib.metadata.version(p)).public}" for p in packages]


def _export_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A CPU, eval-mode copy of ``model`` (DDP unwrapped), leaving the caller's module as it was."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return copy.deepcopy(model).to("cpu").eval()


class ExportError(ValueError):
    """``torch.export`` cannot trace the model (the pt2 format): raised before anything is written to MLflow."""


def _preflight_export(model: torch.nn.Module, example: torch.Tensor) -> None:
    """Trace the model the way mlflow's pt2 path will, before anything is written to the tracking server.

    A failure inside ``log_model`` would leave a PENDING LoggedModel behind in the run, and more: MLflow 3's
    ``Model.log`` records the run's model output and copies the run's step-0 metrics onto the model *before* it
    exports, so deleting the model afterwards would not undo it. That is worth this second trace (0.2 s of a
    warm registration). ``torch.export`` raises many different exception types (guards, unsupported ops, dtype
    errors), all turned here into one message that says what to do.
    """
    try:
        torch.export.export(model, (example,), dynamic_shapes=[{0: torch.export.Dim.AUTO}])
    except Exception as exc:  # re-raised with the fix; torch.export has no common base exception
        raise ExportError(
            f"torch.export could not trace {type(model).__name__} on an input of shape {tuple(example.shape)} "
            f"and dtype {example.dtype} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
            "Check that input_example has the dtype the model expects; if the model has data-dependent "
            "Python control flow, pass serialization_format='pickle' (the loading process then needs the "
            "model's code importable)."
        ) from exc


def _tags(
    metric_name: str, metric_value: float, higher_is_better: bool, extra_tags: dict | None
) -> dict[str, str]:
    extra = {str(k): str(v) for k, v in (extra_tags or {}).items()}
    clash = sorted(set(extra) & set(_RESERVED_TAGS))
    if clash:
        raise ValueError(f"extra_tags may not set {clash}: log_and_register writes them; rename those tags.")
    return {
        **extra,
        TAG_METRIC_NAME: metric_name,
        TAG_METRIC_VALUE: repr(float(metric_value)),
        TAG_HIGHER_IS_BETTER: "true" if higher_is_better else "false",
    }


def _check_arguments(
    input_example: np.ndarray | None, metric_name: str, metric_value: float, serialization_format: str
) -> None:
    """Refuse, before anything is traced or written, arguments that would fail later or register junk."""
    if input_example is None:
        if serialization_format != "pickle":
            raise ValueError(
                "input_example is None: the pt2 format traces the model on an example; pass one (a numpy batch), "
                "or serialization_format='pickle' to log the model without a signature."
            )
    elif not isinstance(input_example, np.ndarray) or input_example.ndim < 1:
        raise TypeError(
            f"input_example must be a numpy array with a batch axis, got {type(input_example).__name__}; "
            "pass e.g. x_batch.cpu().numpy()."
        )
    if not math.isfinite(float(metric_value)):
        raise ValueError(
            f"metric_value for {metric_name!r} is {metric_value}: a non-finite value cannot be compared; "
            "do not register diverged trials."
        )
    if serialization_format not in ("pt2", "pickle"):
        raise ValueError(f"serialization_format must be 'pt2' or 'pickle', got {serialization_format!r}.")


def _example_and_signature(
    model: torch.nn.Module,
    module: torch.nn.Module,
    input_example: np.ndarray | None,
    serialization_format: str,
) -> tuple[np.ndarray | None, ModelSignature | None]:
    """The example to store with ``module`` (the export copy of ``model``) and the signature inferred from it;
    for pt2, after a pre-flight trace on it. ``(None, None)`` without an example."""
    if input_example is None:
        return None, None
    if input_example.shape[0] == 1:
        # torch.export turns a size-1 batch axis into a constant; two rows keep it dynamic.
        input_example = np.concatenate([input_example, input_example])
    example_tensor = torch.from_numpy(np.ascontiguousarray(input_example))
    with torch.no_grad():
        output = module(example_tensor)
    if not isinstance(output, torch.Tensor):
        raise TypeError(
            f"{type(model).__name__} returned {type(output).__name__}; MLflow's pyfunc predict needs one "
            "tensor. Wrap the model in a module whose forward returns a single tensor."
        )
    signature = infer_signature(input_example, output.numpy())
    if serialization_format == "pt2":
        _preflight_export(module, example_tensor)
    return input_example, signature


def _source_run(client: MlflowClient, run_id: str) -> Run:
    """The run the model is logged into, or a ValueError naming the tracking server it is not on."""
    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if _is_not_found(exc):
            raise ValueError(
                f"Run {run_id!r} does not exist on {client.tracking_uri}: pass the run id of the trial's "
                "run on this tracking server (tracking_uri)."
            ) from exc
        raise


def _refuse_incomparable_champion(
    client: MlflowClient, name: str, metric_name: str, higher_is_better: bool
) -> None:
    """Raise (``_require_comparable``) if a champion exists that this model could not be compared against."""
    before = _champion(client, name)
    if before is not None:
        _require_comparable(before, name, metric_name, higher_is_better)


def _log_model(
    client: MlflowClient,
    run: Run,
    run_id: str,
    module: torch.nn.Module,
    *,
    input_example: np.ndarray | None,
    signature: ModelSignature | None,
    registered_model_name: str,
    tags: dict[str, str],
    serialization_format: Literal["pt2", "pickle"],
    code_paths: list[str] | None,
) -> int:
    """Log ``module`` as a LoggedModel of ``run`` (see the module docstring for why it is created here) and
    register it; the new version's number."""
    logged = client.create_logged_model(
        experiment_id=run.info.experiment_id,
        name=MODEL_NAME,
        source_run_id=run_id,
        params={k: str(v) for k, v in run.data.params.items()},
        # log_model(model_id=...) applies its tags to the registered version only.
        tags=tags,
    )
    info = mlflow.pytorch.log_model(
        module,
        name=MODEL_NAME,
        model_id=logged.model_id,
        run_id=run_id,
        input_example=input_example,
        signature=signature,
        pip_requirements=_pip_requirements(serialization_format),
        serialization_format=serialization_format,
        code_paths=code_paths or None,
        registered_model_name=registered_model_name,
        tags=tags,
    )
    if info.registered_model_version is None:
        raise RuntimeError(
            f"log_model logged {info.model_uri} but returned no registered version of "
            f"{registered_model_name!r}; check that the tracking server has a model registry."
        )
    return int(info.registered_model_version)


def _crown_if_better(
    client: MlflowClient,
    name: str,
    version: int,
    metric_name: str,
    metric_value: float,
    higher_is_better: bool,
) -> tuple[bool, int, _Champion | None, float | None]:
    """Move ``@champion`` to ``version`` if it beats the sitting champion (or there is none):
    ``(became_champion, champion_version, previous champion, its value)``."""
    # Re-read: another process may have moved the champion while the model was uploading.
    previous = _champion(client, name)
    previous_value = (
        None if previous is None else _require_comparable(previous, name, metric_name, higher_is_better)
    )
    if previous is None or previous_value is None:
        became_champion, champion_version = True, version
    elif _beats(float(metric_value), previous_value, higher_is_better):
        became_champion, champion_version = True, version
    else:
        became_champion, champion_version = False, previous.version
    if became_champion:
        client.set_registered_model_alias(name, CHAMPION_ALIAS, str(version))
    return became_champion, champion_version, previous, previous_value


def _log_registration(result: RegistrationResult, metric_name: str, metric_value: float) -> None:
    logger.info(
        "Registered %s version %d (%s=%s); champion: version %d%s",
        result.name,
        result.version,
        metric_name,
        metric_value,
        result.champion_version,
        ""
        if result.previous_champion_version is None
        else f" (was {result.previous_champion_version} with {result.previous_champion_value})",
    )


def log_and_register(
    *,
    model: torch.nn.Module,
    input_example: np.ndarray | None,
    registered_model_name: str,
    run_id: str,
    metric_name: str,
    metric_value: float,
    higher_is_better: bool = True,
    tracking_uri: str | None = None,
    extra_tags: dict | None = None,
    serialization_format: Literal["pt2", "pickle"] = "pt2",
    code_paths: list[str] | None = None,
) -> RegistrationResult:
    """Log ``model`` into run ``run_id``, register it, make it ``@challenger``, and ``@champion`` if it wins.

    Args:
        model: The trained module (a DDP wrapper is unwrapped; a CPU eval-mode copy is logged).
        input_example: A numpy batch the model accepts; stored with the model and used to infer the
            signature and to trace the pt2 graph. Its first axis is the batch axis. None: the model is logged
            without a signature or example, which only ``serialization_format="pickle"`` allows (pt2 traces
            the graph on the example).
        registered_model_name: Registry name; created on first use.
        run_id: The run the model belongs to (the pipeline passes the trial that trained it, so it is the
            version's source run); it is not started or ended here, and may have ended.
        metric_name, metric_value, higher_is_better: What the champion comparison uses; stored as tags on
            the version. The first version becomes champion; a tie keeps the sitting champion.
        tracking_uri: Server to use; None means MLflow's current global/env URI.
        extra_tags: More tags for the LoggedModel and the version (values are stringified).
        serialization_format: ``"pt2"`` (default, see module docstring) or ``"pickle"`` for models
            ``torch.export`` cannot trace.
        code_paths: Directories or files stored with a pickled model (MLflow's ``code_paths``) and put on the
            path of the process that loads it: the package that defines the model's class.

    Returns:
        RegistrationResult with the new version and where ``@champion`` points afterwards.
    """
    _check_arguments(input_example, metric_name, metric_value, serialization_format)
    tags = _tags(metric_name, metric_value, higher_is_better, extra_tags)
    module = _export_copy(model)
    input_example, signature = _example_and_signature(model, module, input_example, serialization_format)

    client = MlflowClient(tracking_uri)
    with _REGISTRY_LOCK, tracking_uri_scope(tracking_uri):
        run = _source_run(client, run_id)
        # Refuse an incomparable champion before writing anything.
        _refuse_incomparable_champion(client, registered_model_name, metric_name, higher_is_better)
        version = _log_model(
            client,
            run,
            run_id,
            module,
            input_example=input_example,
            signature=signature,
            registered_model_name=registered_model_name,
            tags=tags,
            serialization_format=serialization_format,
            code_paths=code_paths,
        )
        client.set_registered_model_alias(registered_model_name, CHALLENGER_ALIAS, str(version))
        became_champion, champion_version, previous, previous_value = _crown_if_better(
            client, registered_model_name, version, metric_name, metric_value, higher_is_better
        )

    result = RegistrationResult(
        name=registered_model_name,
        version=version,
        model_uri=f"models:/{registered_model_name}/{version}",
        became_champion=became_champion,
        champion_version=champion_version,
        previous_champion_version=None if previous is None else previous.version,
        previous_champion_value=previous_value,
    )
    _log_registration(result, metric_name, metric_value)
    return result
