"""``sweepflow init DIR --template lightning``: the house-price project with its model as a PyTorch Lightning
``LightningModule``, trained by a Lightning ``Trainer`` on each rank through ``ddp_runtime.lightning`` (Ray's
``ray.train.lightning`` names). The rest of the project (data, sweep.yaml, flow.py, prefect.yaml) is the default
template's (its sweep.yaml too: the same data, search space, scheduler and selection)."""

from __future__ import annotations

MODEL_PY = '''"""{package}'s model: a LightningModule regressor of house prices, trained by a Lightning Trainer on each DDP
rank (ddp_runtime.lightning: Ray Train's Lightning integration).

The four functions sweepflow's pipeline calls (sweep.yaml names them):
    train_fn(config)                      every rank of every trial: pl.Trainer + RayDDPStrategy, reports each
                                          epoch's val_rmse with checkpoint.ckpt (RayTrainReportCallback)
    model_fn(checkpoint)                  the best checkpoint's model, for the registry: the module alone (its
                                          input example: test.csv's first rows), or (module, input_example)
    evaluate_fn(checkpoint, data_path)    the test-set metrics of the best checkpoint (logged as test_<name>)
config["data_path"] is the prepared data: train.csv, val.csv, test.csv and schema.json (format: csv).
Needs the lightning extra: pip install 'sweepflow[lightning]'.
"""

from __future__ import annotations

import json
import os

import fsspec
import lightning.pytorch as pl
import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ddp_runtime as train
from ddp_runtime.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer


def load_split(data_path: str, split: str) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """One split as (features float32, target float32, feature names); data_path may be local or s3://."""
    with fsspec.open(f"{{data_path}}/schema.json", "r") as f:
        schema = json.load(f)
    with fsspec.open(f"{{data_path}}/{{split}}.csv", "r") as f:
        table = pd.read_csv(f)
    x = torch.tensor(table[schema["features"]].to_numpy(np.float32))
    y = torch.tensor(table[schema["target"]].to_numpy(np.float32))
    return x, y, schema["features"]


class PriceModel(pl.LightningModule):
    """Raw features in, price out: the scaling learned from the training split travels inside the model (as
    buffers), so the registered model takes the CSV's columns as they are."""

    def __init__(self, n_features: int, hidden: int, lr: float, stats: dict[str, list[float]]) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.register_buffer("x_mean", torch.tensor(stats["x_mean"]))
        self.register_buffer("x_std", torch.tensor(stats["x_std"]))
        self.register_buffer("y_mean", torch.tensor(stats["y_mean"]))
        self.register_buffer("y_std", torch.tensor(stats["y_std"]))
        self.net = nn.Sequential(
            nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def scaled(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.x_mean) / self.x_std).squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scaled(x) * self.y_std + self.y_mean

    def training_step(self, batch, batch_idx):
        x, y = batch
        # the loss on the scaled target: every trial's learning rate means the same whatever the prices
        loss = nn.functional.mse_loss(self.scaled(x), (y - self.y_mean) / self.y_std)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch  # the whole of this rank's validation split: one batch (val_dataloaders' batch_size)
        self.log("val_rmse", nn.functional.mse_loss(self(x), y).sqrt(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def train_fn(config: dict) -> None:
    x, y, features = load_split(config["data_path"], "train")
    val_x, val_y, _ = load_split(config["data_path"], "val")
    stats = {{
        "x_mean": x.mean(0).tolist(), "x_std": x.std(0).clamp_min(1e-6).tolist(),
        "y_mean": [float(y.mean())], "y_std": [float(y.std())],
    }}
    torch.manual_seed(config.get("seed", 0))
    model = PriceModel(len(features), config["hidden"], config["lr"], stats)
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    trainer = prepare_trainer(trainer)
    loaders = {{
        "train_dataloaders": DataLoader(TensorDataset(x, y), batch_size=config["batch_size"], shuffle=True),
        "val_dataloaders": DataLoader(TensorDataset(val_x, val_y), batch_size=len(val_x)),
    }}
    checkpoint = train.get_checkpoint()
    if checkpoint is None:
        trainer.fit(model, **loaders)
        return
    # a restarted trial, or one that PBT or HyperBand continues: from its last epoch
    with checkpoint.as_directory() as d:
        trainer.fit(model, ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME), **loaders)


def model_fn(checkpoint: train.Checkpoint) -> nn.Module:
    """The trained module. sweepflow stores it with the first rows of test.csv's features as its input example
    (MLflow infers the signature from them); return (model, x[:4]) to choose the example yourself."""
    with checkpoint.as_directory() as d:
        model = PriceModel.load_from_checkpoint(os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME), map_location="cpu")
    return model.eval()


def evaluate_fn(checkpoint: train.Checkpoint, data_path: str) -> dict[str, float]:
    model = model_fn(checkpoint)
    x, y, _ = load_split(data_path, "test")
    with torch.no_grad():
        error = model(x) - y
    rmse = float(error.pow(2).mean().sqrt())
    return {{"rmse": rmse, "mae": float(error.abs().mean()), "r2": float(1 - error.pow(2).sum() / (y - y.mean()).pow(2).sum())}}
'''


#: The template's requirement beyond sweepflow (pyproject's dependencies).
EXTRA = "lightning"
