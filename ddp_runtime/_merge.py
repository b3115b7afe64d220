"""One checkpoint from every rank that reports one (Ray's distributed checkpointing): ``persist_merged``.

At a report, the ranks first agree whether any of them has a checkpoint (one all-reduce of a flag: the only cost
of a report without one). If one does:

1. rank 0 names the checkpoint (``checkpoint_dir_name`` or ``checkpoint_<index>``) and makes room for it
   (``RunStorage.begin``: a staging directory on local storage, the cleared location on remote storage);
2. every rank sends the list of its files (relative path, size) to every other (all-gather): two ranks with the
   same path and different sizes differ; same sizes are compared by SHA-256, only for those paths. Different
   contents under one path fail the report on every rank, naming both ranks and the file, before any file is
   written. One exception, Ray's getting-started example: every reporting rank lists the same file names (each
   saved the whole DDP model; BatchNorm statistics, which DDP does not synchronise, differ) and the model was
   not sharded by ``prepare_model``: the lowest rank's copy is kept, as rank 0's alone was before the merge,
   with a warning naming the ranks and the file;
3. each rank writes its own files, in parallel, straight to the checkpoint's location (a file two ranks share
   is written once, by the lower rank);
4. every rank says whether its files are stored (all-gather); only then does rank 0 check that every listed file
   is there with its size and write the commit marker, last. A rank that died or failed in 1-3 never gets that
   far: the checkpoint stays uncommitted, invisible to ``list_committed`` and so to a resume or the registry.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

from ddp_runtime import _group_end
from ddp_runtime.checkpoint import Checkpoint, RunStorage, checked_dir_name, default_dir_name, manifest

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


class CheckpointConflictError(ValueError):
    """Two ranks reported different files under the same relative path in one report's checkpoint."""


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _gather(obj: Any, world_size: int) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


def _clashes(
    files: list[dict[str, int]], local_dir: str | None, rank: int
) -> tuple[list[tuple[str, int, int]], str]:
    """The paths two ranks listed with different contents, as (path, lower rank, other rank), and how they differ
    (for the message). Collective when two ranks list a path with the same size: digests of those paths only are
    gathered, so every rank comes to the same answer."""
    owners: dict[str, list[int]] = {}
    for r, listed in enumerate(files):
        for rel in listed:
            owners.setdefault(rel, []).append(r)
    shared = sorted(rel for rel, ranks in owners.items() if len(ranks) > 1)
    if not shared:
        return [], ""
    clashes = [
        (rel, owners[rel][0], o)
        for rel in shared
        for o in owners[rel][1:]
        if files[o][rel] != files[owners[rel][0]][rel]
    ]
    if clashes:
        rel, a, b = clashes[0]
        return clashes, f"{files[a][rel]} and {files[b][rel]} bytes"
    mine = [rel for rel in shared if rel in files[rank]]
    assert local_dir is not None or not mine
    digests = _gather(
        {rel: _sha256(os.path.join(local_dir or "", *rel.split("/"))) for rel in mine}, len(files)
    )
    clashes = [
        (rel, owners[rel][0], o)
        for rel in shared
        for o in owners[rel][1:]
        if digests[o][rel] != digests[owners[rel][0]][rel]
    ]
    if clashes:
        return clashes, f"the same size, {files[clashes[0][1]][clashes[0][0]]} bytes, but other bytes"
    return [], ""


def _also(clashes: list[tuple[str, int, int]]) -> str:
    more = len({rel for rel, _, _ in clashes}) - 1
    return f" (and {more} more file(s))" if more > 0 else ""


def conflict_sentence(clashes: list[tuple[str, int, int]], how: str) -> str:
    rel, a, b = clashes[0]
    return (
        f"report(checkpoint=...): ranks {a} and {b} both wrote {rel!r}{_also(clashes)} into this report's "
        f"checkpoint, with different contents ({how}); nothing was committed: give each rank's files names of "
        "their own (e.g. f'model-rank={rank}.pt') or write that file from one rank only"
    )


def replicas_sentence(clashes: list[tuple[str, int, int]], how: str) -> str:
    rel, a, b = clashes[0]
    return (
        f"report(checkpoint=...): ranks {a} and {b} reported copies of one checkpoint (the same file names) that "
        f"differ in {rel!r}{_also(clashes)} ({how}; e.g. BatchNorm statistics DDP does not synchronise): rank "
        f"{a}'s copy is kept, as before the merge; pass the checkpoint from rank 0 only to skip the others' copies"
    )


def _begin(
    storage: RunStorage, next_index: int, dir_name: str | None, sharded: bool
) -> tuple[dict[str, Any], BaseException | None]:
    """On rank 0: the checkpoint's plan (its index, name and location, ``storage.begin``), and the error that
    kept it from starting, if one did (then also in the plan, for the other ranks)."""
    plan: dict[str, Any] = {"index": next_index, "target": None, "error": None, "replicas_ok": not sharded}
    try:
        plan["name"] = checked_dir_name(dir_name) if dir_name is not None else default_dir_name(next_index)
        plan["target"] = storage.begin(plan["name"], uuid.uuid4().hex[:8])
    except (OSError, ValueError) as exc:
        plan["error"] = f"{type(exc).__name__}: {exc}"
        return plan, exc
    return plan, None


def _agreed_plan(entries: list[dict[str, Any]], own_error: BaseException | None) -> dict[str, Any]:
    """Rank 0's plan, as every rank received it; raises on every rank if rank 0 could not start the checkpoint
    (rank 0 its own error)."""
    plan = entries[0]["plan"]
    assert plan is not None
    if plan["error"] is not None:
        if own_error is not None:
            raise own_error
        raise RuntimeError(
            f"report(checkpoint=...): rank 0 could not start this report's checkpoint: {plan['error']}"
        )
    return plan


def _refuse_conflicts(
    listed: list[dict[str, int]],
    local_dir: str | None,
    rank: int,
    *,
    replicas_ok: bool,
    storage: RunStorage,
    target: str,
) -> list[tuple[str, int, int]]:
    """Collective: raise ``CheckpointConflictError`` on every rank (rank 0 abandoning the write) if two ranks
    listed different contents under one path, unless they are copies of one unsharded checkpoint, which rank 0
    warns of. Returns the paths that differ between such copies (``_clashes``)."""
    clashes, how = _clashes(listed, local_dir, rank)
    if clashes:
        reporting = [set(listing) for listing in listed if listing]
        # Every rank saved the whole (DDP) model, as Ray's getting-started example does: not a sharded model.
        replicas = replicas_ok and all(names == reporting[0] for names in reporting)
        if not replicas:
            if rank == 0:
                storage.abandon(target)
            raise CheckpointConflictError(conflict_sentence(clashes, how))
        if rank == 0:
            log.warning("%s", replicas_sentence(clashes, how))
    return clashes


def _write_own_files(
    rank: int,
    world_size: int,
    storage: RunStorage,
    *,
    local_dir: str | None,
    files: dict[str, int],
    target: str,
    index: int,
    listed: list[dict[str, int]],
) -> None:
    """Collective: write this rank's ``files`` that no lower rank holds to ``target``, then learn whether
    every rank stored its own; if one could not, rank 0 abandons the write and every rank raises (that one its
    own error)."""
    # A file two ranks hold (byte for byte, or copies of one checkpoint) is written once, by the lowest of them.
    earlier = {rel for r in range(rank) for rel in listed[r]}
    mine = sorted(rel for rel in files if rel not in earlier)
    own_error: BaseException | None = None
    status = None
    if mine:
        assert local_dir is not None
        try:
            storage.write_files(local_dir, target, mine, what=f"rank {rank} writing checkpoint {index}")
        except Exception as exc:  # noqa: BLE001 - every rank learns of it below, then this one raises it
            own_error, status = exc, f"{type(exc).__name__}: {str(exc)[:300]}"
    statuses = _gather(status, world_size)
    failed = [(r, s) for r, s in enumerate(statuses) if s is not None]
    if failed:
        if rank == 0:
            storage.abandon(target)
        if own_error is not None:
            raise own_error
        r, s = failed[0]
        raise RuntimeError(f"checkpoint {index} is not committed: rank {r} could not store its files: {s}")


def _commit(
    storage: RunStorage,
    plan: dict[str, Any],
    metrics: dict[str, Any],
    listed: list[dict[str, int]],
    clashes: list[tuple[str, int, int]],
    started: float,
) -> Checkpoint:
    """On rank 0, once every rank's files are stored: check them and write the commit marker
    (``storage.commit``), or abandon the write."""
    union: dict[str, int] = {}
    for listing in listed:
        for rel, size in listing.items():
            union.setdefault(rel, size)  # the lowest rank's copy is the one written
    details = {
        "ranks": [r for r, listing in enumerate(listed) if listing],
        "files": len(union),
        "bytes": sum(union.values()),
        "write_s": round(time.perf_counter() - started, 6),
    }
    if clashes:
        details["kept_lowest_rank_copy_of"] = sorted({rel for rel, _, _ in clashes})
    try:
        return storage.commit(plan["target"], plan["name"], plan["index"], metrics, union, details=details)
    except BaseException:
        storage.abandon(plan["target"])
        raise


def persist_merged(
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    storage: RunStorage,
    next_index: int,
    local_dir: str | None,
    metrics: dict[str, Any],
    dir_name: str | None,
    sharded: bool = False,
) -> tuple[Checkpoint | None, int]:
    """Collective: every rank calls it at the same report, ``local_dir`` None on a rank without a checkpoint.
    Returns, on rank 0, the committed checkpoint (None when no rank had one; always None on the other ranks),
    and on every rank the index of the next checkpoint; rank 0's ``next_index``, ``dir_name`` and ``sharded``
    (whether ``prepare_model`` sharded the model: copies of one checkpoint that differ are then refused too) are
    used.

    Raises:
        CheckpointConflictError: two ranks wrote the same relative path with different bytes (on every rank).
        FileExistsError, ValueError: rank 0's ``dir_name`` is taken by a committed checkpoint, or not a name.
        RuntimeError: another rank could not store its files (that rank raises its own error).
    """
    import torch
    import torch.distributed as dist

    flag = torch.tensor([0 if local_dir is None else 1], dtype=torch.int32, device=device)
    dist.all_reduce(_group_end.kept_until_group_destroyed(flag), op=dist.ReduceOp.MAX)
    if not int(flag.item()):
        return None, next_index
    started = time.perf_counter()
    plan, own_error = _begin(storage, next_index, dir_name, sharded) if rank == 0 else (None, None)
    files = manifest(local_dir) if local_dir is not None else {}
    entries = _gather({"files": files, "plan": plan}, world_size)
    plan = _agreed_plan(entries, own_error)
    listed = [e["files"] for e in entries]
    target, index = plan["target"], plan["index"]
    clashes = _refuse_conflicts(
        listed, local_dir, rank, replicas_ok=plan["replicas_ok"], storage=storage, target=target
    )
    _write_own_files(
        rank, world_size, storage, local_dir=local_dir, files=files, target=target, index=index, listed=listed
    )
    if rank != 0:
        return None, index + 1  # rank 0 commits; it alone tells the driver
    return _commit(storage, plan, metrics, listed, clashes, started), index + 1
