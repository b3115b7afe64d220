"""A 2-rank FSDP training function checkpointed with torch.distributed.checkpoint through ``report`` from every
rank, for tests/ddp_runtime/test_fsdp.py (importable on Dask workers via PYTHONPATH)."""

from __future__ import annotations

import json
import os
import signal
import tempfile

import torch
from torch import nn

import ddp_runtime as train
from ddp_runtime.torch import prepare_model

FEATURES = 8


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(512, FEATURES, generator=g)
    y = torch.sin(x[:, :1] * 2) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return x, y


def _mean_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The loss over the whole dataset, the same on every rank (each rank computes its half; all-reduced)."""
    import torch.distributed as dist

    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    with torch.no_grad():
        part = nn.functional.mse_loss(model(x[rank::world]), y[rank::world], reduction="sum")
    dist.all_reduce(part)
    return float(part) / len(x)


def fsdp_regression(config: dict) -> None:
    """``prepare_model(parallel_strategy="fsdp")``, Adam; each epoch a DCP save of the sharded model and optimizer
    from every rank, reported from every rank. On resume (``get_checkpoint()``), the sharded state is loaded with
    ``dcp.load`` and the loss before any step is reported as ``resumed_loss``. With ``config["kill_at"]``, rank 1
    kills its own Dask worker process once that epoch's report returned, on the first attempt only."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    rank = train.get_context().get_world_rank()
    torch.manual_seed(0)
    model = prepare_model(net(), parallel_strategy="fsdp")
    optimizer = torch.optim.Adam(model.parameters(), lr=config.get("lr", 0.01))
    x, y = dataset()
    start, resumed = 0, None
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            model_state, optim_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optim": optim_state}
            dcp.load(state, checkpoint_id=d)
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
            with open(os.path.join(d, "progress.json")) as f:
                start = json.load(f)["epoch"] + 1
        resumed = _mean_loss(model, x, y)
    for epoch in range(start, config["epochs"]):
        for step in range(config.get("steps", 20)):
            rows = slice(rank * 256 + (step % 4) * 64, rank * 256 + (step % 4 + 1) * 64)
            loss = nn.functional.mse_loss(model(x[rows]), y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        metrics = {"epoch": epoch, "loss": _mean_loss(model, x, y)}
        if resumed is not None and epoch == start:
            metrics["resumed_loss"] = resumed
        with tempfile.TemporaryDirectory() as d:
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=d)
            if rank == 0:
                with open(os.path.join(d, "progress.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
            train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))
        once = config.get("once")
        if rank == 1 and epoch == config.get("kill_at") and once and not os.path.exists(once):
            open(once, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # the whole Dask worker process, as the OOM killer would


def prepared_kinds(config: dict) -> None:
    """What prepare_model returns for each parallel_strategy, reported by rank 0."""
    kinds = {
        "ddp": type(prepare_model(net())).__name__,
        "fsdp": type(prepare_model(net(), parallel_strategy="fsdp")).__name__,
        "none": type(prepare_model(net(), parallel_strategy=None)).__name__,
        "device": str(next(prepare_model(net(), move_to_device=torch.device("cpu")).parameters()).device),
    }
    try:
        prepare_model(net(), parallel_strategy="zero3")
    except ValueError as exc:
        kinds["bad"] = f"ValueError: {exc}"
    train.report({"kinds": kinds})
