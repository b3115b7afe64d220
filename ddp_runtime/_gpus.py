"""The host's GPUs, and one per worker: how a local cluster pins its workers, and which devices a rank has.

A local cluster on a host with GPUs gives each of its first workers GPUs of its own: the worker's
``CUDA_VISIBLE_DEVICES`` names only them (so a rank's device is ``cuda:0``, its own physical GPU) and it
advertises as many ``GPU`` resources as it has. Workers beyond the GPUs see none (``CUDA_VISIBLE_DEVICES=""``)
and advertise none. Ranks of one group are on distinct workers (``_gang``: a multi-rank group owns its workers'
processes), so they never share a device. No dask-cuda: the pinning is an environment variable per worker.

The GPUs are those ``nvidia-smi -L`` lists (torch is not imported), narrowed to the parent's
``CUDA_VISIBLE_DEVICES`` when it sets one (its entries in its order, up to the first that names no listed GPU:
CUDA ignores the rest). A worker pinned by index also gets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (unless the parent
set an order), so its index means the GPU nvidia-smi lists under it.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ddp_runtime._gang import InsufficientResourcesError

if TYPE_CHECKING:
    import torch

VISIBLE = "CUDA_VISIBLE_DEVICES"
ORDER = "CUDA_DEVICE_ORDER"
_LISTED = re.compile(r"^GPU (\d+):.*?(?:\(UUID: ([^)]+)\))?\s*$")


class GPUPlacementError(InsufficientResourcesError, ValueError):
    """The ranks asked for cannot each have GPUs of their own on this host: refused before any worker starts."""


def listed_gpus() -> list[tuple[str, str]]:
    """``(index, UUID)`` of every GPU ``nvidia-smi -L`` lists ([] without the NVIDIA driver)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = [_LISTED.match(line.strip()) for line in out.stdout.splitlines()]
    return [(m.group(1), m.group(2) or "") for m in found if m]


def visible_gpus() -> list[str]:
    """The GPUs this process may give its workers, each as a ``CUDA_VISIBLE_DEVICES`` entry (see the module)."""
    listed = listed_gpus()
    asked = os.environ.get(VISIBLE)
    if asked is None:
        return [index for index, _ in listed]
    chosen: list[str] = []
    for entry in (e.strip() for e in asked.split(",")):
        known = any(entry == index for index, _ in listed) or (
            entry.startswith(("GPU-", "MIG-")) and any(uuid.startswith(entry) for _, uuid in listed)
        )
        if not known:
            break  # CUDA stops at the first entry that names no device
        if entry not in chosen:
            chosen.append(entry)
    return chosen


def gpu_count() -> int:
    """GPUs this process may use (``visible_gpus``); 0 without the NVIDIA driver. torch is not imported."""
    return len(visible_gpus())


def gpus_per_worker(resources: dict[str, float] | None) -> int:
    """How many GPUs each worker is pinned to for ranks asking ``resources``: 1 for up to one GPU (a fraction
    too: the rank still has a device of its own), ``k`` for ``{"GPU": k}``."""
    asked = float((resources or {}).get("GPU", 0) or 0)
    if asked <= 1:
        return 1
    if not asked.is_integer():
        raise GPUPlacementError(
            f"resources_per_worker={{'GPU': {asked:g}}} asks a fraction of a GPU above one per rank, which no "
            f"device split gives: ask a whole number of GPUs (e.g. {{'GPU': {math.ceil(asked)}}}) or at most 1"
        )
    return int(asked)


def pins(n_workers: int, gpus: Sequence[str], per_worker: int = 1) -> list[str]:
    """Each worker's ``CUDA_VISIBLE_DEVICES``: ``per_worker`` GPUs of its own for as many workers as the GPUs
    go round, ``""`` (none) for the rest."""
    whole = len(gpus) // per_worker
    return [
        ",".join(gpus[i * per_worker : (i + 1) * per_worker]) if i < whole else "" for i in range(n_workers)
    ]


def worker_environment(pin: str) -> dict[str, str]:
    """The variables a worker with ``pin`` as its ``CUDA_VISIBLE_DEVICES`` starts with."""
    env = {VISIBLE: pin}
    if pin and VISIBLE not in os.environ and ORDER not in os.environ:
        env[ORDER] = "PCI_BUS_ID"  # indices from nvidia-smi: the same numbering
    return env


def check_room(n_workers: int, resources: dict[str, float] | None, gpus: Sequence[str]) -> int:
    """Refuse, in one sentence, ``n_workers`` workers that each need ``resources``'s GPU(s) of their own when
    this host has too few; returns the GPUs per worker."""
    per_worker = gpus_per_worker(resources)
    asked = float((resources or {}).get("GPU", 0) or 0)
    if asked and n_workers * per_worker > len(gpus):
        fits = len(gpus) // per_worker
        fix = f"lower num_workers to {fits}" if fits else "set use_gpu=False to train on CPUs"
        raise GPUPlacementError(
            f"ScalingConfig(num_workers={n_workers}) with resources_per_worker={{'GPU': {asked:g}}} needs "
            f"{n_workers * per_worker} GPU(s), {per_worker} of its own per rank (ranks of one group never share a "
            f"device), but this machine has {len(gpus)} ({VISIBLE}={os.environ.get(VISIBLE)!r}): {fix}, or pass "
            "client= to a cluster with one worker per GPU"
        )
    return per_worker


def get_devices() -> list[torch.device]:
    """The torch devices of the calling rank (Ray's ``ray.train.torch.get_devices()``): with ``use_gpu``, the
    GPUs its worker sees, ``cuda:0`` (the rank's device) first: on a pinned worker its own GPU, or its ``k`` for
    ``{"GPU": k}``; without, ``[cpu]``. Outside a rank: ``[cuda:0]`` when CUDA is there, else ``[cpu]``, as Ray."""
    import torch

    from ddp_runtime.session import get_context

    try:
        device = get_context().get_device()
    except RuntimeError:  # not in a rank
        return [torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")]
    if device.type != "cuda":
        return [device]
    others = [torch.device("cuda", i) for i in range(torch.cuda.device_count()) if i != device.index]
    return [device, *others]
