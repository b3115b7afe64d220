"""What runs on the Dask workers for ``PyTorchTrainer`` and ``PyTorchTrainable``: a rank's loop
(``trainer_rank``: one ``train()``/``validate()`` call; ``trainable_rank``: a Tune trial, epoch after epoch),
the construction-time ``setup_trainer`` task, the creators' calls and the checks of what they return, the
stats' average across ranks, and Ray's default ``train``/``validate`` functions and ``sgd_mse_optimizer``.

``trainer_rank``, ``trainable_rank`` and ``setup_trainer`` are pickled by reference (a worker imports them
from this module by name), so they stay module-level functions of ``sweepflow.sgd.replica``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import numbers
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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
from ddp_runtime import Checkpoint
from ddp_runtime.torch import prepare_data_loader, prepare_model
from sweepflow.sgd.plan import Plan, plan_from_tune_config, positional_fit
from sweepflow.sgd.state import STATE_FILE, load_state, read_state, state_bytes, state_of

__all__ = ["setup_trainer", "sgd_mse_optimizer", "train", "trainable_rank", "trainer_rank", "validate"]

log = logging.getLogger(__name__)


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


def _call_hook(plan: Plan) -> None:
    hook = plan.initialization_hook
    if hook is None:
        return
    if positional_fit(hook, (0, 1)) == 0:
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


def _make_criterion(plan: Plan, legacy: Any) -> Any:
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


def _loader(plan: Plan, data: Any, *, shuffle: bool) -> Any:
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


def _create(plan: Plan, *, on_rank: bool) -> _Parts:
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


def _train_epoch(plan: Plan, parts: _Parts, epoch: int) -> dict[str, Any]:
    sampler = getattr(parts.train_data, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)  # a fresh shuffle every epoch, though every epoch is a new group
    fn = plan.train_function or train
    stats = fn(parts.given_models, parts.train_data, parts.criterion, parts.given_optimizers, plan.config)
    return _epoch_stats("train_function", stats)


def _validate_epoch(plan: Plan, parts: _Parts) -> dict[str, Any]:
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
        torch.save(state_of(parts.models, parts.optimizers, epoch), os.path.join(directory, STATE_FILE))
        ddp_runtime.report(metrics, checkpoint=Checkpoint.from_directory(directory))


def _resume(parts: _Parts) -> int:
    checkpoint = ddp_runtime.get_checkpoint()
    return load_state(parts.models, parts.optimizers, read_state(checkpoint)) if checkpoint is not None else 0


def trainer_rank(loop_config: dict[str, Any]) -> None:
    """One ``PyTorchTrainer.train()`` or ``validate()`` call, on one rank."""
    plan: Plan = loop_config["plan"]
    parts = _create(plan, on_rank=True)
    epoch = _resume(parts)
    if loop_config["mode"] == "train":
        stats = _train_epoch(plan, parts, epoch)
        epoch += 1
    else:
        stats = _validate_epoch(plan, parts)
    stats["epoch"] = epoch
    _report({"stats": _combine(stats)}, parts, epoch, with_state=loop_config["mode"] == "train")


def trainable_rank(config: dict[str, Any]) -> None:
    """A PyTorchTrainable trial on one rank: epoch after epoch (train, then validate) until Tune stops it
    (``report`` raises) or ``config["epochs"]`` is reached; resumes from the trial's checkpoint."""
    plan, epochs = plan_from_tune_config(config)
    parts = _create(plan, on_rank=True)
    epoch = _resume(parts)
    while epochs is None or epoch < epochs:
        stats = _train_epoch(plan, parts, epoch)
        epoch += 1
        if parts.validation_data is not None:
            stats.update(_validate_epoch(plan, parts))
        stats["epoch"] = epoch
        _report(_combine(stats), parts, epoch, with_state=True)


def setup_trainer(plan: Plan) -> dict[str, Any]:
    """A plain Dask task (not a group): calls every creator once, checks what they return, and returns the
    initial state, so mistakes surface at construction, as with Ray's actors' setup()."""
    parts = _create(plan, on_rank=False)
    return {
        "state": state_bytes(state_of(parts.models, parts.optimizers, 0)),
        "has_validation": parts.validation_data is not None,
    }
