"""The forecaster of tests/support/forecast_project, sharded: ``prepare_model(parallel_strategy="fsdp")`` on every rank,
each epoch a ``torch.distributed.checkpoint`` save of the sharded model from every rank, reported from every
rank (``report`` merges their files into one checkpoint). ``model_fn`` turns that sharded checkpoint into one
full state dict (``ddp_runtime.sharded.load_full_state_dict``) and returns the plain module, for the pipeline's
evaluation and registry."""

from __future__ import annotations

import json
import os
import tempfile

import fsspec
import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ddp_runtime as train
from ddp_runtime.sharded import load_full_state_dict
from ddp_runtime.torch import prepare_data_loader, prepare_model

WINDOW = 16


def prepare(raw_dir: str, out_dir: str) -> None:
    windows = {"train": [], "val": [], "test": []}
    for name in sorted(os.listdir(raw_dir)):
        if not name.endswith(".csv"):
            continue
        values = pd.read_csv(os.path.join(raw_dir, name))["value"].to_numpy(np.float32)
        cut = np.lib.stride_tricks.sliding_window_view(values, WINDOW + 1)
        n = len(cut)
        bounds = {
            "train": (0, int(n * 0.7)),
            "val": (int(n * 0.7), int(n * 0.85)),
            "test": (int(n * 0.85), n),
        }
        for split, (lo, hi) in bounds.items():
            windows[split].append(cut[lo:hi])
    for split, parts in windows.items():
        both = np.concatenate(parts)
        np.savez(os.path.join(out_dir, f"{split}.npz"), x=both[:, :WINDOW], y=both[:, WINDOW])


def _split(data_path: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    with fsspec.open(f"{data_path}/{split}.npz", "rb") as f, np.load(f) as npz:
        return torch.from_numpy(npz["x"]), torch.from_numpy(npz["y"])


class Forecaster(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(WINDOW, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).sum(-1)  # not a view (squeeze would be one, which FSDP2 warns about)


def train_fn(config: dict) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    x, y = _split(config["data_path"], "train")
    val_x, val_y = _split(config["data_path"], "val")
    torch.manual_seed(config.get("seed", 0))
    model = prepare_model(Forecaster(config["hidden"]), parallel_strategy="fsdp")
    loader = prepare_data_loader(DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True))
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    rank = train.get_context().get_world_rank()
    for epoch in range(config["epochs"]):
        if train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():  # every rank runs the forward: FSDP gathers the parameters for it
            val_mse = float(nn.functional.mse_loss(model(val_x), val_y))
        with tempfile.TemporaryDirectory() as d:
            dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=d)  # this rank's shard
            if rank == 0:
                with open(os.path.join(d, "hparams.json"), "w") as f:
                    json.dump({"hidden": config["hidden"]}, f)
            train.report(
                {"epoch": epoch + 1, "val_mse": val_mse}, checkpoint=train.Checkpoint.from_directory(d)
            )


def model_fn(checkpoint: train.Checkpoint) -> nn.Module:
    with checkpoint.as_directory() as d, open(os.path.join(d, "hparams.json")) as f:
        hidden = json.load(f)["hidden"]
    model = Forecaster(hidden)
    model.load_state_dict(load_full_state_dict(checkpoint, key="model"))
    return model.eval()


def evaluate_fn(checkpoint: train.Checkpoint, data_path: str) -> dict[str, float]:
    model = model_fn(checkpoint)
    x, y = _split(data_path, "test")
    with torch.no_grad():
        error = model(x) - y
    naive = x[:, -1] - y  # tomorrow = today: what a forecaster must beat
    return {
        "mse": float(error.pow(2).mean()),
        "mae": float(error.abs().mean()),
        "naive_mse": float(naive.pow(2).mean()),
    }
