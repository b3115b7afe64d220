"""Built-in image classifiers for sweeps, and ``build_model``, the one way trainers and evaluators make them.

A sweep trial names its model ("net", "resnet18", "small_cnn") and passes its whole hyperparameter dict;
``build_model`` keeps only the hyperparameters that model takes. That lets one search space mix model and
training hyperparameters (``lr``, ``batch_size``, ...) without every model having to accept and ignore them,
and lets a checkpoint record exactly the arguments needed to rebuild its model (see ``model_hparams``).

Every model works on any (C, H, W) input the prepared datasets produce: 8x8 digits, 28x28 MNIST-likes and
32x32 CIFAR-10. Only torch (and, for the ResNet, torchvision) is imported here: this module runs inside Dask
workers.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional PyTorch alias
from torch import nn

from sweepflow.tasks.training.hparams import model_hparams

# Below this side length two valid 5x5 convs + two 2x2 pools would shrink the feature map to nothing
# (16x16 -> 12 -> 6 -> 2 -> 1), so Net switches to padded 3x3 convs that keep the size until pooling.
_NET_MIN_SIZE_FOR_5X5 = 16


def _hw(image_size: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(image_size, int):
        return image_size, image_size
    height, width = image_size
    return int(height), int(width)


class Net(nn.Module):
    """The CNN of Ray Tune's CIFAR-10 tutorial (conv 6 -> pool -> conv 16 -> pool -> fc l1 -> fc l2 -> fc).

    The tutorial hard-codes 3x32x32 inputs (``16 * 5 * 5`` features). Here the flatten size comes from a
    dummy forward pass, and images smaller than 16 px use 3x3 convs with padding 1 (and ceil-mode pooling)
    instead of valid 5x5 convs, so the spatial dims never reach zero, e.g. on 8x8 digits.
    """

    def __init__(
        self,
        l1: int = 120,
        l2: int = 84,
        in_channels: int = 3,
        num_classes: int = 10,
        image_size: int | tuple[int, int] = 32,
    ) -> None:
        super().__init__()
        height, width = _hw(image_size)
        if min(height, width) >= _NET_MIN_SIZE_FOR_5X5:
            kernel, padding, ceil_mode = 5, 0, False  # exactly the tutorial's layers
        else:
            kernel, padding, ceil_mode = 3, 1, True
        self.conv1 = nn.Conv2d(in_channels, 6, kernel, padding=padding)
        self.pool = nn.MaxPool2d(2, 2, ceil_mode=ceil_mode)
        self.conv2 = nn.Conv2d(6, 16, kernel, padding=padding)
        with torch.no_grad():  # shape inference only: no autograd graph, no effect on the parameters
            flat = self._features(torch.zeros(1, in_channels, height, width)).shape[1]
        self.fc1 = nn.Linear(flat, l1)
        self.fc2 = nn.Linear(l1, l2)
        self.fc3 = nn.Linear(l2, num_classes)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        return torch.flatten(x, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._features(x)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def resnet18_1ch(in_channels: int = 1, num_classes: int = 10) -> nn.Module:
    """torchvision's ResNet-18 with its first conv taking ``in_channels`` (Ray Train's getting-started model).

    Only ``conv1`` changes (7x7, stride 2, as in Ray's tutorial), so grayscale inputs need no channel copies; the
    adaptive average pool at the end makes it work on 28x28 and even 8x8 images (down to 1x1 feature maps).
    """
    # Imported here, not at the top: torchvision.models pulls in torch._dynamo (seconds of import time),
    # which processes that only build "net" or "small_cnn" (or just evaluate them) need not pay.
    from torchvision.models import resnet18

    model = resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    return model


class SmallCNN(nn.Module):
    """Two conv blocks + global average pooling + a linear head: a fast CPU baseline for any image size.

    Global average pooling (instead of flattening) makes the head independent of the input size; ceil-mode
    pooling keeps a 1x1 map from vanishing.
    """

    def __init__(
        self, channels: int = 32, dropout: float = 0.1, in_channels: int = 1, num_classes: int = 10
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1, bias=False),  # bias is redundant before BatchNorm
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.Conv2d(channels, 2 * channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * channels),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(2 * channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.features(x), 1)
        return self.head(self.dropout(x))


# ------------------------------------------------------------------------------------------------ factory


#: How to build each named model: (input_shape, num_classes, **hparams) -> model. Its hyperparameters and their
#: checks are ``hparams.MODEL_HPARAMS``'s.
_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "net": lambda shape, num_classes, **hp: Net(
        in_channels=shape[0], num_classes=num_classes, image_size=(shape[1], shape[2]), **hp
    ),
    "resnet18": lambda shape, num_classes: resnet18_1ch(in_channels=shape[0], num_classes=num_classes),
    "small_cnn": lambda shape, num_classes, **hp: SmallCNN(in_channels=shape[0], num_classes=num_classes, **hp),
}


def build_model(
    name: str, *, input_shape: tuple[int, int, int], num_classes: int, hparams: Mapping[str, Any]
) -> nn.Module:
    """Build model ``name`` ("net", "resnet18", "small_cnn") for (C, H, W) inputs and ``num_classes``.

    ``hparams`` may hold any trial hyperparameters: only those the model takes are used (``model_hparams``).
    """
    checked = model_hparams(name, hparams)  # an unknown name fails here, naming the models there are
    shape = tuple(int(v) for v in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(
            f"input_shape must be (channels, height, width) with positive sizes, got {tuple(input_shape)!r}; "
            "pass the prepared dataset's meta['input_shape']"
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 2:
        raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
    return _BUILDERS[name](shape, int(num_classes), **checked)
