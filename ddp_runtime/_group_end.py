"""The process group's end, and the tensors ddp_runtime's own collectives keep alive until then.

Works around a deadlock in torch 2.6's gloo backend (seen on 2 busy cores, a 2-rank group at its end): freeing
``ProcessGroupGloo`` joins its worker threads while holding the GIL, and a worker thread still releasing a finished
collective's tensor whose Python object was already dropped waits for the GIL to free that object. Neither returns;
the rank's task never ends. While the Python side still holds the tensor, the worker thread only drops its own
reference and needs no GIL. Written for torch 2.6-2.14. If it breaks: nothing to change here; a collective of the
user's own code can still meet the torch bug (newer torch releases free the group without the GIL). Importing this
module imports nothing.
"""

from __future__ import annotations

import collections
from typing import Any, TypeVar

T = TypeVar("T")

#: The tensors ddp_runtime's own collectives used since the process group started (the newest ones).
_COLLECTIVE_TENSORS: collections.deque[Any] = collections.deque(maxlen=64)


def kept_until_group_destroyed(tensor: T) -> T:
    """``tensor``, referenced until ``destroy_process_group``: pass it to a collective as ``dist.op(kept(t))``."""
    _COLLECTIVE_TENSORS.append(tensor)
    return tensor


def destroy_process_group() -> None:
    """``torch.distributed.destroy_process_group()``, then the tensors ``kept_until_group_destroyed`` held go."""
    import torch.distributed as dist

    try:
        dist.destroy_process_group()
    finally:
        _COLLECTIVE_TENSORS.clear()
