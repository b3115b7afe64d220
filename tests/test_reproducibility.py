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


def _states() -> tuple:
    """The three generators' states. Python's ``random`` module is one generator for the whole process, and
    threads other tests left running (clients' retry jitter, Dask's) draw from it at any time: comparing draws
    taken a few statements apart failed when one of them drew in between (landing CI, stop 49). A state read
    right after seeding leaves that no window worth the name; NumPy's and torch's are compared by their draws
    below as well."""
    return repr(random.getstate()), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()


def _draws() -> tuple:
    return float(np.random.rand()), torch.randn(3).tolist(), torch.nn.Linear(4, 2).weight.tolist()


def test_the_same_seed_gives_the_same_draws_and_deterministic_algorithms(restored_torch_settings):
    enable_reproducibility(7)
    first_states = _states()
    first = _draws()
    enable_reproducibility(7)
    assert _states() == first_states
    assert _draws() == first
    enable_reproducibility(8)
    assert _states() != first_states
    assert _draws() != first
    random.seed(7)
    assert repr(random.getstate()) == first_states[0]  # what seed 7 gives Python's generator, and nothing else
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.deterministic is True


def test_a_seed_that_is_not_an_integer_is_refused(restored_torch_settings):
    with pytest.raises(TypeError, match="takes an integer"):
        enable_reproducibility("7")  # type: ignore[arg-type]
