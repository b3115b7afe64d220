"""Ray Train v2's pattern for tuning distributed training (Ray 2.43+, ``RAY_TRAIN_V2_ENABLED=1``), on sweepflow: a
Tune function trainable (the "driver") builds and fits a ``TorchTrainer`` per trial, whose 2-rank DDP group reports
to the trial through ``TuneReportCallback``, and ASHA stops the weak trials
(https://docs.ray.io/en/latest/train/user-guides/hyperparameter-optimization.html).

Changed from a Ray script: the imports (``ray.train`` -> ``ddp_runtime``, ``ray.train.torch`` -> ``ddp_runtime.torch``,
``ray.tune`` -> ``sweepflow.tune``), and the data: scikit-learn's bundled 8x8 digits (no download at run time). No
``__main__`` guard, as in Ray's docs. Each trial's driver runs on a Dask worker and lends that worker to its group
while the group trains; the group's two workers are reserved together, for its trial.

    .venv/bin/python examples/ray_train_v2_tune.py [--smoke-test]
"""

import argparse
import os
import tempfile

import torch
import torch.nn as nn
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import ddp_runtime as train  # was: import ray.train
from ddp_runtime.torch import (  # was: from ray.train.torch import ...
    TorchTrainer,
    prepare_data_loader,
    prepare_model,
)
from sweepflow import tune  # was: import ray.tune
from sweepflow.tune.integration.ray_train import (
    TuneReportCallback,  # was: from ray.tune.integration.ray_train ...
)
from sweepflow.tune.schedulers import ASHAScheduler  # was: from ray.tune.schedulers import ASHAScheduler

parser = argparse.ArgumentParser()
parser.add_argument("--smoke-test", action="store_true", help="Finish quickly for testing")
args, _ = parser.parse_known_args()
EPOCHS = 3 if args.smoke_test else 8
STORAGE = os.path.join(tempfile.gettempdir(), "ray_train_v2_tune")


# [1] The code every training worker (rank) runs for a trial.
def train_fn_per_worker(config):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    train_set, val_set = torch.utils.data.random_split(
        TensorDataset(x, y), [1437, 360], generator=torch.Generator().manual_seed(0)
    )
    train_loader = prepare_data_loader(DataLoader(train_set, batch_size=config["batch_size"], shuffle=True))
    val_loader = prepare_data_loader(DataLoader(val_set, batch_size=256))
    model = prepare_model(nn.Sequential(nn.Linear(64, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(config["epochs"]):
        if train.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)
        model.train()
        for xb, yb in train_loader:
            optimizer.zero_grad()
            loss_fn(model(xb), yb).backward()
            optimizer.step()
        model.eval()
        total_loss = correct = count = 0
        with torch.no_grad():
            for xb, yb in val_loader:
                out = model(xb)
                total_loss += loss_fn(out, yb).item() * len(yb)
                correct += (out.argmax(1) == yb).sum().item()
                count += len(yb)
        metrics = {"loss": total_loss / count, "accuracy": correct / count, "epoch": epoch}
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None  # rank 0 saves the model: every rank holds the same weights under DDP
            if train.get_context().get_world_rank() == 0:
                torch.save(model.module.state_dict() if hasattr(model, "module") else model.state_dict(),
                           os.path.join(d, "model.pt"))
                checkpoint = train.Checkpoint.from_directory(d)
            train.report(metrics, checkpoint=checkpoint)


# [2] The Tune trial: one distributed training run for its hyperparameters.
def train_driver_fn(config):
    trainer = TorchTrainer(
        train_fn_per_worker,
        train_loop_config={**config["train_loop_config"], "epochs": EPOCHS},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name=f"train-trial_id={tune.get_context().get_trial_id()}",
            storage_path=STORAGE,
            callbacks=[TuneReportCallback()],  # the group's reports are the trial's
        ),
    )
    trainer.fit()


# [3] The sweep over the drivers.
tuner = tune.Tuner(
    train_driver_fn,
    param_space={
        "train_loop_config": {
            "lr": tune.loguniform(1e-3, 3e-1),
            "batch_size": tune.choice([32, 64]),
            "hidden": tune.choice([32, 64]),
        }
    },
    tune_config=tune.TuneConfig(
        metric="loss",
        mode="min",
        num_samples=3 if args.smoke_test else 8,
        max_concurrent_trials=2,
        scheduler=ASHAScheduler(max_t=EPOCHS, grace_period=1, reduction_factor=2),
    ),
)
results = tuner.fit()

best = results.get_best_result(metric="loss", mode="min")
print(f"Number of results: {len(results)}, errors: {len(results.errors)}")
print(f"Reports per trial: {sorted(len(r.metrics_dataframe) for r in results)}")
print(f"Best train_loop_config: {best.config['train_loop_config']}")
print(f"Best loss: {best.metrics['loss']:.4f}, accuracy: {best.metrics['accuracy']:.3f}")
with open(os.path.join(best.metrics["checkpoint_path"], "model.pt"), "rb") as f:
    state = torch.load(f)
print(f"Best checkpoint ({best.metrics['checkpoint_path']}) holds {len(state)} tensors")
