"""The trainer's state as a file: ``STATE_FILE`` in a checkpoint directory, a ``torch.save`` of Ray's
``get_state()`` dict ``{"epoch", "models", "optimizers", "stats"}``. Rank 0 writes it after each training
epoch (``sweepflow.sgd.replica``); the ranks and the driver (``PyTorchTrainer.get_model``/``save``/``restore``)
read it. Files saved by Ray's own ``PyTorchTrainer.save`` are read too (``normalized_state``).
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch
from torch import nn

from ddp_runtime import Checkpoint

__all__ = [
    "STATE_FILE",
    "load_models",
    "load_state",
    "normalized_state",
    "read_state",
    "read_state_file",
    "state_bytes",
    "state_of",
]

STATE_FILE = "state.pt"  # torch.save of {"epoch", "models", "optimizers", "stats"}: Ray's get_state() format


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def state_of(models: list[nn.Module], optimizers: list[torch.optim.Optimizer], epoch: int) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "models": [{k: v.detach().cpu() for k, v in _unwrap(m).state_dict().items()} for m in models],
        "optimizers": [o.state_dict() for o in optimizers],
        "stats": {"epoch": epoch},
    }


def normalized_state(state: Any, source: str) -> dict[str, Any]:
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


def load_models(models: list[nn.Module], state: dict[str, Any]) -> None:
    if len(state["models"]) != len(models):
        raise ValueError(
            f"the checkpoint holds {len(state['models'])} model(s) but model_creator builds {len(models)}"
        )
    for model, state_dict in zip(models, state["models"], strict=True):
        _unwrap(model).load_state_dict(state_dict)


def load_state(
    models: list[nn.Module], optimizers: list[torch.optim.Optimizer], state: dict[str, Any]
) -> int:
    """Loads ``state`` into a rank's models and optimizers; returns the epoch it was saved after."""
    load_models(models, state)
    if state["optimizers"]:
        if len(state["optimizers"]) != len(optimizers):
            raise ValueError(
                f"the checkpoint holds {len(state['optimizers'])} optimizer(s) but optimizer_creator builds "
                f"{len(optimizers)}"
            )
        for optimizer, state_dict in zip(optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(state_dict)
    return int(state["epoch"])


def read_state(checkpoint: Checkpoint) -> dict[str, Any]:
    with checkpoint.as_directory() as directory:
        state = torch.load(os.path.join(directory, STATE_FILE), map_location="cpu", weights_only=True)
    return normalized_state(state, repr(checkpoint))


def read_state_file(path: str) -> dict[str, Any]:
    """A state file written by ``PyTorchTrainer.save`` (or Ray's)."""
    return normalized_state(torch.load(path, map_location="cpu", weights_only=True), repr(path))


def state_bytes(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()
