"""
This file holds code for a Distributed Pytorch + Tune page in the docs.

Ray's ``python/ray/experimental/sgd/examples/tune_example.py`` (the ``__torch_tune_example__`` of
Ray 0.7's docs, https://docs.ray.io/en/releases-0.7.7/distributed_training.html), ported to sweepflow. Only the imports changed:
- ``from ray import tune`` -> ``from sweepflow import tune``;
- ``from ray.experimental.sgd.pytorch.pytorch_trainer import PyTorchTrainable`` -> ``sweepflow.sgd.pytorch``;
- ``tune.function(f)`` -> ``f``: sweepflow's Tune keeps plain functions in a config as they are (Ray 0.7
  needed the wrapper to tell a creator from a ``sample_from`` lambda; Ray 0.8 deprecated it);
- ``import ray; ray.init(redis_address=...)`` -> nothing: ``tune.run`` uses the Dask scheduler, MLflow server
  and Prefect API of ``DASK_SCHEDULER_ADDRESS``, ``MLFLOW_TRACKING_URI`` and ``PREFECT_API_URL`` when set (else
  the local services ``sweepflow run`` starts); ``--redis-address`` sets the Dask scheduler's address;
- the Python 2 ``__future__`` imports are gone; the unused ``--tune`` flag is dropped; ``--smoke-test`` runs
  2 samples instead of 12, and the best config is printed.
Run it: ``.venv/bin/python examples/ray_sgd_tune_example.py [--smoke-test] [--num-replicas N] [--use-gpu]``.
"""

# __torch_tune_example__
import numpy as np
import torch
import torch.nn as nn

from sweepflow import tune  # was: from ray import tune
from sweepflow.sgd.pytorch import PyTorchTrainable  # was: from ray.experimental.sgd.pytorch.pytorch_trainer


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
    return torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-4))


def data_creator(config):
    """Returns training set, validation set"""
    return LinearDataset(2, 5), LinearDataset(2, 5, size=400)


def tune_example(num_replicas=1, use_gpu=False, num_samples=12):
    config = {
        "model_creator": model_creator,  # was: tune.function(model_creator), and so for the other creators
        "data_creator": data_creator,
        "optimizer_creator": optimizer_creator,
        "loss_creator": nn.MSELoss,
        "num_replicas": num_replicas,
        "use_gpu": use_gpu,
        "batch_size": 512,
        "backend": "gloo",
    }

    analysis = tune.run(
        PyTorchTrainable,
        num_samples=num_samples,
        config=config,
        stop={"training_iteration": 2},
        verbose=1,
    )

    return analysis.get_best_config(metric="validation_loss", mode="min")


if __name__ == "__main__":
    import argparse
    import os

    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-address", type=str, help="the address of a Dask scheduler (Ray: of Redis)")
    parser.add_argument(
        "--num-replicas", "-n", type=int, default=1, help="Sets number of replicas for training."
    )
    parser.add_argument("--use-gpu", action="store_true", default=False, help="Enables GPU training")
    parser.add_argument(
        "--smoke-test", action="store_true", default=False, help="Finish quickly for testing: 2 samples"
    )

    args, _ = parser.parse_known_args()

    if args.redis_address:  # was: ray.init(redis_address=args.redis_address)
        os.environ["DASK_SCHEDULER_ADDRESS"] = args.redis_address
    best_config = tune_example(
        num_replicas=args.num_replicas, use_gpu=args.use_gpu, num_samples=2 if args.smoke_test else 12
    )
    # The creators by name (a function's repr holds its address).
    print("Best config:", {key: getattr(value, "__name__", value) for key, value in best_config.items()})
