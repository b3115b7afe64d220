"""Ray Train + Ray Tune 2.x, as Ray's "Hyperparameter Tuning with Ray Tune" guide for Ray Train writes it, on
sweepflow: a ``TorchTrainer`` (a 2-rank DDP group) passed to a ``Tuner`` whose ``param_space["train_loop_config"]``
searches the training function's config, with ASHA stopping the weak trials
(https://docs.ray.io/en/latest/train/user-guides/hyperparameter-optimization.html).

Changed from Ray's: the imports (``ray.train`` -> ``ddp_runtime``, ``ray.train.torch`` -> ``ddp_runtime.torch``,
``ray.tune`` -> ``sweepflow.tune``), and the data: scikit-learn's bundled 8x8 digits (no download at run time). No
``__main__`` guard, as in Ray's docs. Each trial is a DDP group on the Dask cluster, an MLflow run and a Prefect task
run; on GPU workers, ``ScalingConfig(num_workers=2, use_gpu=True)``.

    .venv/bin/python examples/ray_tuner_torch_trainer.py [--smoke-test]
"""

import argparse
import os
import tempfile

import torch
import torch.nn as nn
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import ddp_runtime as train  # was: from ray import train
from ddp_runtime.torch import (  # was: from ray.train.torch import ...
    TorchTrainer,
    prepare_data_loader,
    prepare_model,
)
from sweepflow import tune  # was: from ray import tune
from sweepflow.tune.schedulers import ASHAScheduler  # was: from ray.tune.schedulers import ASHAScheduler

parser = argparse.ArgumentParser()
parser.add_argument("--smoke-test", action="store_true", help="Finish quickly for testing")
args, _ = parser.parse_known_args()
EPOCHS = 3 if args.smoke_test else 8


def train_func(config):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    train_set, val_set = torch.utils.data.random_split(
        TensorDataset(x, y), [1437, 360], generator=torch.Generator().manual_seed(0)
    )
    train_loader = prepare_data_loader(DataLoader(train_set, batch_size=config["batch_size"], shuffle=True))
    val_loader = prepare_data_loader(DataLoader(val_set, batch_size=256))

    model = prepare_model(
        nn.Sequential(nn.Linear(64, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 10))
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
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
            checkpoint = None  # rank 0 saves the model (every rank holds the same weights under DDP)
            if train.get_context().get_world_rank() == 0:
                unwrapped = model.module if hasattr(model, "module") else model
                torch.save(unwrapped.state_dict(), os.path.join(d, "model.pt"))
                checkpoint = train.Checkpoint.from_directory(d)
            train.report(metrics, checkpoint=checkpoint)


trainer = TorchTrainer(
    train_func,
    train_loop_config={"epochs": EPOCHS, "batch_size": 64},
    scaling_config=train.ScalingConfig(num_workers=2),
)
tuner = tune.Tuner(
    trainer,
    param_space={
        "train_loop_config": {
            "lr": tune.loguniform(1e-3, 1e-1),
            "hidden": tune.choice([32, 64, 128]),
        }
    },
    tune_config=tune.TuneConfig(
        metric="loss",
        mode="min",
        num_samples=2 if args.smoke_test else 6,
        scheduler=ASHAScheduler(max_t=EPOCHS, grace_period=1, reduction_factor=2),
    ),
    run_config=train.RunConfig(name="tuner_torch_trainer"),
)
results = tuner.fit()

best = results.get_best_result()
print(f"Number of results: {len(results)}, errors: {len(results.errors)}")
print(f"Best train_loop_config: {best.config['train_loop_config']}")
print(f"Best loss: {best.metrics['loss']:.4f}, accuracy: {best.metrics['accuracy']:.3f}")
with best.checkpoint.as_directory() as d:
    state = torch.load(os.path.join(d, "model.pt"))
print(f"Best checkpoint holds {len(state)} tensors")
