"""Ray Train's "Get Started with Distributed Training using PyTorch", ported to sweepflow's ddp_runtime.

Compared with the tutorial (https://docs.ray.io/en/latest/train/getting-started-pytorch.html) only two things
changed:
- the imports: `ray.train` -> `ddp_runtime`, `ray.train.torch` -> `ddp_runtime.torch`;
- the data: FashionMNIST cannot be downloaded offline, so the same pipeline runs on scikit-learn's bundled
  8x8 digits, wrapped as a torchvision-style dataset (1 channel, 10 classes, same transform shape).
Like the tutorial, it calls `fit()` at the top level, with no `if __name__ == "__main__":` guard: the local cluster's
workers never run this script again. Run it: `.venv/bin/python examples/ray_train_getting_started.py` (no cluster
needed: fit() starts one).
"""

import os
import tempfile

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torch.utils.data import DataLoader, Dataset
from torchvision.models import resnet18
from torchvision.transforms import Compose, Normalize, ToTensor

import ddp_runtime  # was: import ray.train
import ddp_runtime.torch  # was: import ray.train.torch

NUM_EPOCHS = int(os.environ.get("SWEEPFLOW_EXAMPLE_EPOCHS", "10"))
STORAGE_PATH = os.environ.get("SWEEPFLOW_EXAMPLE_STORAGE")  # None: ~/sweepflow_results


class Digits(Dataset):
    """FashionMNIST's stand-in: uint8 HxW images + int labels, transformed like torchvision datasets."""

    def __init__(self, transform=None):
        digits = load_digits()
        self.images = (digits.images * (255.0 / 16.0)).astype(np.uint8)
        self.targets = digits.target
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i]
        return (self.transform(image) if self.transform else image), int(self.targets[i])


def train_func():
    # Model, Loss, Optimizer
    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    # [1] Prepare model.
    model = ddp_runtime.torch.prepare_model(model)
    # model.to("cuda")  # This is done by `prepare_model`
    criterion = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=0.001)

    # Data
    transform = Compose([ToTensor(), Normalize((0.28604,), (0.32025,))])
    train_data = Digits(transform=transform)
    train_loader = DataLoader(train_data, batch_size=128, shuffle=True)
    # [2] Prepare dataloader.
    train_loader = ddp_runtime.torch.prepare_data_loader(train_loader)

    # Training
    for epoch in range(NUM_EPOCHS):
        if ddp_runtime.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)

        for images, labels in train_loader:
            # This is done by `prepare_data_loader`!
            # images, labels = images.to("cuda"), labels.to("cuda")
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        # [3] Report metrics and checkpoint.
        metrics = {"loss": loss.item(), "epoch": epoch}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            torch.save(model.module.state_dict(), os.path.join(temp_checkpoint_dir, "model.pt"))
            ddp_runtime.report(
                metrics,
                checkpoint=ddp_runtime.Checkpoint.from_directory(temp_checkpoint_dir),
            )
        if ddp_runtime.get_context().get_world_rank() == 0:
            print(metrics)


# [4] Configure scaling and resource requirements.
# The tutorial asks for use_gpu=True; this machine has no GPU. On a GPU cluster, set it back to True.
scaling_config = ddp_runtime.ScalingConfig(num_workers=2, use_gpu=torch.cuda.is_available())

# [5] Launch distributed training job.
trainer = ddp_runtime.torch.TorchTrainer(
    train_func,
    scaling_config=scaling_config,
    # [5a] If running in a multi-node cluster, this is where you
    # should configure the run's persistent storage that is accessible
    # across all worker nodes.
    run_config=ddp_runtime.RunConfig(storage_path=STORAGE_PATH),
)
result = trainer.fit()
print("final metrics:", result.metrics)

# [6] Load the trained model.
with result.checkpoint.as_directory() as checkpoint_dir:
    model_state_dict = torch.load(os.path.join(checkpoint_dir, "model.pt"))
    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    model.load_state_dict(model_state_dict)
print("loaded checkpoint", result.checkpoint.path)
