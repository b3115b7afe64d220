"""Naming the rank(s) that hung in a DDP group, from the Python stacks of the ranks still running.

A stack is a list of frames ``(filename, lineno, name, source, zone)`` (``_worker.rank_stacks``); ``zone`` is
``"user"`` for the user's code and ``"waiting"`` where a rank waits for its peers (a collective, DDP,
``report``). A rank whose stack could not be read maps to the reason, a string. Kept apart from the group
supervisor: these are pure functions of the stacks, and the messages they build are what a user reads.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ddp_runtime.result import RankError, RankHangError

# In a rank's traceback: it failed inside a collective.
_COLLECTIVE_FRAME = re.compile(r"[/\\]torch[/\\]distributed[/\\]")


def hang_error(
    stacks: dict[int, Any],
    addresses: list[str],
    finished: list[int],
    *,
    silent_s: float,
    hang_timeout_s: float,
) -> RankHangError:
    """TorchConfig.hang_timeout_s ran out with no report for ``silent_s``: name the rank(s) that hung, from the
    stacks of every rank still running (``finished``: the ranks that already returned)."""
    hung, waiting = _split_hung(stacks, len(addresses))
    others = []
    if waiting:
        verb = "waits" if len(waiting) == 1 else "wait"
        others.append(f"{_ranks(waiting)} {verb} for it in a collective or report()")
    if finished:
        others.append(f"{_ranks(finished)} already returned")
    return _hung_ranks_error(
        hung,
        stacks,
        addresses,
        problem=f"no report for {silent_s:.0f} s",
        others=others,
        cause=f"TorchConfig.hang_timeout_s={hang_timeout_s:g}",
        or_else="raise TorchConfig.hang_timeout_s if an epoch (set-up included) legitimately takes longer",
    )


def blame_stuck_rank(
    root: RankError, stuck_stacks: dict[int, Any], addresses: list[str], *, timeout_s: float
) -> RankHangError | None:
    """``root``, the rank that failed first, may have failed in a collective that timed out waiting for a peer
    that never came (TorchConfig.timeout_s): if ranks still running at teardown (``stuck_stacks``) were outside
    any collective, they are the cause: name them. None when ``root`` did not fail in a collective, or every
    stuck rank was itself waiting for a peer."""
    if not stuck_stacks or not _COLLECTIVE_FRAME.search(root.traceback_text):
        return None
    hung, waiting = _split_hung(stuck_stacks, len(addresses))
    hung = [rank for rank in hung if isinstance(stuck_stacks.get(rank), list)]
    if not hung or len(addresses) == 1:
        return None
    first_line = str(root).split("\n", 1)[0]
    others = [f"rank {root.rank} failed waiting for it in a collective ({first_line})"]
    if waiting:
        others.append(f"{_ranks(waiting)} {'was' if len(waiting) == 1 else 'were'} still waiting for it too")
    return _hung_ranks_error(
        hung,
        stuck_stacks,
        addresses,
        problem="its peers' collective timed out",
        others=others,
        cause=f"TorchConfig.timeout_s={timeout_s:g}",
        or_else="raise TorchConfig.timeout_s if a rank legitimately works that long between two collectives",
    )


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def _split_hung(stacks: dict[int, Any], world_size: int) -> tuple[list[int], list[int]]:
    """(hung, waiting) among the ranks with a stack entry: a rank with a frame where ranks wait for their
    peers (a collective, DDP, report) is waiting; the others hung. Every rank waiting (mismatched
    collectives), or a 1-rank group: all of them are named."""
    waiting = [
        rank
        for rank, stack in sorted(stacks.items())
        if world_size > 1 and isinstance(stack, list) and any(frame[4] == "waiting" for frame in stack)
    ]
    hung = [rank for rank in sorted(stacks) if rank not in waiting]
    return (hung, waiting) if hung else (waiting, [])


def _where(stack: Any) -> str:
    """Where a rank is: its innermost frame in the user's code (and the innermost frame, when that is deeper)."""
    if not isinstance(stack, list) or not stack:
        return f"at an unknown line: {stack or 'no Python frame'}"
    user = [frame for frame in stack if frame[4] == "user"]
    frame = user[-1] if user else stack[-1]
    text = f"at {os.path.basename(frame[0])}:{frame[1]} in {frame[2]} ({frame[3]})"
    inner = stack[-1]
    if inner is not frame:
        text += f", inside {os.path.basename(inner[0])}:{inner[1]} in {inner[2]} ({inner[3]})"
    return text


def _format_stack(rank: int, stack: Any) -> str:
    if not isinstance(stack, list):
        return f"rank {rank}: no stack ({stack})"
    lines = [f"rank {rank}'s stack (most recent call last):"]
    for filename, lineno, name, source, _zone in stack:
        lines.append(f'  File "{filename}", line {lineno}, in {name}')
        if source:
            lines.append(f"    {source}")
    return "\n".join(lines)


def _hung_ranks_error(
    hung: list[int],
    stacks: dict[int, Any],
    addresses: list[str],
    *,
    problem: str,
    others: list[str],
    cause: str,
    or_else: str,
) -> RankHangError:
    if len(hung) == 1:
        rank = hung[0]
        head = (
            f"rank {rank} (Dask worker {addresses[rank]}) hung: {problem}; it is {_where(stacks.get(rank))}"
        )
    else:
        places = "; ".join(f"rank {r} (Dask worker {addresses[r]}) is {_where(stacks.get(r))}" for r in hung)
        head = f"{_ranks(hung)} hung: {problem}; {places}"
    if others:
        head += " while " + " and ".join(others)
    summary = (
        f"{head}; the group was torn down and its Dask workers restarted ({cause}). Find why that line blocks "
        f"(every rank must make the same collectives and report() calls, in the same order), or {or_else}"
    )
    traceback_text = "\n".join(_format_stack(rank, stacks.get(rank)) for rank in hung)
    return RankHangError(hung[0], addresses[hung[0]], summary, traceback_text)
