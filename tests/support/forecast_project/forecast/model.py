"""A second project for the pipeline's end-to-end test: a time-series forecaster, with its own prepare_fn.

The raw data is a directory of CSV files, one series each (``t,value``); ``prepare`` cuts every series into
windows of ``WINDOW`` past values and the next value, split in time (the last windows of each series are the
test set), into ``train.npz``/``val.npz``/``test.npz``. The model is a small MLP over a window.
"""

from __future__ import annotations

import os
import tempfile

import fsspec
import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ddp_runtime as train
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
        bounds = {"train": (0, int(n * 0.7)), "val": (int(n * 0.7), int(n * 0.85)), "test": (int(n * 0.85), n)}
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
        return self.net(x).squeeze(-1)


def train_fn(config: dict) -> None:
    x, y = _split(config["data_path"], "train")
    val_x, val_y = _split(config["data_path"], "val")
    torch.manual_seed(config.get("seed", 0))
    model = prepare_model(Forecaster(config["hidden"]))
    loader = prepare_data_loader(DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True))
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    core = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    for epoch in range(config["epochs"]):
        if train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            val_mse = float(nn.functional.mse_loss(core(val_x), val_y))
        with tempfile.TemporaryDirectory() as d:
            torch.save({"state": core.state_dict(), "hidden": config["hidden"]}, os.path.join(d, "model.pt"))
            train.report({"epoch": epoch + 1, "val_mse": val_mse}, checkpoint=train.Checkpoint.from_directory(d))


def model_fn(checkpoint: train.Checkpoint) -> tuple[nn.Module, np.ndarray]:
    with checkpoint.as_directory() as d:
        saved = torch.load(os.path.join(d, "model.pt"))
    model = Forecaster(saved["hidden"])
    model.load_state_dict(saved["state"])
    return model.eval(), np.linspace(-1, 1, 4 * WINDOW, dtype=np.float32).reshape(4, WINDOW)


def evaluate_fn(checkpoint: train.Checkpoint, data_path: str) -> dict[str, float]:
    model, _ = model_fn(checkpoint)
    x, y = _split(data_path, "test")
    with torch.no_grad():
        error = model(x) - y
    naive = x[:, -1] - y  # tomorrow = today: what a forecaster must beat
    return {
        "mse": float(error.pow(2).mean()),
        "mae": float(error.abs().mean()),
        "naive_mse": float(naive.pow(2).mean()),
    }


def series_csv(seed: int, length: int = 400) -> str:
    """One generated series: two seasonal waves and noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    value = np.sin(2 * np.pi * t / 50 + seed) + 0.5 * np.sin(2 * np.pi * t / 13) + rng.normal(0, 0.05, length)
    return "t,value\n" + "".join(f"{i},{v:.5f}\n" for i, v in zip(t, value, strict=True))
