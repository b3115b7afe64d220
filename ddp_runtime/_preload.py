"""Dask worker preload: import torch once when the worker starts, not when the first group arrives."""

import torch  # noqa: F401
import torch.distributed  # noqa: F401
