"""Lightning training functions the ddp_runtime.lightning tests run on Dask workers (importable via PYTHONPATH).

Written as Ray's Lightning guide writes them: a ``LightningModule``, a ``pl.Trainer`` with the Ray strategy,
environment and report callback, ``prepare_trainer``, and ``trainer.fit(ckpt_path=...)`` from
``get_checkpoint()``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import ddp_runtime as train


def _lightning(flavour: str):
    if flavour == "pytorch_lightning":
        import pytorch_lightning as pl
    else:
        import lightning.pytorch as pl
    return pl


def _module_class(pl):
    class Regression(pl.LightningModule):
        def __init__(self, lr: float) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)
            self.lr = lr

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
            self.log("train_loss", loss, on_epoch=True, on_step=False, sync_dist=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

        # Provenance, for the PBT test: the learning rate the weights this run started from were trained with.
        restored_lr = 0.0

        def on_save_checkpoint(self, checkpoint):
            checkpoint["trained_with_lr"] = self.lr

        def on_load_checkpoint(self, checkpoint):
            self.restored_lr = float(checkpoint.get("trained_with_lr", 0.0))

        def on_train_epoch_start(self):
            time.sleep(self.epoch_sleep_s)  # an epoch that takes time: a PBT population's trials train side by side
            self.log("restored_lr", self.restored_lr, sync_dist=True)
            kill = self.kill
            if kill and self.current_epoch == kill["epoch"] and self.global_rank == kill["rank"]:
                if not os.path.exists(kill["marker"]):
                    open(kill["marker"], "w").close()
                    os.kill(os.getpid(), signal.SIGKILL)  # the rank's Dask worker dies, as under the OOM killer

        kill: dict | None = None
        epoch_sleep_s = 0.0

    return Regression


def _data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1)


def train_lightning(config: dict) -> None:
    """Ray's Lightning guide's ``train_func``, with a check that DDP kept every rank's weights equal."""
    pl = _lightning(config.get("flavour", "lightning"))
    from ddp_runtime.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    torch.manual_seed(train.get_context().get_world_rank())  # different init per rank: DDP must sync them
    model = _module_class(pl)(config.get("lr", 0.05))
    model.kill = config.get("kill")
    model.epoch_sleep_s = config.get("epoch_sleep_s", 0.0)
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
    checkpoint = train.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else contextlib.nullcontext() as directory:
        trainer.fit(
            model,
            train_dataloaders=DataLoader(_data(256, 0), batch_size=32, shuffle=True),
            val_dataloaders=DataLoader(_data(64, 1), batch_size=32),
            ckpt_path=os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME) if directory else None,
        )
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if torch.distributed.is_initialized():
        gathered = [torch.zeros_like(weights) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(gathered, weights)
        if not all(torch.equal(gathered[0], w) for w in gathered):
            raise AssertionError(f"ranks hold different weights after DDP: {gathered}")
