"""Gang scheduling of DDP groups on a Dask cluster.

Dask places tasks one at a time: submitting N rank tasks with ``resources={"GPU": 1}`` to a cluster with fewer
free GPUs starts part of a group, whose ranks then hold their GPUs while waiting for the rest; two such groups
deadlock. Here a group reserves all its workers in one atomic step on the scheduler (a function run in the
scheduler's event loop, so no other reservation interleaves) or none at all, and waits otherwise.

Accounting per worker: one thread slot per rank, the requested resources, and — for groups of more than one
rank — exclusivity, because torch.distributed's default process group is per process. Tasks that are not ours
count through Dask's own bookkeeping (``processing`` and ``used_resources``); ours are tracked here because
rank tasks are pinned with ``workers=[address]`` instead of being submitted with ``resources=``.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

RANK_KEY_PREFIX = "sweepflow-rank-"
_EXTENSION = "sweepflow-gang"


class InsufficientResourcesError(RuntimeError):
    """The cluster can never host the group as configured (not merely busy)."""


@dataclass
class _Reservation:
    addresses: list[str]
    resources: dict[str, float]
    exclusive: bool


@dataclass
class _GangState:
    reservations: dict[str, _Reservation] = field(default_factory=dict)

    def usage(self, address: str) -> tuple[int, dict[str, float], bool]:
        slots, resources, exclusive = 0, {}, False
        for res in self.reservations.values():
            n = res.addresses.count(address)
            if not n:
                continue
            slots += n
            exclusive = exclusive or res.exclusive
            for name, amount in res.resources.items():
                resources[name] = resources.get(name, 0.0) + n * amount
        return slots, resources, exclusive


def _state(scheduler: Any) -> _GangState:
    state = scheduler.extensions.get(_EXTENSION)
    if state is None:
        state = scheduler.extensions[_EXTENSION] = _GangState()
    return state


def _running_workers(scheduler: Any) -> list[Any]:
    return [
        ws for ws in scheduler.workers.values() if getattr(ws.status, "name", str(ws.status)) == "running"
    ]


def _capable(ws: Any, resources: dict[str, float]) -> bool:
    return ws.nthreads >= 1 and all(
        ws.resources.get(name, 0.0) >= amount for name, amount in resources.items()
    )


def reserve(
    group_id: str,
    num_ranks: int,
    resources: dict[str, float],
    dask_scheduler: Any = None,
) -> tuple[str, Any]:
    """Run on the scheduler: reserve ``num_ranks`` distinct workers for the group, all or nothing.

    Returns ``("reserved", addresses in rank order)``, ``("busy", None)`` when the cluster is busy right now,
    or ``("impossible", reason)`` when it can never fit. (Values, not exceptions: the scheduler would log
    every raised one.)
    """
    state = _state(dask_scheduler)
    if group_id in state.reservations:
        return "reserved", list(state.reservations[group_id].addresses)
    workers = _running_workers(dask_scheduler)
    capable = [ws for ws in workers if _capable(ws, resources)]
    if len(capable) < num_ranks:
        have = {ws.address: dict(ws.resources) for ws in workers}
        return "impossible", (
            f"a group of {num_ranks} ranks needs {num_ranks} distinct Dask workers with at least {resources or 'one thread'} "
            f"each, but the cluster has {len(capable)} such worker(s) (workers and their resources: {have}). "
            "Lower ScalingConfig.num_workers / resources_per_worker, or start more workers "
            '(e.g. `dask worker <scheduler> --resources "GPU=1"`, one per GPU).'
        )
    exclusive = num_ranks > 1
    free = []
    for ws in capable:
        slots, used, held_exclusive = state.usage(ws.address)
        if held_exclusive:
            continue  # a multi-rank group owns its process: the default process group is process-global
        others = sum(1 for ts in ws.processing if not str(ts.key).startswith(RANK_KEY_PREFIX))
        if ws.nthreads - slots - others < 1:
            continue
        if exclusive and slots:
            continue  # a 1-rank group is running here; a multi-rank group's process group would share its process
        if any(
            ws.resources.get(name, 0.0) - ws.used_resources.get(name, 0.0) - used.get(name, 0.0)
            < amount - 1e-9
            for name, amount in resources.items()
        ):
            continue
        free.append(ws)
    if len(free) < num_ranks:
        return "busy", None
    # Keep a group's ranks on as few hosts as possible: intra-host collectives are cheaper.
    by_host: dict[str, list[Any]] = {}
    for ws in free:
        by_host.setdefault(ws.host, []).append(ws)
    ordered = [ws for host in sorted(by_host, key=lambda h: -len(by_host[h])) for ws in by_host[host]]
    chosen = [ws.address for ws in ordered[:num_ranks]]
    state.reservations[group_id] = _Reservation(chosen, dict(resources), exclusive)
    return "reserved", chosen


def release(group_id: str, dask_scheduler: Any = None) -> None:
    """Run on the scheduler: give the group's workers back."""
    _state(dask_scheduler).reservations.pop(group_id, None)


def missing_workers(addresses: list[str], dask_scheduler: Any = None) -> list[str]:
    """Run on the scheduler: which of these workers are gone (killed, lost, retired)."""
    return [a for a in addresses if a not in dask_scheduler.workers]


def reservations(dask_scheduler: Any = None) -> dict[str, list[str]]:
    """Run on the scheduler: current reservations (for tests and debugging)."""
    return {gid: list(r.addresses) for gid, r in _state(dask_scheduler).reservations.items()}


async def kill_worker_process(dask_worker: Any = None) -> None:
    """Run on a worker (``client.run``): end its process at once; its nanny starts a fresh one.

    Used on the workers of a failed multi-rank group, whose ranks may be blocked in a collective that nothing
    else can interrupt."""
    os.kill(os.getpid(), signal.SIGKILL)


def capacity(num_ranks: int, resources: dict[str, float], dask_scheduler: Any = None) -> int:
    """Run on the scheduler: how many such groups the cluster runs at once when idle (for sizing sweeps)."""
    slots = []
    for ws in _running_workers(dask_scheduler):
        if not _capable(ws, resources):
            continue
        fit = [int(ws.resources.get(name, 0.0) // amount + 1e-9) for name, amount in resources.items()]
        slots.append(min([ws.nthreads, *fit]))
    if num_ranks > 1:  # one multi-rank group per worker process
        return sum(1 for s in slots if s >= 1) // num_ranks
    return sum(slots)
