"""Trial slots: how many trials train at once, and in which order they start."""

from __future__ import annotations

import threading
from collections.abc import Callable


class HeldSlot:
    """A slot a trial holds (from ``TrialSlots.acquire``) until it calls ``release``."""

    def __init__(self, slots: TrialSlots) -> None:
        self._slots = slots
        self._held = True
        self.on_release: Callable[[], None] | None = None  # told once, when it is given back (e.g. the progress line)

    def release(self) -> None:
        """Give the slot back (idempotent)."""
        self._slots._give_back(self)


class TrialSlots:
    """At most ``limit`` trials train at once, started in their order (turn 0, 1, 2, ...).

    The sweep takes a trial's slot before it submits the trial's task, so a trial has no Prefect task run and
    no MLflow run while it waits: both start when it can train. It holds the slot until its final report is
    answered (ASHA stopped it, or it reached max_t, or the time budget ran out), or until its task ends: after
    a final verdict its group only tears down, so the next trial starts meanwhile, and its group's reservation
    waits on the Dask scheduler for the workers the finishing group is about to free. Turns keep the start
    order that of the trials' numbers; a trial that will not start (it ended before the sweep was interrupted)
    forfeits its turn, so the ones after it do not wait forever.
    """

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._next_turn = 0
        self._forfeited: set[int] = set()
        self._resuming = 0  # paused trials waiting for a slot back: they go before new trials
        self._cond = threading.Condition()
        self.acquired = 0  # slots taken so far (trials started)
        self.on_release: Callable[[], None] | None = None  # e.g. wakes the sweep to start the next trial

    def acquire(self, turn: int, *, timeout: float | None = None) -> HeldSlot | None:
        """Wait (at most ``timeout`` seconds; None: for ever) for this turn and a free slot."""
        with self._cond:

            def ready() -> bool:
                return self._free > 0 and self._next_turn == turn and not self._resuming

            if not self._cond.wait_for(ready, timeout):
                return None
            self._free -= 1
            self.acquired += 1
            self._advance()
        return HeldSlot(self)

    def free_for(self, turn: int) -> bool:
        """Whether ``acquire(turn, timeout=0)`` would get a slot now (a paused trial going on may still take it
        first)."""
        with self._cond:
            return self._free > 0 and self._next_turn == turn and not self._resuming

    def reacquire(self) -> HeldSlot:
        """A slot for a trial that paused (gave its slot back to wait for others, e.g. at a HyperBand rung) and
        goes on: it waits for the next free slot, ahead of the trials that have not started."""
        with self._cond:
            self._resuming += 1
            try:
                self._cond.wait_for(lambda: self._free > 0)
                self._free -= 1
            finally:
                self._resuming -= 1
                self._cond.notify_all()
            wake = self._free > 0
        if wake and self.on_release is not None:  # a slot a new trial may take, which it skipped while we waited
            self.on_release()
        return HeldSlot(self)

    def _give_back(self, slot: HeldSlot) -> None:
        with self._cond:
            if not slot._held:
                return
            slot._held = False
            self._free += 1
            self._cond.notify_all()
        if slot.on_release is not None:
            slot.on_release()
        if self.on_release is not None:
            self.on_release()

    def forfeit(self, turn: int) -> None:
        """The trial with this turn will not start (it failed before it got a slot)."""
        with self._cond:
            self._forfeited.add(turn)
            if turn == self._next_turn:
                self._advance(taken=False)

    def _advance(self, *, taken: bool = True) -> None:
        if taken or self._next_turn in self._forfeited:
            self._forfeited.discard(self._next_turn)
            self._next_turn += 1
        while self._next_turn in self._forfeited:
            self._forfeited.discard(self._next_turn)
            self._next_turn += 1
        self._cond.notify_all()
