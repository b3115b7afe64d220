"""Ray SGD's creator-style ``PyTorchTrainer`` and ``PyTorchTrainable`` (Ray 0.7.x-0.8.x,
``ray.experimental.sgd.pytorch`` / ``ray.util.sgd.pytorch``) on ddp_runtime's DDP groups.

A Ray script changes only its import::

    from sweepflow.sgd.pytorch import PyTorchTrainer  # was: from ray.experimental.sgd.pytorch import ...

    trainer = PyTorchTrainer(model_creator, data_creator, optimizer_creator, loss_creator=nn.MSELoss,
                             num_replicas=2, batch_size=512)
    stats = trainer.train()          # one epoch on every replica: {"train_loss": ..., "epoch": 1, ...}
    trainer.validate()               # {"validation_loss": ..., "mean_accuracy": ..., ...}
    model = trainer.get_model()      # the trained nn.Module, on the CPU
    trainer.save(path); trainer.restore(path); trainer.shutdown()

Ray kept one actor per replica alive between calls. Here each ``train()``/``validate()`` is one short DDP group
(``ddp_runtime.torch.TorchTrainer``) of ``num_replicas`` ranks: every rank builds the model, optimizer, loss and
data with the creators, loads the trainer's state (model and optimizer ``state_dict``s, epoch) from a checkpoint,
runs one epoch, averages the stats across ranks, and rank 0 reports them with the new state as a checkpoint.
The state lives in a directory the trainer owns (a temporary one by default), removed by ``shutdown()``.

Creators are called as Ray called them: ``model_creator(config)``, ``optimizer_creator(model, config)``,
``loss_creator(config)`` or a loss class, ``data_creator(batch_size, config)`` (Ray 0.8) or
``data_creator(config)`` (Ray 0.7), returning a Dataset or DataLoader, or a (train, validation) pair of them.
``batch_size`` is the global batch: each replica gets ``batch_size // num_replicas``, as in Ray.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import math
import numbers
import os
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
from torch import nn
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

import ddp_runtime
from ddp_runtime import Checkpoint, RunConfig, ScalingConfig, TorchConfig
from ddp_runtime.torch import TorchTrainer, prepare_data_loader, prepare_model

__all__ = ["PyTorchTrainable", "PyTorchTrainer", "sgd_mse_optimizer", "train", "validate"]

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"  # torch.save of {"epoch", "models", "optimizers", "stats"}: Ray's get_state() format
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


# ------------------------------------------------------------------------------------ validation (driver)


def _arg_namer(tune: bool) -> Callable[[str], str]:
    return (lambda name: f'config["{name}"]') if tune else (lambda name: name)


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _positional_fit(fn: Any, counts: tuple[int, ...]) -> int | None:
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
    fit = _positional_fit(fn, counts)
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
        if first == "config" and _positional_fit(fn, (1,)) == 1:
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


@dataclass(frozen=True)
class _Plan:
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


def _make_plan(
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
) -> _Plan:
    arg = _arg_namer(tune)
    n, use_gpu = _check_group_shape(arg, num_replicas, use_gpu)
    batch_size = _check_int(
        arg("batch_size"),
        batch_size,
        n,
        f"it is the global batch size, split across the {n} replicas (each gets batch_size // num_replicas)",
    )
    if backend not in _BACKENDS:
        raise ValueError(f"{arg('backend')} must be one of {_BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = "nccl" if use_gpu else "gloo"
    if backend == "nccl" and not use_gpu:
        raise ValueError(
            f'{arg("backend")}="nccl" needs GPUs: set {arg("use_gpu")}=True, or use backend="gloo"'
        )
    if config is not None and not isinstance(config, dict):
        raise TypeError(f"{arg('config')} must be a dict (passed to every creator) or None, got {config!r}")
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
    if batch_size % n:
        log.warning(
            "Changing batch size from %d to %d to evenly distribute batches across %d replicas.",
            batch_size,
            batch_size // n * n,
            n,
        )
    return _Plan(
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
    from sweepflow.tune.search_space import Domain, _is_grid

    for key in keys:
        if _is_grid(config.get(key)) or isinstance(config.get(key), Domain):
            raise ValueError(
                f'config["{key}"] is searched ({config[key]!r}), but every trial of one tune.run is a DDP group '
                f'of the same shape: give config["{key}"] one value, and run one tune.run per value to compare'
            )


def _plan_from_tune_config(config: dict[str, Any]) -> tuple[_Plan, int | None]:
    _check_tune_keys(config)
    epochs = config.get("epochs")
    if epochs is not None:
        epochs = _check_int(
            'config["epochs"]', epochs, 1, "or leave it out to train until Tune stops the trial"
        )
    return _make_plan(tune=True, **{k: v for k, v in config.items() if k in _TRAINER_KEYS}), epochs


# ----------------------------------------------------------------------------------- what runs on the ranks


def sgd_mse_optimizer(model: nn.Module, config: dict[str, Any]) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Ray 0.7's default ``optimizer_creator``: MSE loss and SGD with ``config.get("lr", 1e-4)``."""
    return nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-4))


class _Average:
    def __init__(self) -> None:
        self.sum = 0.0
        self.count = 0

    def update(self, value: float, n: int = 1) -> None:
        self.sum += value * n
        self.count += n

    @property
    def avg(self) -> float:
        return self.sum / self.count if self.count else 0.0


def _single(kind: str, value: Any) -> Any:
    if isinstance(value, list | tuple):
        raise ValueError(
            f"the default training and validation functions handle one model and one optimizer; with several "
            f"{kind}, pass train_function=... and validation_function=..."
        )
    return value


def train(
    model: nn.Module,
    train_iterator: Any,
    criterion: Any,
    optimizer: torch.optim.Optimizer,
    config: dict[str, Any],
) -> dict[str, Any]:
    """The default ``train_function``: one pass over ``train_iterator`` (Ray's ``pytorch.utils.train``).

    Returns Ray's stats: ``train_loss`` (mean per sample), ``batch_processed`` (samples seen by this replica),
    ``batch_time`` and ``data_time`` (mean seconds per batch)."""
    model, optimizer = _single("models", model), _single("optimizers", optimizer)
    batch_time, data_time, losses = _Average(), _Average(), _Average()
    model.train()
    end = time.perf_counter()
    for features, target in train_iterator:
        data_time.update(time.perf_counter() - end)
        output = model(features)
        loss = criterion(output, target)
        losses.update(loss.item(), features.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch_time.update(time.perf_counter() - end)
        end = time.perf_counter()
    return {
        "batch_time": batch_time.avg,
        "batch_processed": losses.count,
        "train_loss": losses.avg,
        "data_time": data_time.avg,
    }


def validate(model: nn.Module, val_iterator: Any, criterion: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The default ``validation_function`` (Ray's ``pytorch.utils.validate``): ``validation_loss`` (mean per
    sample), ``mean_accuracy`` (argmax over classes for (N, C) outputs, exact match otherwise), ``batch_time``."""
    model = _single("models", model)
    batch_time, losses = _Average(), _Average()
    correct = total = 0
    model.eval()
    with torch.no_grad():
        end = time.perf_counter()
        for features, target in val_iterator:
            output = model(features)
            loss = criterion(output, target)
            predicted = output.argmax(1) if output.dim() >= 2 and output.size(1) > 1 else output
            if predicted.numel() == target.numel():
                correct += (predicted == target.view_as(predicted)).sum().item()
            total += target.size(0)
            losses.update(loss.item(), features.size(0))
            batch_time.update(time.perf_counter() - end)
            end = time.perf_counter()
    return {
        "batch_time": batch_time.avg,
        "validation_loss": losses.avg,
        "mean_accuracy": correct / total if total else float("nan"),
    }


@dataclass
class _Parts:
    """What the creators built on one rank."""

    models: list[nn.Module]
    optimizers: list[torch.optim.Optimizer]
    criterion: Any
    train_data: Any  # a DataLoader on ranks; the creator's Dataset or DataLoader in the setup task
    validation_data: Any

    @property
    def given_models(self) -> Any:
        return self.models[0] if len(self.models) == 1 else self.models

    @property
    def given_optimizers(self) -> Any:
        return self.optimizers[0] if len(self.optimizers) == 1 else self.optimizers


def _call_hook(plan: _Plan) -> None:
    hook = plan.initialization_hook
    if hook is None:
        return
    if _positional_fit(hook, (0, 1)) == 0:
        hook()
    else:
        hook(None)  # Ray 0.8.0 passed its runner actor; there is none here


@contextlib.contextmanager
def _data_lock() -> Iterator[None]:
    """Ranks on one host create their data one at a time (Ray: FileLock("~/.ray_data.lock")): one download."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(os.path.join(tempfile.gettempdir(), "sweepflow_sgd_data.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _describe(value: Any) -> str:
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}: ({', '.join(type(v).__name__ for v in value)})"
    return f"a {type(value).__name__}"


def _split_data(data: Any) -> tuple[Any, Any]:
    """The data_creator's result as (train, validation-or-None), each a map-style Dataset or a DataLoader."""
    items = list(data) if isinstance(data, tuple | list) else [data]
    problem = None
    if not 1 <= len(items) <= 2:
        problem = f"it returned {_describe(data)}"
    else:
        for i, item in enumerate(items):
            if i == 1 and item is None:
                continue
            if isinstance(item, IterableDataset) or (
                isinstance(item, DataLoader) and isinstance(item.dataset, IterableDataset)
            ):
                problem = (
                    f"element {i} is an IterableDataset, which cannot be sharded across replicas; "
                    "use a map-style Dataset"
                )
            elif not isinstance(item, Dataset | DataLoader):
                hint = (
                    ": wrap tensors as torch.utils.data.TensorDataset(x, y)" if torch.is_tensor(item) else ""
                )
                problem = f"it returned {_describe(data)}; element {i} is not a Dataset or DataLoader{hint}"
            if problem:
                break
    if problem:
        raise ValueError(
            "data_creator must return a training Dataset or DataLoader, or a (train, validation) pair of them "
            f"(e.g. `return LinearDataset(2, 5), LinearDataset(2, 5, size=400)`), but {problem}"
        )
    return items[0], items[1] if len(items) == 2 else None


def _split_optimizers(created: Any) -> tuple[list[torch.optim.Optimizer], Any]:
    """optimizer_creator's result: an optimizer, a list of them, or Ray 0.7's (criterion, optimizer) pair."""
    if isinstance(created, torch.optim.Optimizer):
        return [created], None
    if isinstance(created, tuple | list) and created:
        optimizers = [o for o in created if isinstance(o, torch.optim.Optimizer)]
        others = [o for o in created if not isinstance(o, torch.optim.Optimizer)]
        if len(optimizers) == len(created):
            return optimizers, None
        if len(created) == 2 and len(optimizers) == 1 and callable(others[0]):
            return optimizers, others[0]  # Ray 0.7: optimizer_creator returned (criterion, optimizer)
    raise TypeError(
        "optimizer_creator(model, config) must return a torch.optim.Optimizer (or a list of them; Ray 0.7's "
        f"(criterion, optimizer) pair works too), got {_describe(created)}"
    )


def _make_criterion(plan: _Plan, legacy: Any) -> Any:
    loss_creator = plan.loss_creator
    if loss_creator is None:
        return legacy if legacy is not None else nn.MSELoss()
    if isinstance(loss_creator, nn.Module):
        return loss_creator
    if inspect.isclass(loss_creator):
        return loss_creator()
    criterion = loss_creator(plan.config)
    if not callable(criterion):
        raise TypeError(
            f"loss_creator(config) must return a loss (e.g. nn.MSELoss()), got {_describe(criterion)}"
        )
    return criterion


def _loader(plan: _Plan, data: Any, *, shuffle: bool) -> Any:
    """A rank's loader: datasets get batch_size // num_replicas; shardable loaders get a DistributedSampler."""
    if data is None:
        return None
    loader = (
        data
        if isinstance(data, DataLoader)
        else DataLoader(data, batch_size=plan.batch_size_per_replica, shuffle=shuffle)
    )
    shardable = loader.batch_size is not None and isinstance(
        loader.sampler, RandomSampler | SequentialSampler | DistributedSampler
    )
    if not shardable and plan.num_replicas > 1:
        log.warning(
            "data_creator's DataLoader has a custom sampler (%s): every replica iterates all of it",
            type(loader.sampler).__name__,
        )
    return prepare_data_loader(loader, add_dist_sampler=shardable)


def _create(plan: _Plan, *, on_rank: bool) -> _Parts:
    """Call the creators as Ray did; on a rank, also move to the device, wrap in DDP and shard the data."""
    _call_hook(plan)
    created = plan.model_creator(plan.config)
    models = list(created) if isinstance(created, tuple | list) else [created]
    if not models or not all(isinstance(m, nn.Module) for m in models):
        raise TypeError(
            f"model_creator(config) must return a torch.nn.Module (or a list of them), got {_describe(created)}"
        )
    if on_rank:
        models = [prepare_model(m) for m in models]
    given = models[0] if len(models) == 1 else models
    optimizers, legacy_criterion = _split_optimizers(
        (plan.optimizer_creator or sgd_mse_optimizer)(given, plan.config)
    )
    criterion = _make_criterion(plan, legacy_criterion)
    with _data_lock():
        if plan.data_creator_takes_batch_size:
            data = plan.data_creator(plan.batch_size_per_replica, plan.config)
        else:
            data = plan.data_creator(plan.config)
    train_data, validation_data = _split_data(data)
    if on_rank:
        if isinstance(criterion, nn.Module):
            criterion = criterion.to(ddp_runtime.get_context().get_device())
        train_data = _loader(plan, train_data, shuffle=True)
        validation_data = _loader(plan, validation_data, shuffle=False)
    return _Parts(models, optimizers, criterion, train_data, validation_data)


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _state_of(parts: _Parts, epoch: int) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "models": [{k: v.detach().cpu() for k, v in _unwrap(m).state_dict().items()} for m in parts.models],
        "optimizers": [o.state_dict() for o in parts.optimizers],
        "stats": {"epoch": epoch},
    }


def _normalized_state(state: Any, source: str) -> dict[str, Any]:
    """Our state, or a state saved by Ray's PyTorchTrainer.save ("models"/"optimizers", or 0.7's "model")."""
    if not isinstance(state, dict) or not ("models" in state or "model" in state):
        raise ValueError(
            f"{source} is not a PyTorchTrainer checkpoint (a torch.save'd dict with 'models' and 'optimizers'); "
            "restore a file written by PyTorchTrainer.save"
        )
    models = state["models"] if "models" in state else [state["model"]]
    optimizers = state.get("optimizers", [state["optimizer"]] if "optimizer" in state else [])
    epoch = int(state.get("epoch", (state.get("stats") or {}).get("epoch", 0)))
    return {"epoch": epoch, "models": list(models), "optimizers": list(optimizers), "stats": {"epoch": epoch}}


def _load_models(models: list[nn.Module], state: dict[str, Any]) -> None:
    if len(state["models"]) != len(models):
        raise ValueError(
            f"the checkpoint holds {len(state['models'])} model(s) but model_creator builds {len(models)}"
        )
    for model, state_dict in zip(models, state["models"], strict=True):
        _unwrap(model).load_state_dict(state_dict)


def _load_state(parts: _Parts, state: dict[str, Any]) -> int:
    _load_models(parts.models, state)
    if state["optimizers"]:
        if len(state["optimizers"]) != len(parts.optimizers):
            raise ValueError(
                f"the checkpoint holds {len(state['optimizers'])} optimizer(s) but optimizer_creator builds "
                f"{len(parts.optimizers)}"
            )
        for optimizer, state_dict in zip(parts.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(state_dict)
    return int(state["epoch"])


def _read_state(checkpoint: Checkpoint) -> dict[str, Any]:
    with checkpoint.as_directory() as directory:
        state = torch.load(os.path.join(directory, STATE_FILE), map_location="cpu", weights_only=True)
    return _normalized_state(state, repr(checkpoint))


def _state_bytes(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _plain(value: Any) -> Any:
    if torch.is_tensor(value) and value.numel() == 1:
        return value.item()
    item = getattr(value, "item", None)  # numpy scalars
    return item() if callable(item) and not isinstance(value, int | float) else value


def _is_float(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)


def _combine(stats: dict[str, Any]) -> dict[str, Any]:
    """Stats averaged across ranks (floats: mean over ranks that have them, NaNs ignored; the rest: rank 0's)."""
    stats = {k: _plain(v) for k, v in stats.items()}
    ctx = ddp_runtime.get_context()
    if ctx.get_world_size() == 1:
        return stats
    import torch.distributed as dist

    gathered: list[Any] = [None] * ctx.get_world_size()
    dist.all_gather_object(gathered, stats)
    combined = dict(gathered[0])
    for key, value in combined.items():
        if _is_float(value):
            values = [float(s[key]) for s in gathered if _is_float(s.get(key)) and not math.isnan(s[key])]
            combined[key] = sum(values) / len(values) if values else float("nan")
    return combined


def _epoch_stats(label: str, stats: Any) -> dict[str, Any]:
    if not isinstance(stats, dict):
        raise TypeError(f"{label} must return a dict of stats, got {_describe(stats)}")
    return dict(stats)


def _train_epoch(plan: _Plan, parts: _Parts, epoch: int) -> dict[str, Any]:
    sampler = getattr(parts.train_data, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)  # a fresh shuffle every epoch, though every epoch is a new group
    fn = plan.train_function or train
    stats = fn(parts.given_models, parts.train_data, parts.criterion, parts.given_optimizers, plan.config)
    return _epoch_stats("train_function", stats)


def _validate_epoch(plan: _Plan, parts: _Parts) -> dict[str, Any]:
    fn = plan.validation_function or validate
    return _epoch_stats(
        "validation_function", fn(parts.given_models, parts.validation_data, parts.criterion, plan.config)
    )


def _report(metrics: dict[str, Any], parts: _Parts, epoch: int, *, with_state: bool) -> None:
    """Every rank reports; rank 0 attaches the new state as the checkpoint."""
    if not with_state or ddp_runtime.get_context().get_world_rank() != 0:
        ddp_runtime.report(metrics)
        return
    with tempfile.TemporaryDirectory(prefix="sweepflow-sgd-state-") as directory:
        torch.save(_state_of(parts, epoch), os.path.join(directory, STATE_FILE))
        ddp_runtime.report(metrics, checkpoint=Checkpoint.from_directory(directory))


def _resume(parts: _Parts) -> int:
    checkpoint = ddp_runtime.get_checkpoint()
    return _load_state(parts, _read_state(checkpoint)) if checkpoint is not None else 0


def _trainer_rank(loop_config: dict[str, Any]) -> None:
    """One ``PyTorchTrainer.train()`` or ``validate()`` call, on one rank."""
    plan: _Plan = loop_config["plan"]
    parts = _create(plan, on_rank=True)
    epoch = _resume(parts)
    if loop_config["mode"] == "train":
        stats = _train_epoch(plan, parts, epoch)
        epoch += 1
    else:
        stats = _validate_epoch(plan, parts)
    stats["epoch"] = epoch
    _report({"stats": _combine(stats)}, parts, epoch, with_state=loop_config["mode"] == "train")


def _trainable_rank(config: dict[str, Any]) -> None:
    """A PyTorchTrainable trial on one rank: epoch after epoch (train, then validate) until Tune stops it
    (``report`` raises) or ``config["epochs"]`` is reached; resumes from the trial's checkpoint."""
    plan, epochs = _plan_from_tune_config(config)
    parts = _create(plan, on_rank=True)
    epoch = _resume(parts)
    while epochs is None or epoch < epochs:
        stats = _train_epoch(plan, parts, epoch)
        epoch += 1
        if parts.validation_data is not None:
            stats.update(_validate_epoch(plan, parts))
        stats["epoch"] = epoch
        _report(_combine(stats), parts, epoch, with_state=True)


def _setup(plan: _Plan) -> dict[str, Any]:
    """A plain Dask task (not a group): calls every creator once, checks what they return, and returns the
    initial state, so mistakes surface at construction, as with Ray's actors' setup()."""
    parts = _create(plan, on_rank=False)
    return {"state": _state_bytes(_state_of(parts, 0)), "has_validation": parts.validation_data is not None}


# ------------------------------------------------------------------------------------------------- driver


def _remove_tree(path: str | None, storage_options: dict[str, Any] | None) -> None:
    if not path:
        return
    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    with contextlib.suppress(FileNotFoundError):
        fs.rm(root, recursive=True)


class PyTorchTrainer:
    """Train a PyTorch model with ``num_replicas`` DDP replicas on a Dask cluster (Ray's ``PyTorchTrainer``).

    Uses the current Dask client (``distributed.default_client()``); with none, starts a local cluster of
    ``num_replicas`` worker processes that ``shutdown()`` closes. ``storage_path``/``storage_options``
    (sweepflow only) put the trainer's state on shared storage (fsspec URI) for clusters spanning hosts;
    by default it is a temporary directory on this host.
    """

    def __init__(
        self,
        model_creator: Callable[[dict[str, Any]], Any],
        data_creator: Callable[..., Any],
        optimizer_creator: Callable[[Any, dict[str, Any]], Any] | None = None,
        loss_creator: Any = None,
        train_function: Callable[..., dict[str, Any]] | None = None,
        validation_function: Callable[..., dict[str, Any]] | None = None,
        initialization_hook: Callable[..., Any] | None = None,
        config: dict[str, Any] | None = None,
        num_replicas: int = 1,
        use_gpu: bool = False,
        batch_size: int = 16,
        backend: str = "auto",
        *,
        storage_path: str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self._plan = _make_plan(
            model_creator=model_creator,
            data_creator=data_creator,
            optimizer_creator=optimizer_creator,
            loss_creator=loss_creator,
            train_function=train_function,
            validation_function=validation_function,
            initialization_hook=initialization_hook,
            config=config,
            num_replicas=num_replicas,
            use_gpu=use_gpu,
            batch_size=batch_size,
            backend=backend,
        )
        self.config = self._plan.config
        self._storage_options = dict(storage_options or {}) or None
        if storage_path is None:
            self._root = tempfile.mkdtemp(prefix="sweepflow-sgd-")
        else:
            self._root = f"{storage_path.rstrip('/')}/sweepflow-sgd-{uuid.uuid4().hex[:12]}"
        self._remove_root = weakref.finalize(self, _remove_tree, self._root, self._storage_options)
        self._stack = contextlib.ExitStack()
        self._closed = False
        self._calls = 0
        self._state: Checkpoint | None = None
        self._state_home: str | None = None
        try:
            self._client = self._connect()
            setup = self._client.submit(_setup, self._plan, pure=False).result()
            self._has_validation = setup["has_validation"]
            self._put_state(setup["state"])
        except BaseException:
            self.shutdown()
            raise

    # -------------------------------------------------------------------------------------------- cluster

    def _connect(self) -> Any:
        from distributed import default_client

        try:
            return default_client()
        except ValueError:
            pass  # no client in this process: start a cluster for this trainer
        from ddp_runtime.cluster import gpu_local_cluster, local_cluster

        if self._plan.use_gpu:
            return self._stack.enter_context(gpu_local_cluster())
        return self._stack.enter_context(local_cluster(n_workers=self._plan.num_replicas))

    # ---------------------------------------------------------------------------------------------- state

    def _put_state(self, data: bytes) -> None:
        """Make ``data`` (a torch.save'd state) the trainer's state: a new directory under the root."""
        self._calls += 1
        home = f"{self._root}/state-{self._calls:04d}"
        fs, path = fsspec.core.url_to_fs(home, **(self._storage_options or {}))
        fs.makedirs(path, exist_ok=True)
        fs.pipe_file(f"{path}/{STATE_FILE}", data)
        self._set_state(Checkpoint(home, storage_options=self._storage_options), home)

    def _set_state(self, checkpoint: Checkpoint, home: str) -> None:
        previous, self._state, self._state_home = self._state_home, checkpoint, home
        _remove_tree(previous, self._storage_options)

    def _current_state(self) -> dict[str, Any]:
        self._check_open()
        assert self._state is not None
        return _read_state(self._state)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this PyTorchTrainer was shut down; create a new one")

    # ----------------------------------------------------------------------------------------------- runs

    def _run_group(self, mode: str) -> dict[str, Any]:
        self._check_open()
        self._calls += 1
        name = f"{mode}-{self._calls:04d}"
        plan = self._plan
        try:
            result = TorchTrainer(
                _trainer_rank,
                train_loop_config={"plan": plan, "mode": mode},
                scaling_config=ScalingConfig(num_workers=plan.num_replicas, use_gpu=plan.use_gpu),
                run_config=RunConfig(
                    name=name, storage_path=self._root, storage_options=self._storage_options
                ),
                torch_config=TorchConfig(backend=plan.backend),
                resume_from_checkpoint=self._state,
                client=self._client,
            ).fit()
        except BaseException:
            _remove_tree(f"{self._root}/{name}", self._storage_options)
            raise
        stats = dict((result.metrics or {}).get("stats") or {})
        if mode == "train":
            if result.checkpoint is None:
                raise RuntimeError(f"the training group {name} ended without reporting its state")
            self._set_state(result.checkpoint, result.path)
        else:
            _remove_tree(result.path, self._storage_options)
        return stats

    def train(self) -> dict[str, Any]:
        """Runs one training epoch on every replica; returns the stats averaged over replicas
        (``train_loss``, ``epoch``, ``batch_processed``, ``batch_time``, ``data_time`` with the default
        ``train_function``)."""
        return self._run_group("train")

    def validate(self) -> dict[str, Any]:
        """Evaluates the model on the validation set on every replica; returns the averaged stats
        (``validation_loss``, ``mean_accuracy``, ``batch_time``, ``epoch`` with the default function)."""
        self._check_open()
        if not self._has_validation:
            raise ValueError(
                "No validation dataloader provided: data_creator returned only a training set; "
                "return (train, validation) from data_creator to use validate()"
            )
        return self._run_group("validate")

    def get_model(self) -> Any:
        """The trained model(s), built by ``model_creator(config)`` on this process, on the CPU."""
        state = self._current_state()
        created = self._plan.model_creator(self._plan.config)
        _load_models(list(created) if isinstance(created, tuple | list) else [created], state)
        return created

    def save(self, checkpoint: str | os.PathLike[str]) -> str | os.PathLike[str]:
        """Saves the model(s), optimizer(s) and epoch to the file ``checkpoint`` (torch.save); returns it."""
        self._check_open()
        assert self._state is not None
        with self._state.as_directory() as directory:
            shutil.copyfile(os.path.join(directory, STATE_FILE), checkpoint)
        return checkpoint

    def restore(self, checkpoint: str | os.PathLike[str] | Checkpoint) -> None:
        """Restores the state saved by ``save(checkpoint)`` (also a file saved by Ray's PyTorchTrainer), or a
        ``PyTorchTrainable`` trial's checkpoint: its directory (``trial.checkpoint.value``) or ``Checkpoint``."""
        self._check_open()
        if isinstance(checkpoint, Checkpoint):
            state = _read_state(checkpoint)
        else:
            path = os.fspath(checkpoint)
            if os.path.isdir(path):
                if not os.path.isfile(os.path.join(path, STATE_FILE)):
                    raise ValueError(
                        f"{path!r} is a directory without {STATE_FILE}: not a PyTorchTrainable checkpoint; "
                        "restore a trial's checkpoint directory or a file written by PyTorchTrainer.save"
                    )
                path = os.path.join(path, STATE_FILE)
            state = _normalized_state(torch.load(path, map_location="cpu", weights_only=True), repr(path))
        created = self._plan.model_creator(self._plan.config)
        _load_models(
            list(created) if isinstance(created, tuple | list) else [created], state
        )  # fails here on a mismatch
        self._put_state(_state_bytes(state))

    def shutdown(self) -> None:
        """Removes the trainer's state and closes the cluster it started (not a cluster it found)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._remove_root()
        finally:
            self._stack.close()

    def __enter__(self) -> PyTorchTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class PyTorchTrainable:
    """Ray's Tune trainable for ``PyTorchTrainer``: ``tune.run(PyTorchTrainable, config={...})`` where the
    config holds PyTorchTrainer's arguments (``model_creator``, ``data_creator``, ``optimizer_creator``,
    ``loss_creator``, ``num_replicas``, ``use_gpu``, ``batch_size``, ``backend``, ``config``, ...).

    Each trial is one DDP group of ``num_replicas`` ranks that trains epoch after epoch, reporting train and
    validation stats with a checkpoint every epoch, until Tune stops it (stop criteria, a scheduler) or
    after ``config["epochs"]`` epochs (sweepflow only); a restarted trial resumes from its checkpoint.
    """

    @classmethod
    def _sweepflow_trial_plan(cls, config_example: dict[str, Any] | None) -> dict[str, Any]:
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
        return {
            "function": _trainable_rank,
            "num_ranks": n,
            "resources_per_rank": {"CPU": 1, "GPU": 1 if use_gpu else 0},
            "use_gpu": use_gpu,
        }
