"""Training functions for pipeline tests (importable on Dask workers via PYTHONPATH)."""

from __future__ import annotations

import time

import ddp_runtime as train


def scripted_quality(config: dict) -> None:
    """Reports val_loss = config['quality'] every epoch: a trial whose ASHA fate is known in advance."""
    for epoch in range(1, config["epochs"] + 1):
        time.sleep(0.05)
        train.report(
            {"epoch": epoch, "val_loss": float(config["quality"]), "val_accuracy": 1.0 / config["quality"]}
        )
