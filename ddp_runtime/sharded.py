"""Sharded checkpoints (``torch.distributed.checkpoint``, "DCP") read back whole, without a process group.

A model sharded with FSDP (``prepare_model(model, parallel_strategy="fsdp")``) is saved with
``torch.distributed.checkpoint.save`` from every rank into that rank's checkpoint directory; ``report`` merges
the ranks' files (``__<rank>_0.distcp`` from each, ``.metadata`` from rank 0) into one checkpoint. A group
resuming from it loads it back sharded (``dcp.load`` from every rank); evaluation, a project's ``model_fn`` and
the registry need the plain, full ``state_dict`` instead: ``load_full_state_dict``.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ddp_runtime.checkpoint import Checkpoint

#: The file ``torch.distributed.checkpoint`` writes (from its coordinator rank) beside the shards.
DCP_METADATA = ".metadata"


def load_full_state_dict(
    checkpoint: Checkpoint | str, key: str | None = None, *, subdir: str = ""
) -> dict[str, Any]:
    """The full (unsharded) state dict of a distributed checkpoint, as plain tensors on the CPU, in one process:
    no process group, no GPU (``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``). It needs memory
    for the whole state.

    Args:
        checkpoint: a ``Checkpoint`` (local or remote: downloaded first) or a local directory.
        key: the entry of the saved dict to return, e.g. ``"model"`` for ``dcp.save({"model": ..., "optim":
            ...})``; None: the whole saved dict.
        subdir: the checkpoint's subdirectory the DCP files are in (``""``: its top).

    Raises:
        FileNotFoundError: there is no distributed checkpoint there (no ``.metadata``).
        KeyError: ``key`` is not an entry of the saved dict.
    """
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint.from_directory(checkpoint)
    with ckpt.as_directory() as directory, tempfile.TemporaryDirectory(prefix="ddp-runtime-full-") as tmp:
        source = os.path.join(directory, subdir) if subdir else directory
        if not os.path.exists(os.path.join(source, DCP_METADATA)):
            raise FileNotFoundError(
                f"load_full_state_dict: {ckpt.path}{'/' + subdir if subdir else ''} holds no distributed checkpoint "
                f"(no {DCP_METADATA} file, which torch.distributed.checkpoint.save writes from rank 0): save it with "
                "dcp.save(state, checkpoint_id=d) on every rank and report Checkpoint.from_directory(d) from every rank"
            )
        full = os.path.join(tmp, "full.pt")
        dcp_to_torch_save(source, full)
        state = torch.load(full, map_location="cpu", weights_only=False)
    if key is None:
        return state
    if key not in state:
        raise KeyError(f"load_full_state_dict(key={key!r}): the checkpoint's saved dict has {sorted(state)}")
    return state[key]
