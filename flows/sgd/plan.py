"""What a ``PyTorchTrainer`` or ``PyTorchTrainable`` is asked to do, checked on the driver: the argument
checks (each error names the argument and how Ray called it) and the ``Plan`` they build, shipped to every rank.

The checks run where the user's call is, so a wrong creator signature fails at construction rather than
inside a DDP group. ``sweepflow.sgd.replica`` reads the ``Plan``; a ``PyTorchTrainable`` trial's ranks build
theirs from the trial's config with ``plan_from_tune_config``.
"""

from __future__ import annotations

import inspect
import logging
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["Plan", "check_trainable_config", "make_plan", "plan_from_tune_config", "positional_fit"]

log = logging.getLogger(__name__)

_BACKENDS = ("auto", "gloo", "nccl")
# PyTorchTrainer's arguments: also the keys of a PyTorchTrainable config (Ray: PyTorchTrainer(**config)).
_TRAINER_KEYS = (
    "model_creator",
    "data_creator",
    "optimizer_creator",
    "loss_creator",
    "train_function",
    "validation_function",
    "initialization_hook",
    "config",
    "num_replicas",
    "use_gpu",
    "batch_size",
    "backend",
)
_TUNE_ONLY_KEYS = ("epochs",)  # sweepflow: a trial stops by itself after this many epochs


def _arg_namer(tune: bool) -> Callable[[str], str]:
    return (lambda name: f'config["{name}"]') if tune else (lambda name: name)


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def positional_fit(fn: Any, counts: tuple[int, ...]) -> int | None:
    """The first of ``counts`` (numbers of positional arguments) that ``fn`` accepts; -1 when its signature
    cannot be read (a builtin: trust it); None when it accepts none of them."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return -1
    for count in counts:
        try:
            sig.bind(*range(count))
        except TypeError:
            continue
        return count
    return None


def _check_callable(label: str, fn: Any, counts: tuple[int, ...], usage: str) -> int:
    if not callable(fn):
        raise TypeError(f"{label} must be a function called as {usage}, got {fn!r}")
    fit = positional_fit(fn, counts)
    if fit is None:
        try:
            shown = f"{_fn_name(fn)}{inspect.signature(fn)}"
        except (TypeError, ValueError):
            shown = _fn_name(fn)
        raise TypeError(
            f"{label} is called as {usage}, but {shown} cannot be called that way; change its parameters"
        )
    return fit


def _data_creator_takes_batch_size(label: str, fn: Any) -> bool:
    """Ray 0.8 called ``data_creator(batch_size, config)``, Ray 0.7 ``data_creator(config)``."""
    fit = _check_callable(label, fn, (2, 1), "data_creator(batch_size, config) or data_creator(config)")
    if fit == 2:
        first = next(iter(inspect.signature(fn).parameters), None)
        if first == "config" and positional_fit(fn, (1,)) == 1:
            return False  # data_creator(config, something=default): the Ray 0.7 form with an extra option
    return fit != 1


def _check_loss_creator(label: str, loss_creator: Any) -> None:
    if loss_creator is None or isinstance(loss_creator, nn.Module):
        return
    if inspect.isclass(loss_creator):
        if not issubclass(loss_creator, nn.Module):
            raise TypeError(
                f"{label} must be a loss class (e.g. nn.MSELoss), a loss instance, or a function loss_creator(config) "
                f"returning one; got the class {loss_creator.__name__}, which is not a torch.nn.Module"
            )
        return
    _check_callable(
        label, loss_creator, (1,), "loss_creator(config) (or give a loss class such as nn.MSELoss)"
    )


def _check_int(label: str, value: Any, minimum: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{label} must be an int >= {minimum}, got {value!r}; {fix}")
    return int(value)


def _check_group_shape(arg: Callable[[str], str], num_replicas: Any, use_gpu: Any) -> tuple[int, bool]:
    n = _check_int(
        arg("num_replicas"),
        num_replicas,
        1,
        "it is the number of DDP ranks (one Dask worker each); use num_replicas=1 to train in one process",
    )
    if not isinstance(use_gpu, bool):
        raise TypeError(f"{arg('use_gpu')} must be True or False, got {use_gpu!r}")
    return n, use_gpu


def _check_backend(arg: Callable[[str], str], backend: Any, use_gpu: bool) -> str:
    """The DDP backend: ``auto`` resolved (nccl on GPUs, else gloo), ``nccl`` refused without GPUs."""
    if backend not in _BACKENDS:
        raise ValueError(f"{arg('backend')} must be one of {_BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = "nccl" if use_gpu else "gloo"
    if backend == "nccl" and not use_gpu:
        raise ValueError(
            f'{arg("backend")}="nccl" needs GPUs: set {arg("use_gpu")}=True, or use backend="gloo"'
        )
    return backend


def _check_creators(
    arg: Callable[[str], str],
    *,
    model_creator: Any,
    data_creator: Any,
    optimizer_creator: Any,
    loss_creator: Any,
    train_function: Any,
    validation_function: Any,
    initialization_hook: Any,
) -> bool:
    """Each creator and function checked against how a rank calls it; returns whether ``data_creator`` takes
    the batch size (Ray 0.8's form)."""
    if model_creator is None or data_creator is None:
        missing = [
            k for k, v in (("model_creator", model_creator), ("data_creator", data_creator)) if v is None
        ]
        raise TypeError(
            f"{', '.join(arg(m) for m in missing)} missing: PyTorchTrainer needs a model_creator(config) "
            "and a data_creator(batch_size, config)"
        )
    _check_callable(arg("model_creator"), model_creator, (1,), "model_creator(config)")
    takes_batch_size = _data_creator_takes_batch_size(arg("data_creator"), data_creator)
    if optimizer_creator is not None:
        _check_callable(arg("optimizer_creator"), optimizer_creator, (2,), "optimizer_creator(model, config)")
    _check_loss_creator(arg("loss_creator"), loss_creator)
    if train_function is not None:
        _check_callable(
            arg("train_function"),
            train_function,
            (5,),
            "train_function(model, train_iterator, criterion, optimizer, config)",
        )
    if validation_function is not None:
        _check_callable(
            arg("validation_function"),
            validation_function,
            (4,),
            "validation_function(model, val_iterator, criterion, config)",
        )
    if initialization_hook is not None:
        _check_callable(arg("initialization_hook"), initialization_hook, (0, 1), "initialization_hook()")
    return takes_batch_size


@dataclass(frozen=True)
class Plan:
    """Everything a rank needs, validated on the driver; shipped to the workers (creators included)."""

    model_creator: Callable[..., Any]
    data_creator: Callable[..., Any]
    optimizer_creator: Callable[..., Any] | None
    loss_creator: Any
    train_function: Callable[..., Any] | None
    validation_function: Callable[..., Any] | None
    initialization_hook: Callable[..., Any] | None
    config: dict[str, Any]
    num_replicas: int
    use_gpu: bool
    batch_size: int
    backend: str  # resolved: gloo or nccl
    data_creator_takes_batch_size: bool

    @property
    def batch_size_per_replica(self) -> int:
        return self.batch_size // self.num_replicas


def make_plan(
    *,
    tune: bool = False,
    model_creator: Any = None,
    data_creator: Any = None,
    optimizer_creator: Any = None,
    loss_creator: Any = None,
    train_function: Any = None,
    validation_function: Any = None,
    initialization_hook: Any = None,
    config: Any = None,
    num_replicas: Any = 1,
    use_gpu: Any = False,
    batch_size: Any = 16,
    backend: Any = "auto",
) -> Plan:
    arg = _arg_namer(tune)
    n, use_gpu = _check_group_shape(arg, num_replicas, use_gpu)
    batch_size = _check_int(
        arg("batch_size"),
        batch_size,
        n,
        f"it is the global batch size, split across the {n} replicas (each gets batch_size // num_replicas)",
    )
    backend = _check_backend(arg, backend, use_gpu)
    if config is not None and not isinstance(config, dict):
        raise TypeError(f"{arg('config')} must be a dict (passed to every creator) or None, got {config!r}")
    takes_batch_size = _check_creators(
        arg,
        model_creator=model_creator,
        data_creator=data_creator,
        optimizer_creator=optimizer_creator,
        loss_creator=loss_creator,
        train_function=train_function,
        validation_function=validation_function,
        initialization_hook=initialization_hook,
    )
    if batch_size % n:
        log.warning(
            "Changing batch size from %d to %d to evenly distribute batches across %d replicas.",
            batch_size,
            batch_size // n * n,
            n,
        )
    return Plan(
        model_creator=model_creator,
        data_creator=data_creator,
        optimizer_creator=optimizer_creator,
        loss_creator=loss_creator,
        train_function=train_function,
        validation_function=validation_function,
        initialization_hook=initialization_hook,
        config=dict(config or {}),
        num_replicas=n,
        use_gpu=use_gpu,
        batch_size=batch_size,
        backend=backend,
        data_creator_takes_batch_size=takes_batch_size,
    )


def _check_tune_keys(config: dict[str, Any]) -> None:
    unknown = sorted(set(config) - set(_TRAINER_KEYS) - set(_TUNE_ONLY_KEYS))
    if unknown:
        raise ValueError(
            f"PyTorchTrainable config has unknown key(s) {unknown}: its keys are PyTorchTrainer's arguments "
            f"{list(_TRAINER_KEYS)} (and 'epochs'). Put hyperparameters for the creators under config['config'], "
            'e.g. {"config": {"lr": tune.uniform(1e-4, 1e-1)}, "model_creator": ..., ...}'
        )


def _check_not_searched(config: dict[str, Any], keys: tuple[str, ...]) -> None:
    """The DDP group's shape is one per experiment: it cannot be a ``tune.grid_search`` or a distribution."""
    from sweepflow.tune.search_space import Domain, is_grid

    for key in keys:
        if is_grid(config.get(key)) or isinstance(config.get(key), Domain):
            raise ValueError(
                f'config["{key}"] is searched ({config[key]!r}), but every trial of one tune.run is a DDP group '
                f'of the same shape: give config["{key}"] one value, and run one tune.run per value to compare'
            )


def plan_from_tune_config(config: dict[str, Any]) -> tuple[Plan, int | None]:
    _check_tune_keys(config)
    epochs = config.get("epochs")
    if epochs is not None:
        epochs = _check_int(
            'config["epochs"]', epochs, 1, "or leave it out to train until Tune stops the trial"
        )
    return make_plan(tune=True, **{k: v for k, v in config.items() if k in _TRAINER_KEYS}), epochs


def check_trainable_config(config_example: dict[str, Any] | None) -> tuple[int, bool]:
    """A ``PyTorchTrainable`` config, checked once before Tune starts any trial (its keys, the creators'
    signatures, a DDP group shape that is not searched); returns the group's ``(num_replicas, use_gpu)``."""
    config = dict(config_example or {})
    _check_tune_keys(config)
    _check_not_searched(config, ("num_replicas", "use_gpu"))
    n, use_gpu = _check_group_shape(
        _arg_namer(True), config.get("num_replicas", 1), config.get("use_gpu", False)
    )
    for key, counts, usage in (
        ("model_creator", (1,), "model_creator(config)"),
        ("optimizer_creator", (2,), "optimizer_creator(model, config)"),
    ):
        if callable(config.get(key)):
            _check_callable(f'config["{key}"]', config[key], counts, usage)
    if callable(config.get("data_creator")):
        _data_creator_takes_batch_size('config["data_creator"]', config["data_creator"])
    return n, use_gpu
