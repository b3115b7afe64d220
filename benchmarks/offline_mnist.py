"""An offline stand-in for ``torchvision.datasets.MNIST`` in Ray's examples, for both systems alike: scikit-learn's
bundled digits (1,797 8x8 images), upscaled to 28x28 grey PIL images, so the examples' own transforms
(``Resize``, ``ToTensor``, ``Normalize``) apply unchanged. ``ray_examples.py`` copies it beside an example that
reads MNIST and points the example's ``dset.MNIST`` here; nothing is downloaded."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch.utils.data
from PIL import Image
from sklearn.datasets import load_digits


class MNIST(torch.utils.data.Dataset):
    """``torchvision.datasets.MNIST``'s signature; ``root``, ``train`` and ``download`` are accepted and unused."""

    def __init__(
        self, root: Any = None, train: bool = True, download: bool = False, transform: Any = None, **_: Any
    ):
        digits = load_digits()
        pixels = (digits.images / 16.0 * 255).astype(np.uint8)
        self.images = [Image.fromarray(image).resize((28, 28), Image.BILINEAR) for image in pixels]
        self.targets = digits.target
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image = self.images[i]
        return (self.transform(image) if self.transform else image), int(self.targets[i])
