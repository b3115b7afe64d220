"""Gang scheduling of DDP groups on a Dask cluster.

Dask places tasks one at a time: submitting N rank tasks with ``resources={"GPU": 1}`` to a cluster with fewer
free GPUs starts part of a group, whose ranks then hold their GPUs while waiting for the rest; two such groups
deadlock. Here a group reserves all its workers in one atomic step on the scheduler (a function run in the
scheduler's event loop, so no other reservation interleaves) or none at all, and waits otherwise.

Accounting per worker: one thread slot per rank, the requested resources, and — for groups of more than one
rank — exclusivity, because torch.distributed's default process group is per process. Tasks that are not ours
count through Dask's own bookkeeping (``processing`` and ``used_resources``); ours are tracked here because
rank tasks are pinned with ``workers=[address]`` instead of being submitted with ``resources=``.

Turnover is event-driven on the scheduler: a reservation ends by itself the moment every rank task of its group
has finished (a scheduler plugin watches their transitions), and a group waiting for workers waits inside
``reserve`` for that, so the next group is placed without a round trip through any client.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from ddp_runtime import _compat

RANK_KEY_PREFIX = "sweepflow-rank-"
_EXTENSION = "sweepflow-gang"


class InsufficientResourcesError(RuntimeError):
    """The cluster can never host the group as configured (not merely busy)."""


@dataclass
class _Reservation:
    addresses: list[str]
    resources: dict[str, float]
    exclusive: bool
    pending_keys: set[str] = field(default_factory=set)  # rank tasks still to finish
    lent: bool = False  # its rank drives a group of its own, which may take its workers (``lend``)


@dataclass
class _GangState:
    reservations: dict[str, _Reservation] = field(default_factory=dict)
    by_key: dict[str, str] = field(default_factory=dict)  # rank task key -> group id
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set (and replaced) when capacity frees
    waiting: int = 0  # reserve calls waiting for capacity

    def notify(self) -> None:
        """Wake every ``reserve`` waiting for capacity."""
        if self.waiting:
            self.changed.set()
            self.changed = asyncio.Event()

    def drop(self, group_id: str) -> None:
        reservation = self.reservations.pop(group_id, None)
        if reservation is not None:
            for key in reservation.pending_keys:
                self.by_key.pop(key, None)
            self.notify()

    def usage(self, address: str) -> tuple[int, dict[str, float], bool]:
        slots, resources, exclusive = 0, {}, False
        for res in self.reservations.values():
            n = res.addresses.count(address)
            if not n or res.lent:
                continue
            slots += n
            exclusive = exclusive or res.exclusive
            for name, amount in res.resources.items():
                resources[name] = resources.get(name, 0.0) + n * amount
        return slots, resources, exclusive


class _TurnoverPlugin(SchedulerPlugin):
    """Ends a reservation when the last of its rank tasks has left ``processing`` — returned, raised, or given
    up (its driver cancelled it or died, or its worker died) — and wakes waiting groups when workers join or
    tasks that are not ours leave a worker. (A rank given up while its thread still runs stops by itself:
    rank 0 notices the cancellation within a second, the others then lose their collective peer.)"""

    name = _EXTENSION

    def __init__(self, state: _GangState) -> None:
        self.state = state

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if not _compat.task_left_its_worker(start, finish):
            return
        group_id = self.state.by_key.pop(key, None) if isinstance(key, str) else None
        if group_id is None:
            self.state.notify()  # another task left its worker: a thread slot may be free
            return
        reservation = self.state.reservations.get(group_id)
        if reservation is not None:
            reservation.pending_keys.discard(key)
            if not reservation.pending_keys:
                self.state.drop(group_id)

    def add_worker(self, scheduler: Any = None, worker: str | None = None) -> None:
        self.state.notify()


def _state(scheduler: Any) -> _GangState:
    def create() -> _GangState:
        state = _GangState()
        scheduler.add_plugin(_TurnoverPlugin(state), name=_EXTENSION)
        return state

    return _compat.scheduler_singleton(scheduler, _EXTENSION, create)


def _capable(ws: Any, resources: dict[str, float]) -> bool:
    return ws.nthreads >= 1 and all(
        ws.resources.get(name, 0.0) >= amount for name, amount in resources.items()
    )


async def reserve(
    group_id: str,
    num_ranks: int,
    resources: dict[str, float],
    rank_keys: list[str] | None = None,
    wait_s: float = 0.0,
    dask_scheduler: Any = None,
) -> tuple[str, Any]:
    """Run on the scheduler: reserve ``num_ranks`` distinct workers for the group, all or nothing.

    ``rank_keys`` are the keys the group's rank tasks will have: the reservation ends by itself when all of
    them have finished. While the cluster is busy, waits up to ``wait_s`` for capacity to free.

    Returns ``("reserved", addresses in rank order)``, ``("busy", None)`` when the cluster is still busy,
    or ``("impossible", reason)`` when it can never fit. (Values, not exceptions: the scheduler would log
    every raised one.)
    """
    state = _state(dask_scheduler)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        status, payload = _try_reserve(state, group_id, num_ranks, resources, rank_keys or [], dask_scheduler)
        remaining = deadline - loop.time()
        if status != "busy" or remaining <= 0:
            return status, payload
        state.waiting += 1
        try:
            await asyncio.wait_for(state.changed.wait(), remaining)
        except TimeoutError:
            return "busy", None
        finally:
            state.waiting -= 1


def _try_reserve(
    state: _GangState,
    group_id: str,
    num_ranks: int,
    resources: dict[str, float],
    rank_keys: list[str],
    dask_scheduler: Any,
) -> tuple[str, Any]:
    if group_id in state.reservations:
        return "reserved", list(state.reservations[group_id].addresses)
    workers = _compat.running_workers(dask_scheduler)
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
        others = sum(1 for key in _compat.processing_keys(ws) if not str(key).startswith(RANK_KEY_PREFIX))
        if ws.nthreads - slots - others < 1:
            continue
        if exclusive and slots:
            continue  # a 1-rank group is running here; a multi-rank group's process group would share its process
        dask_used = _compat.used_resources(ws)
        if any(
            ws.resources.get(name, 0.0) - dask_used.get(name, 0.0) - used.get(name, 0.0) < amount - 1e-9
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
    state.reservations[group_id] = _Reservation(chosen, dict(resources), exclusive, set(rank_keys))
    for key in rank_keys:
        state.by_key[key] = group_id
    return "reserved", chosen


def lend(group_id: str, dask_scheduler: Any = None) -> bool:
    """Run on the scheduler: a 1-rank group whose rank fits a ``TorchTrainer`` of its own (Ray Train v2's Tune
    pattern: the trial's function drives a DDP group) gives its worker and resources to the groups placed from
    now on, until its rank ends; its rank has seceded from the worker's threads, so it waits without holding one.
    Returns whether the group held a reservation here."""
    state = _state(dask_scheduler)
    reservation = state.reservations.get(group_id)
    if reservation is None:
        return False
    reservation.lent = True
    state.notify()
    return True


def release(group_id: str, dask_scheduler: Any = None) -> None:
    """Run on the scheduler: give the group's workers back (idempotent: usually its ranks' end already did)."""
    _state(dask_scheduler).drop(group_id)


def missing_workers(addresses: list[str], dask_scheduler: Any = None) -> list[str]:
    """Run on the scheduler: which of these workers are gone (killed, lost, retired)."""
    return [a for a in addresses if not _compat.has_worker(dask_scheduler, a)]


def reservations(dask_scheduler: Any = None) -> dict[str, list[str]]:
    """Run on the scheduler: current reservations (for tests and debugging)."""
    return {gid: list(r.addresses) for gid, r in _state(dask_scheduler).reservations.items()}


async def kill_worker_process(dask_worker: Any = None) -> None:
    """Run on a worker (``client.run``): end its process at once; its nanny starts a fresh one.

    Used on the workers of a failed multi-rank group, whose ranks may be blocked in a collective that nothing
    else can interrupt."""
    os.kill(os.getpid(), signal.SIGKILL)


def capable_workers(resources: dict[str, float], dask_scheduler: Any = None) -> list[str]:
    """Run on the scheduler: the running workers that could host a rank asking for ``resources``."""
    return [ws.address for ws in _compat.running_workers(dask_scheduler) if _capable(ws, resources)]


def capacity(num_ranks: int, resources: dict[str, float], dask_scheduler: Any = None) -> int:
    """Run on the scheduler: how many such groups the cluster runs at once when idle (for sizing sweeps)."""
    slots = []
    for ws in _compat.running_workers(dask_scheduler):
        if not _capable(ws, resources):
            continue
        fit = [int(ws.resources.get(name, 0.0) // amount + 1e-9) for name, amount in resources.items()]
        slots.append(min([ws.nthreads, *fit]))
    if num_ranks > 1:  # one multi-rank group per worker process
        return sum(1 for s in slots if s >= 1) // num_ranks
    return sum(slots)
