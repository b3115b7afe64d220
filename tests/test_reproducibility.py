"""``ddp_runtime.torch.enable_reproducibility`` (Ray Train's ``enable_reproducibility``): the same seed gives the
same draws from Python, NumPy and torch, and torch refuses nondeterministic algorithms."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from ddp_runtime.torch import enable_reproducibility


@pytest.fixture
def restored_torch_settings():
    """The process's torch settings as they were (other tests run in this process)."""
    deterministic, benchmark = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    cudnn_deterministic = torch.backends.cudnn.deterministic
    yield
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, cudnn_deterministic


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.randn(3).tolist(), torch.nn.Linear(4, 2).weight.tolist()


def test_the_same_seed_gives_the_same_draws_and_deterministic_algorithms(restored_torch_settings):
    enable_reproducibility(7)
    first = _draws()
    enable_reproducibility(7)
    assert _draws() == first
    enable_reproducibility(8)
    assert _draws() != first
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.deterministic is True


def test_a_seed_that_is_not_an_integer_is_refused(restored_torch_settings):
    with pytest.raises(TypeError, match="takes an integer"):
        enable_reproducibility("7")  # type: ignore[arg-type]
