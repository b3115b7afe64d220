"""Ray Tune 2.x's function API, as Ray's "Getting Started with Ray Tune" writes it, on sweepflow: a function
trainable that reports with ``tune.report(metrics, checkpoint=...)`` and resumes from ``tune.get_checkpoint()``,
searched by a ``Tuner`` with ``TuneConfig`` (ASHA early stopping) and ``RunConfig`` (a stop criterion), then the
best result read back (https://docs.ray.io/en/latest/tune/getting-started.html).

Changed from Ray's: the imports (``ray.tune`` -> ``sweepflow.tune``), and the data: scikit-learn's bundled 8x8
digits instead of downloading MNIST (no download at run time). Like Ray's, ``fit()`` runs at the top level with no
``if __name__ == "__main__":`` guard. Each trial is an MLflow run and a Prefect task run.

    .venv/bin/python examples/ray_tune_function_trainable.py [--smoke-test]
"""

import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

from sweepflow import tune  # was: from ray import tune
from sweepflow.tune.schedulers import ASHAScheduler  # was: from ray.tune.schedulers import ASHAScheduler

parser = argparse.ArgumentParser()
parser.add_argument("--smoke-test", action="store_true", help="Finish quickly for testing")
args, _ = parser.parse_known_args()
EPOCHS = 3 if args.smoke_test else 10


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 3, kernel_size=3)
        self.fc = nn.Linear(3 * 3 * 3, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        return F.log_softmax(self.fc(x.flatten(1)), dim=1)


def get_data_loaders(batch_size=64):
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    data = torch.utils.data.TensorDataset(images, labels)
    train, test = torch.utils.data.random_split(data, [1437, 360], generator=torch.Generator().manual_seed(0))
    return (
        torch.utils.data.DataLoader(train, batch_size=batch_size, shuffle=True),
        torch.utils.data.DataLoader(test, batch_size=256),
    )


def train_func(model, optimizer, train_loader):
    model.train()
    for data, target in train_loader:
        optimizer.zero_grad()
        F.nll_loss(model(data), target).backward()
        optimizer.step()


def test_func(model, data_loader):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for data, target in data_loader:
            correct += (model(data).argmax(1) == target).sum().item()
            total += target.size(0)
    return correct / total


def train_mnist(config):
    train_loader, test_loader = get_data_loaders()
    model = ConvNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"])
    start = 0
    checkpoint = tune.get_checkpoint()  # set when the trial is restarted or resumed
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "checkpoint.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    for epoch in range(start, EPOCHS):
        train_func(model, optimizer, train_loader)
        acc = test_func(model, test_loader)
        with tempfile.TemporaryDirectory() as d:
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                os.path.join(d, "checkpoint.pt"),
            )
            tune.report({"mean_accuracy": acc}, checkpoint=tune.Checkpoint.from_directory(d))


search_space = {
    "lr": tune.loguniform(0.03, 0.3),
    "momentum": tune.uniform(0.5, 0.9),
}
tuner = tune.Tuner(
    train_mnist,
    param_space=search_space,
    tune_config=tune.TuneConfig(
        metric="mean_accuracy",
        mode="max",
        num_samples=2 if args.smoke_test else 8,
        scheduler=ASHAScheduler(max_t=EPOCHS, grace_period=1),
    ),
    run_config=tune.RunConfig(name="tune_function_trainable", stop={"training_iteration": EPOCHS}),
)
results = tuner.fit()

best = results.get_best_result()
print(f"Number of results: {len(results)}, errors: {len(results.errors)}")
print(f"Best config: {best.config}")
print(f"Best mean_accuracy: {best.metrics['mean_accuracy']:.3f}")
with best.checkpoint.as_directory() as d:
    print(f"Best checkpoint's epoch: {torch.load(os.path.join(d, 'checkpoint.pt'))['epoch']}")
