"""
This file holds code for a Training guide for PytorchSGD in the documentation.

Ray's ``python/ray/experimental/sgd/examples/train_example.py`` (the ``PyTorchTrainer`` example of
Ray 0.7's docs, https://docs.ray.io/en/releases-0.7.7/distributed_training.html), ported to sweepflow. Only the imports changed:
- ``from ray.experimental.sgd.pytorch.pytorch_trainer import PyTorchTrainer`` -> ``sweepflow.sgd.pytorch``;
- ``import ray; ray.init(redis_address=...)`` -> ``distributed.Client(address)`` when an address is given
  (a Dask scheduler's); without one, ``PyTorchTrainer`` starts a local Dask cluster of ``num_replicas`` workers;
- the Python 2 ``__future__`` imports are gone; ``--num-replicas`` defaults to 2 (Ray's: 1).
Run it: ``.venv/bin/python examples/ray_sgd_pytorch_trainer.py [--num-replicas N]``.
"""

# __torch_train_example__
import argparse

import numpy as np
import torch
import torch.nn as nn

from sweepflow.sgd.pytorch import PyTorchTrainer  # was: from ray.experimental.sgd.pytorch.pytorch_trainer


class LinearDataset(torch.utils.data.Dataset):
    """y = a * x + b"""

    def __init__(self, a, b, size=1000):
        x = np.random.random(size).astype(np.float32) * 10
        x = np.arange(0, 10, 10 / size, dtype=np.float32)
        self.x = torch.from_numpy(x)
        self.y = torch.from_numpy(a * x + b)

    def __getitem__(self, index):
        return self.x[index, None], self.y[index, None]

    def __len__(self):
        return len(self.x)


def model_creator(config):
    return nn.Linear(1, 1)


def optimizer_creator(model, config):
    """Returns criterion, optimizer"""
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    return criterion, optimizer


def data_creator(config):
    """Returns training set, validation set"""
    return LinearDataset(2, 5), LinearDataset(2, 5, size=400)


def train_example(num_replicas=1, use_gpu=False):
    trainer1 = PyTorchTrainer(
        model_creator,
        data_creator,
        optimizer_creator,
        num_replicas=num_replicas,
        use_gpu=use_gpu,
        batch_size=512,
        backend="gloo",
    )
    trainer1.train()
    trainer1.shutdown()
    print("success!")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--redis-address", required=False, type=str, help="the address of a Dask scheduler (Ray: of Redis)"
    )
    parser.add_argument(
        "--num-replicas", "-n", type=int, default=2, help="Sets number of replicas for training."
    )
    parser.add_argument("--use-gpu", action="store_true", default=False, help="Enables GPU training")
    parser.add_argument("--tune", action="store_true", default=False, help="Tune training")

    args, _ = parser.parse_known_args()

    from distributed import Client  # was: import ray

    if args.redis_address:  # was: ray.init(redis_address=args.redis_address)
        Client(args.redis_address)
    train_example(num_replicas=args.num_replicas, use_gpu=args.use_gpu)
