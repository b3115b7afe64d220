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


def slow_classifier(config: dict) -> None:
    """The built-in train_image_classifier with each epoch's report held back ``config['epoch_sleep_s']``
    seconds: real checkpoints (evaluation and registration work), and trials long enough to be interrupted
    between two reports."""
    from sweepflow.tasks.training.loop import train_image_classifier

    real_report = train.report

    def held_back(metrics: dict, checkpoint: train.Checkpoint | None = None) -> None:
        time.sleep(float(config.get("epoch_sleep_s", 0.0)))
        real_report(metrics, checkpoint=checkpoint)

    train.report = held_back  # the loop calls ddp_runtime.report at each epoch's end
    try:
        train_image_classifier(config)
    finally:
        train.report = real_report
