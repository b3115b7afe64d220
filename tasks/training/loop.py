"""The built-in training function: an image classifier trained with DDP on a prepared dataset.

``train_image_classifier(config)`` runs on every rank of a ``ddp_runtime.torch.TorchTrainer`` group, inside a
Dask worker. It is plain PyTorch and reads top to bottom: build the model, the data and the optimizer from
names in ``config`` (as Ray's legacy ``model_creator`` / ``data_creator`` / ``optimizer_creator`` did), resume
from a checkpoint if the trainer hands one over, then train, validate, report and checkpoint once per epoch.

Config keys (all JSON-able, so a sweep's trial config can be passed as is):

    data_path     prepared dataset directory (``sweepflow.tasks.datasets.prepare_dataset(...).path``); required
    model         "net" (default), "resnet18" or "small_cnn"       (see ``sweepflow.tasks.training.models``)
    epochs        total epochs, counting those already done by a resumed checkpoint (default 10)
    batch_size    per rank (default 64): the global batch is batch_size * world size
    lr            learning rate (default 1e-3)
    optimizer     "adam" (default), "adamw" or "sgd"
    momentum      SGD momentum (default 0.9)
    weight_decay  (default 0.0)
    seed          seeds model init and data order (default 0)
    num_workers   DataLoader worker processes per rank (default 0: the data is already in memory)
    l1, l2 / channels, dropout   model hyperparameters; other keys are ignored

This module must not import Prefect or MLflow: it is imported by Dask workers, which should start fast and
need only torch. Metrics reach MLflow through the driver (``TorchTrainer(on_report=...)``).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - the conventional PyTorch alias
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

import ddp_runtime
from ddp_runtime.torch import prepare_data_loader, prepare_model
from sweepflow.tasks.datasets import load_meta, load_split
from sweepflow.tasks.training.function import with_checks
from sweepflow.tasks.training.hparams import (
    DEFAULTS,
    OPTIMIZERS,
    REPORTS,
    model_hparams,
    validate_config,
    with_defaults,
)
from sweepflow.tasks.training.models import build_model

CHECKPOINT_META = "meta.json"
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
_EVAL_BATCH_SIZE = 512  # evaluation keeps no activations for backward, so much larger batches are cheap


# ------------------------------------------------------------------------------------------------ creators


def make_model(config: Mapping[str, Any], meta: Mapping[str, Any]) -> nn.Module:
    """The model named by ``config['model']``, sized for the dataset described by ``meta`` (its meta.json)."""
    return build_model(
        config.get("model", DEFAULTS["model"]),
        input_shape=tuple(meta["input_shape"]),
        num_classes=int(meta["num_classes"]),
        hparams=config,
    )


def make_loaders(config: Mapping[str, Any]) -> tuple[DataLoader, DataLoader]:
    """(train, val) DataLoaders over the prepared splits; the train loader is not yet sharded.

    The val loader holds only this rank's share (every world_size-th sample). ``DistributedSampler`` would
    pad the split with repeated samples to make shards equal, which would skew the summed metrics; a strided
    split covers every sample exactly once, and the per-rank sums are all-reduced afterwards.
    """
    ctx = ddp_runtime.get_context()
    x_train, y_train = load_split(config["data_path"], "train")
    x_val, y_val = load_split(config["data_path"], "val")
    train = TensorDataset(x_train, y_train)
    val = Subset(TensorDataset(x_val, y_val), range(ctx.get_world_rank(), len(y_val), ctx.get_world_size()))
    num_workers = int(config.get("num_workers", 0))
    batch_size = int(config["batch_size"])
    # A last batch of a single sample makes BatchNorm fail in training mode (one value per channel once the
    # feature map is 1x1, as in ResNet-18 on small images); drop just that one sample per epoch.
    per_rank = math.ceil(len(train) / ctx.get_world_size())
    drop_last = per_rank > batch_size and per_rank % batch_size == 1
    train_loader = DataLoader(
        train, batch_size=batch_size, shuffle=True, num_workers=num_workers, drop_last=drop_last
    )
    val_loader = DataLoader(val, batch_size=_EVAL_BATCH_SIZE, shuffle=False, num_workers=num_workers)
    return train_loader, val_loader


def make_optimizer(config: Mapping[str, Any], params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer named by ``config['optimizer']`` (adam, adamw, sgd)."""
    name = str(config.get("optimizer", DEFAULTS["optimizer"])).lower()
    lr = float(config.get("lr", DEFAULTS["lr"]))
    weight_decay = float(config.get("weight_decay", DEFAULTS["weight_decay"]))
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        momentum = float(config.get("momentum", DEFAULTS["momentum"]))
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; use one of: {', '.join(OPTIMIZERS)}")


# ------------------------------------------------------------------------------------------- the training


@with_checks(validate=validate_config, reports=REPORTS)
def train_image_classifier(config: dict[str, Any]) -> None:
    """Train ``config['model']`` on ``config['data_path']`` on this rank; see the module docstring for keys.

    Reports once per epoch ``{"epoch" (1-based), "train_loss", "val_loss", "val_accuracy"}`` (global over
    all ranks) with a checkpoint from rank 0 (``model.pt``, ``optimizer.pt``, ``meta.json``).
    """
    cfg = with_defaults(config)
    ctx = ddp_runtime.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    is_rank0 = rank == 0  # rank 0 alone writes the checkpoint: the others' would be discarded anyway
    device = ctx.get_device()
    data_meta = load_meta(cfg["data_path"])

    # Same seed on every rank, so each starts from the same weights (DDP would broadcast rank 0's anyway, but
    # a 1-rank run must be reproducible too).
    torch.manual_seed(cfg["seed"])
    model = make_model(cfg, data_meta)
    # Weights go into the bare model before prepare_model, so DDP starts from them on every rank.
    start_epoch, optimizer_state = _resume(cfg, model, device)

    model = prepare_model(model)  # to the rank's device, wrapped in DDP when world_size > 1
    bare_model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    optimizer = make_optimizer(cfg, model.parameters())
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)

    train_loader, val_loader = make_loaders(cfg)
    train_loader = prepare_data_loader(train_loader)  # shards the train split with a DistributedSampler
    val_loader = prepare_data_loader(val_loader, add_dist_sampler=False)  # already this rank's share
    checkpoint_meta = _checkpoint_meta(cfg, data_meta)

    for epoch in range(start_epoch, cfg["epochs"] + 1):
        if world_size > 1:
            train_loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, identical across ranks
        # Seeded per epoch and rank: dropout masks differ across ranks, and an epoch draws the same numbers
        # (data order with one rank, dropout) whether the run went straight through or resumed from the
        # previous epoch's checkpoint, so a resumed trial ends where an uninterrupted one would.
        torch.manual_seed(hash((cfg["seed"], rank, epoch)) % 2**63)

        train_loss_sum, train_count = _train_epoch(model, train_loader, optimizer)
        # Validate on the bare model: each rank sees a different number of val batches, and DDP's forward
        # may issue collectives that would then not match up across ranks.
        val_loss_sum, val_correct, val_count = _evaluate_sums(bare_model, val_loader)
        metrics = _global_metrics(
            epoch, [train_loss_sum, train_count, val_loss_sum, val_correct, val_count], world_size, device
        )

        # Every rank must call report (it is the group's barrier); only rank 0's checkpoint is persisted,
        # so the other ranks skip writing one.
        if is_rank0:
            _report_with_checkpoint(metrics, bare_model, optimizer, {**checkpoint_meta, "epoch": epoch})
        else:
            ddp_runtime.report(metrics)


def _resume(
    cfg: Mapping[str, Any], model: nn.Module, device: torch.device
) -> tuple[int, dict[str, Any] | None]:
    """Load the trainer's checkpoint, if it hands one over, into ``model``: ``(first epoch to train, the
    optimizer's state or None)``. A restarted group (or a trainer given resume_from_checkpoint) continues
    after the last saved epoch."""
    checkpoint = ddp_runtime.get_checkpoint()
    if checkpoint is None:
        return 1, None
    with checkpoint.as_directory() as ckpt_dir:
        saved = _read_checkpoint_meta(ckpt_dir)
        if saved["model"] != cfg["model"]:
            raise ValueError(
                f"cannot resume: the checkpoint holds model {saved['model']!r} but config['model'] is "
                f"{cfg['model']!r}; resume with the same model or start without a checkpoint"
            )
        wanted = model_hparams(cfg["model"], cfg)
        if wanted != saved.get("model_hparams", {}):  # else load_state_dict fails on shape mismatches
            raise ValueError(
                f"cannot resume: the checkpoint's model was built with {saved.get('model_hparams')} but "
                f"the config asks for {wanted}; resume with the checkpoint's model hyperparameters"
            )
        model.load_state_dict(
            torch.load(os.path.join(ckpt_dir, MODEL_FILE), map_location="cpu", weights_only=True)
        )
        optimizer_state = torch.load(
            os.path.join(ckpt_dir, OPTIMIZER_FILE), map_location=device, weights_only=True
        )
    return int(saved["epoch"]) + 1, optimizer_state


def _checkpoint_meta(cfg: Mapping[str, Any], data_meta: Mapping[str, Any]) -> dict[str, Any]:
    """What every checkpoint's meta.json holds besides its epoch: enough to rebuild the model without the
    config (``load_model_from_checkpoint``) and to check a resume against it."""
    return {
        "model": cfg["model"],
        "model_hparams": model_hparams(cfg["model"], cfg),
        "input_shape": [int(v) for v in data_meta["input_shape"]],
        "num_classes": int(data_meta["num_classes"]),
        "dataset": data_meta.get("name"),
        **{key: data_meta[key] for key in ("class_names", "mean", "std") if key in data_meta},
    }


def _train_epoch(
    model: nn.Module, loader: Iterable[Any], optimizer: torch.optim.Optimizer
) -> tuple[float, int]:
    """One pass over ``loader`` in train mode: (summed loss, samples). Sums, not means, so the epoch loss can
    be combined exactly across ranks."""
    model.train()
    loss_sum, count = 0.0, 0
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        loss_sum += loss.item() * len(y)
        count += len(y)
    return loss_sum, count


def _global_metrics(
    epoch: int, sums: list[float], world_size: int, device: torch.device
) -> dict[str, float | int]:
    """The epoch's metrics over all ranks from this rank's ``sums`` (train loss, train samples, val loss, val
    correct, val samples), summed across the group."""
    totals = torch.tensor(sums, dtype=torch.float64)
    if world_size > 1:
        # gloo reduces CPU tensors, NCCL only CUDA ones; one collective carries all five sums.
        reduce_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        totals = totals.to(reduce_device)
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        totals = totals.cpu()
    train_loss_sum, train_count, val_loss_sum, val_correct, val_count = totals.tolist()
    return {
        "epoch": epoch,
        "train_loss": train_loss_sum / max(train_count, 1),
        "val_loss": val_loss_sum / max(val_count, 1),
        "val_accuracy": val_correct / max(val_count, 1),
    }


def _report_with_checkpoint(
    metrics: dict[str, float | int], model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any]
) -> None:
    """Rank 0's report: ``metrics`` with a checkpoint of ``model`` and ``optimizer`` (meta.json: ``meta``)."""
    # In the trial's directory on this worker (its Dask scratch space), not /tmp: a worker killed between
    # writing and reporting leaves it where Dask clears dead workers' spaces, not in /tmp for ever.
    scratch = ddp_runtime.get_context().get_trial_dir()
    with tempfile.TemporaryDirectory(prefix="checkpoint-", dir=scratch) as ckpt_dir:
        _write_checkpoint(ckpt_dir, model, optimizer, meta)
        ddp_runtime.report(metrics, checkpoint=ddp_runtime.Checkpoint.from_directory(ckpt_dir))


@torch.no_grad()
def _evaluate_sums(model: nn.Module, loader: Iterable[Any]) -> tuple[float, int, int]:
    """(summed cross-entropy, correct predictions, samples) of ``model`` over ``loader``, in eval mode."""
    was_training = model.training
    model.eval()  # BatchNorm uses its running stats, dropout is off
    loss_sum, correct, count = 0.0, 0, 0
    for x, y in loader:
        logits = model(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += int((logits.argmax(dim=1) == y).sum().item())
        count += len(y)
    model.train(was_training)
    return loss_sum, correct, count


# ----------------------------------------------------------------------------------------------- checkpoints


def _write_checkpoint(
    directory: str, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any]
) -> None:
    torch.save(
        model.state_dict(), os.path.join(directory, MODEL_FILE)
    )  # the bare module: no "module." prefix
    torch.save(optimizer.state_dict(), os.path.join(directory, OPTIMIZER_FILE))
    with open(os.path.join(directory, CHECKPOINT_META), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)


def _read_checkpoint_meta(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, CHECKPOINT_META)
    try:
        with open(path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{directory!r} is not a train_image_classifier checkpoint (no {CHECKPOINT_META}); pass the "
            "directory of a checkpoint it reported, e.g. result.checkpoint.path"
        ) from None
    missing = [key for key in ("model", "input_shape", "num_classes", "epoch") if key not in meta]
    if missing:
        raise ValueError(f"{path} lacks {missing}; it was not written by train_image_classifier")
    return meta


def load_model_from_checkpoint(
    checkpoint_dir: str | os.PathLike[str] | ddp_runtime.Checkpoint,
) -> nn.Module:
    """Rebuild the model a ``train_image_classifier`` checkpoint holds, with its weights, in eval mode, on CPU.

    Takes a local directory or a ``ddp_runtime.Checkpoint`` (e.g. ``result.checkpoint``, also on S3).
    """
    if isinstance(checkpoint_dir, ddp_runtime.Checkpoint):
        with checkpoint_dir.as_directory() as local_dir:
            return load_model_from_checkpoint(local_dir)
    directory = os.fspath(checkpoint_dir)
    meta = _read_checkpoint_meta(directory)
    model = build_model(
        meta["model"],
        input_shape=tuple(meta["input_shape"]),
        num_classes=int(meta["num_classes"]),
        hparams=meta.get("model_hparams", {}),
    )
    state = torch.load(os.path.join(directory, MODEL_FILE), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()
