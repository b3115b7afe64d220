"""Dask worker preload: pay torch's import costs when the worker starts, not when the first group arrives.

``torch`` itself is imported before the worker accepts tasks. ``torch._dynamo`` (pulled in lazily by the first
``DistributedDataParallel(...)``, ~8 s on a small machine: it imports sympy) is imported in a background thread,
so the worker is up at once and a rank that needs it soon only waits for the rest of that import.
"""

import threading

import torch
import torch.distributed  # noqa: F401

from ddp_runtime._compat import PRELOAD_THREAD_NAME, warm_torch_imports

threading.Thread(target=warm_torch_imports, name=PRELOAD_THREAD_NAME, daemon=True).start()
del torch
